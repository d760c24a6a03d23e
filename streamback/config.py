"""Configuration: loading and validating against `config/schema/config.schema.yaml`.

The schema is the one statement of every key, type, range and default. The Snakefile, the CLI
and the tests all call `validate_config` here (one line per bad key, with its path and what is
allowed), which applies the schema with jsonschema alone (so `streamback train` and `bench` run
where Snakemake is not installed, e.g. a bare GPU node) and fills the defaults exactly as
`snakemake.utils.validate` would (tested). `read_config_file` names the file, line and column of
a YAML error. What no single key can say (a run's shape, batch and schedule fit together) is
`streamback.runs.check_runs`.
"""

from __future__ import annotations

import argparse
import copy
import difflib
import functools
import json
from pathlib import Path

import yaml

from streamback.errors import StreambackError

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = ROOT / "config" / "schema" / "config.schema.yaml"
DEFAULT_CONFIG = ROOT / "config" / "config.yaml"
# libyaml's safe loader where PyYAML has it (the same documents, a tenth of the time: 0.01 s for the schema
# against 0.1 s, paid by every job), else PyYAML's own
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@functools.cache
def _default_filling_validator():
    """The schema's validator, extended to fill in `default`s (jsonschema's own recipe, which
    snakemake.utils.validate also uses; defaults are deep-copied, never shared). Built once per
    process: it holds no state of the configs it checks."""
    from jsonschema import validators

    schema = yaml.load(SCHEMA.read_text(), Loader=SAFE_LOADER)
    base = validators.validator_for(schema)
    check_properties = base.VALIDATORS["properties"]

    def properties(validator, props, instance, subschema):
        if validator.is_type(instance, "object"):
            for name, sub in props.items():
                if "default" in sub and name not in instance:
                    instance[name] = copy.deepcopy(sub["default"])
        yield from check_properties(validator, props, instance, subschema)

    return validators.extend(base, {"properties": properties})(schema)


def validate_config(config: dict) -> dict:
    """Validate `config` (a copy is filled with the schema's defaults and returned).

    Uses jsonschema directly, so the CLI needs no Snakemake (a GPU node may have torch and
    little else); tests/unit/test_config.py checks that it fills the shipped configs exactly as
    `snakemake.utils.validate` does.
    """
    if not SCHEMA.exists():
        raise StreambackError(f"schema {SCHEMA} not found: install streamback from its repository (pip install -e .)")
    config = copy.deepcopy(config)
    errors = sorted(_default_filling_validator().iter_errors(config), key=lambda e: list(map(str, e.absolute_path)))
    if errors:
        lines = [line for e in errors for line in _error_lines(e)]
        raise StreambackError("invalid configuration:\n  " + "\n  ".join(lines))
    return config


def _error_lines(error) -> list[str]:
    """One line per problem, naming the key: an unknown key with the closest allowed name and the
    keys its section takes (jsonschema says only that it "was unexpected")."""
    where = ".".join(map(str, error.absolute_path))
    if (
        error.validator == "additionalProperties"
        and error.validator_value is False
        and isinstance(error.instance, dict)
    ):
        allowed = list(error.schema.get("properties", {}))
        lines = []
        for key in (k for k in error.instance if k not in allowed):
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            lines.append(
                f"{where + '.' if where else ''}{key}: unknown key{hint}; {where or 'the config'} takes "
                f"{', '.join(allowed)}"
            )
        return lines
    return [f"{where or '(top level)'}: {error.message}"]


def read_config_file(path: str | Path) -> dict:
    """A YAML config file as a dict (not validated); StreambackError naming the file, and for
    invalid YAML the line and column (Snakemake's own message names neither)."""
    path = Path(path)
    try:
        config = yaml.load(path.read_text(), Loader=SAFE_LOADER)
    except FileNotFoundError:
        raise StreambackError(f"config file {path} does not exist") from None
    except OSError as err:
        raise StreambackError(f"config file {path} cannot be read: {err.strerror or err}") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f", line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        what = ": ".join(
            str(part) for part in (getattr(err, "context", None), getattr(err, "problem", None)) if part
        ) or str(err)
        raise StreambackError(f"config file {path}{where} is not valid YAML: {what}") from None
    if not isinstance(config, dict):
        raise StreambackError(f"config file {path} must hold a mapping of sections, got {type(config).__name__}")
    return config


def load_config(path: str | Path = DEFAULT_CONFIG) -> dict:
    """Read a YAML config file and validate it."""
    return validate_config(read_config_file(path))


def add_config_arguments(parser: argparse.ArgumentParser, section: str) -> None:
    """`--config FILE` (a whole config, the section is taken from it) or `--params JSON`, and
    `--execution JSON` over either."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--config",
        type=Path,
        default=None,
        help=f"config file; its '{section}' section is used (default: {DEFAULT_CONFIG.relative_to(ROOT)})",
    )
    group.add_argument(
        "--params",
        default=None,
        help=f"the '{section}' section as a JSON object (what the Snakemake rules pass: the settings the job reads)",
    )
    parser.add_argument(
        "--execution",
        default=None,
        metavar="JSON",
        help=f"keys of the '{section}' section that say how the job runs, merged over the section (the rules pass them "
        "apart, so that changing them reruns nothing; streamback/jobs.py)",
    )


def section_from_args(args: argparse.Namespace, section: str) -> dict:
    """The validated, default-filled `section` of the config named by the CLI arguments."""
    if args.params is not None:
        config = {section: _json_object(args.params, "--params")}
    else:
        config = read_config_file(args.config or DEFAULT_CONFIG)
    if args.execution is not None:
        config[section] = merge_config(config.get(section, {}), _json_object(args.execution, "--execution"))
    return validate_config(config)[section]


def _json_object(text: str, flag: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise StreambackError(f"{flag} is not valid JSON: {err}") from None
    if not isinstance(value, dict):
        raise StreambackError(f"{flag} must be a JSON object, got {type(value).__name__}")
    return value


def section_from_json(text: str, section: str, flag: str = "--params") -> dict:
    """A config section given as JSON on the command line (`flag` names it in errors), validated."""
    return validate_config({section: _json_object(text, flag)})[section]


def merge_config(base: dict, override: dict) -> dict:
    """`override` merged into a copy of `base` key by key, nested mappings recursively: what
    `snakemake --configfile FILE` does with FILE over config/config.yaml."""
    merged = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge_config(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def public_models(analysis: dict) -> dict[str, str]:
    """`analysis.public_models` less the names set to null: a config merged over another (as
    config/paper.yaml is over config/config.yaml) drops a model of the base that way, since a
    merge never removes a key."""
    return {name: directory for name, directory in analysis["public_models"].items() if directory is not None}
