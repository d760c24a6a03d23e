"""The config schema: both shipped configs validate; bad ones fail naming the key."""

import copy

import pytest
import yaml

from streamback.config import DEFAULT_CONFIG, ROOT, SCHEMA, load_config, validate_config
from streamback.errors import StreambackError


@pytest.mark.parametrize("name", ["config.yaml", "paper.yaml", "depth.yaml"])
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


# the run checks' cases are written for this batch and schedule: 60 steps of 16 x 128 tokens
SIXTY_STEPS = {
    "train": {
        "tokens": 60 * 16 * 128,
        "batch_size": 16,
        "micro_batch_size": 16,
        "schedule": {"warmup_steps": 10, "decay_steps": 15},
    }
}


@pytest.mark.parametrize(
    "mutate, words",
    [
        (
            lambda c: c.update(nonsense=1),
            ["nonsense: unknown key; the config takes drift, data, train, model, analysis, eval"],
        ),
        (
            lambda c: c["drift"].update(stepz=10),
            ["drift.stepz: unknown key (did you mean 'steps'?); drift takes coords, start, steps,"],
        ),
        (
            lambda c: c["train"].update(optimiser={"lr": 2e-3}),
            ["train.optimiser: unknown key (did you mean 'optimizer'?)"],
        ),
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
    with pytest.raises(
        StreambackError, match=rf"config file {bad}, line 2, column 1 is not valid YAML: while parsing a flow sequence"
    ):
        load_config(bad)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("42\n")
    with pytest.raises(StreambackError, match="mapping"):
        load_config(scalar)


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


# ---- the cross-key check of the runs (streamback.runs.check_runs) ---------------------------------


@pytest.mark.parametrize("name", ["config.yaml", "paper.yaml"])
def test_shipped_runs_can_be_trained(name):
    from streamback.runs import check_runs

    config = load_config(ROOT / "config" / name)
    check_runs(config["train"], config["model"], config["data"])


@pytest.mark.parametrize(
    "change, words",
    [
        (
            {"model": {"shapes": {"tiny-medium": {"n_layers": 2, "dim": 96, "n_heads": 4, "n_kv_heads": 3}}}},
            "model.shapes.tiny-medium: n_heads (4) must be a multiple of n_kv_heads (3)",
        ),
        (
            {"model": {"shapes": {"tiny-medium": {"n_layers": 2, "dim": 6, "n_heads": 4, "n_kv_heads": 1}}}},
            "model.shapes.tiny-medium: head_dim = dim // n_heads = 6 // 4 = 1 is too small: RoPE rotates pairs, so it "
            "must be at least 2",
        ),
        (
            {"model": {"shapes": {"tiny-medium": {"n_layers": 2, "dim": 60, "n_heads": 4, "n_kv_heads": 1}}}},
            "head_dim = dim // n_heads = 60 // 4 = 15 is odd",
        ),
        (
            {"train": {"runs": {"shapes": ["tiny-medium", "huge"]}}},
            "train.runs.shapes: 'huge' is not a shape of model.shapes",
        ),
        (
            {"train": {"seq_len": 4096, "tokens": 60 * 16 * 4096}},
            "train.seq_len (4096) exceeds model.max_seq_len (2048)",
        ),
        (
            {"train": {"micro_batch_size": 3}},
            "train.batch_size (16) must be a multiple of micro_batch_size (3) x processes (1) = 3",
        ),
        (
            {"train": {"per_run": {"tiny-medium-baseline": {"micro_batch_size": 5}}}},
            "micro_batch_size (5) x processes (1) = 5; it is not for tiny-medium-baseline",
        ),
        ({"train": {"resources": {"gpus": 3}}}, "micro_batch_size (16) x processes (3) = 48"),
        ({"train": {"resources": {"processes": 2, "nodes": 2}}}, "micro_batch_size (16) x processes (4) = 64"),
        (
            {"train": {"resources": {"gpus": 1, "processes": 2}}},
            "train.resources.processes is for CPU runs (gpus = 0); a GPU run starts one process per GPU, so leave "
            "processes at 1 for tiny-skinny-tall-baseline",
        ),
        (
            {"train": {"schedule": {"warmup_steps": 50, "decay_steps": 11}}},
            "warmup_steps (50) + decay_steps (11) exceed the run's 60 steps",
        ),
        ({"train": {"tokens": 100}}, "the run has 0 steps"),
        (
            {"data": {"train_tokens": 100_000}},
            (
                "takes 60 steps x 16 windows of 129 tokens = 960 windows, but data.train_tokens holds "
                "100,000 tokens = 781 windows: the run would read its data 1.23 times"
            ),
        ),
        ({"data": {"val_tokens": 100}}, "data.val_tokens (100) holds fewer than one validation sequence"),
        (
            {"train": {"per_run": {"nope": {"compile": True}}}},
            "train.per_run names runs that are not in the matrix: nope",
        ),
    ],
)
def test_runs_that_cannot_be_trained_are_named(change, words):
    """Each problem of config.yaml's runs alone; `check_runs` names it (one line each)."""
    from streamback.config import merge_config
    from streamback.runs import check_runs

    config = validate_config(merge_config(merge_config(_base(), SIXTY_STEPS), change))
    with pytest.raises(StreambackError) as err:
        check_runs(config["train"], config["model"], config["data"])
    assert words in str(err.value) and str(err.value).startswith("the runs cannot be trained as configured:\n  ")
    assert str(err.value).count("\n") == 1  # this problem and no other


def test_repeating_data_is_a_choice():
    from streamback.config import merge_config
    from streamback.runs import check_runs, data_passes

    config = validate_config(
        merge_config(
            merge_config(_base(), SIXTY_STEPS), {"data": {"train_tokens": 100_000}, "train": {"repeat_data": True}}
        )
    )
    check_runs(config["train"], config["model"], config["data"])
    assert data_passes(config["train"], 100_000) == 60 * 16 / ((100_000 - 1) // 128)
    assert data_passes(config["train"], 1_000_000) < 1
