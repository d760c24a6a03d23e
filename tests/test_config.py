"""The config schema: both shipped configs validate; bad ones fail naming the key."""

import copy

import pytest
import yaml

from streamback.config import DEFAULT_CONFIG, ROOT, SCHEMA, load_config, validate_config
from streamback.errors import StreambackError


@pytest.mark.parametrize("name", ["config.yaml", "paper.yaml"])
def test_shipped_configs_validate(name):
    config = load_config(ROOT / "config" / name)
    assert config["drift"]["coords"] == 4096


def test_defaults_come_from_the_schema():
    config = validate_config({"drift": {"steps": 7}})
    assert config["drift"]["steps"] == 7
    assert config["drift"]["start"] == 600.0
    assert [s["mu"] for s in config["drift"]["settings"]] == [0.2, 0.2, 0.5]


def _base():
    return yaml.safe_load(DEFAULT_CONFIG.read_text())


@pytest.mark.parametrize(
    "mutate, words",
    [
        (lambda c: c.update(nonsense=1), ["nonsense", "unexpected"]),
        (lambda c: c["drift"].update(stepz=10), ["stepz", "unexpected"]),
        (lambda c: c["drift"].update(steps="many"), ["steps", "'many' is not of type 'integer'"]),
        (lambda c: c["drift"].update(coords=0), ["coords", "minimum"]),
        (lambda c: c["drift"].update(paths=["bf17"]), ["paths", "bf17"]),
        (lambda c: c["drift"]["settings"].append({"mu": 0.1}), ["settings", "sigma"]),
    ],
)
def test_bad_config_names_the_key(mutate, words):
    config = _base()
    mutate(config)
    with pytest.raises(StreambackError) as err:
        validate_config(config)
    for word in words:
        assert word in str(err.value)


def test_validation_does_not_touch_the_input():
    config = {"drift": {"steps": 3}}
    before = copy.deepcopy(config)
    validate_config(config)
    assert config == before


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(StreambackError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("drift: [unclosed\n")
    with pytest.raises(StreambackError, match="not valid YAML"):
        load_config(bad)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("42\n")
    with pytest.raises(StreambackError, match="mapping"):
        load_config(scalar)


@pytest.mark.parametrize("name", ["config.yaml", "paper.yaml"])
def test_same_filled_config_as_snakemake_validate(name):
    """The package's validator (jsonschema) and the Snakefile's (Snakemake's) agree on defaults."""
    from snakemake.utils import validate

    raw = yaml.safe_load((ROOT / "config" / name).read_text())
    by_snakemake = copy.deepcopy(raw)
    validate(by_snakemake, str(SCHEMA))
    assert validate_config(raw) == by_snakemake


def test_every_error_is_listed_with_its_key_path():
    config = _base()
    config["drift"].update(steps=0, coords="x")
    with pytest.raises(StreambackError) as err:
        validate_config(config)
    assert "drift.steps: 0 is less than the minimum" in str(err.value)
    assert "drift.coords: 'x' is not of type 'integer'" in str(err.value)


def test_schema_enums_are_the_code_s_names():
    """The schema lists stream formats and drift paths for validation; the code defines them.
    The two must name the same things (an extra stream run is every stream but the default fp32)."""
    from streamback.drift.simulate import PATHS
    from streamback.model.formats import STREAM_LABELS

    defs = yaml.safe_load(SCHEMA.read_text())["$defs"]
    streams = defs["train"]["properties"]["runs"]["properties"]["streams"]["items"]["enum"]
    assert sorted(streams) == sorted(set(STREAM_LABELS) - {"fp32"})
    assert defs["drift"]["properties"]["paths"]["items"]["enum"] == list(PATHS)
