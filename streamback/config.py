"""Configuration: loading and validating against `config/schema/config.schema.yaml`.

The Snakefile validates with `snakemake.utils.validate`; the CLI and the tests call
`load_config`/`validate_config` here, which use the same function and the same schema, so a
bad key is reported identically wherever it is caught. Defaults live in the schema.
"""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path

import yaml

from streamback.errors import StreambackError

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = ROOT / "config" / "schema" / "config.schema.yaml"
DEFAULT_CONFIG = ROOT / "config" / "config.yaml"


def validate_config(config: dict) -> dict:
    """Validate `config` (a copy is filled with the schema's defaults and returned)."""
    from snakemake.exceptions import WorkflowError
    from snakemake.utils import validate

    if not SCHEMA.exists():
        raise StreambackError(f"schema {SCHEMA} not found: install streamback from its repository (pip install -e .)")
    config = copy.deepcopy(config)
    try:
        validate(config, str(SCHEMA))
    except WorkflowError as err:
        raise StreambackError(f"invalid configuration: {err}") from None
    return config


def load_config(path: str | Path = DEFAULT_CONFIG) -> dict:
    """Read a YAML config file and validate it."""
    path = Path(path)
    try:
        config = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise StreambackError(f"config file {path} does not exist") from None
    except yaml.YAMLError as err:
        raise StreambackError(f"config file {path} is not valid YAML: {err}") from None
    if not isinstance(config, dict):
        raise StreambackError(f"config file {path} must hold a mapping of sections, got {type(config).__name__}")
    return validate_config(config)


def add_config_arguments(parser: argparse.ArgumentParser, section: str) -> None:
    """`--config FILE` (a whole config, the section is taken from it) or `--params JSON`."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--config", type=Path, default=None, help=f"config file; its '{section}' section is used (default: {DEFAULT_CONFIG.relative_to(ROOT)})")
    group.add_argument("--params", default=None, help=f"the '{section}' section as a JSON object (what the Snakemake rules pass)")


def section_from_args(args: argparse.Namespace, section: str) -> dict:
    """The validated, default-filled `section` of the config named by the CLI arguments."""
    if args.params is not None:
        return section_from_json(args.params, section)
    return load_config(args.config or DEFAULT_CONFIG)[section]


def section_from_json(text: str, section: str, flag: str = "--params") -> dict:
    """A config section given as JSON on the command line (`flag` names it in errors), validated."""
    try:
        params = json.loads(text)
    except json.JSONDecodeError as err:
        raise StreambackError(f"{flag} is not valid JSON: {err}") from None
    return validate_config({section: params})[section]
