"""Training seeds in the run matrix (train.runs.seeds): names, pairing within a seed, what a seed
varies, what the rules are given, and a micro matrix trained with two seeds."""

import numpy as np
import pytest
import torch

from streamback import jobs
from streamback.config import merge_config, validate_config
from streamback.errors import StreambackError
from streamback.runs import comparison_name, comparisons, run_matrix
from streamback.train.batches import num_windows, train_windows
from streamback.train.processes import Distributed

from helpers.train import MODEL, TRAIN

pytestmark = pytest.mark.usefixtures("one_thread")


def matrix(**runs):
    return run_matrix(validate_config({"model": MODEL, "train": {**TRAIN, "runs": {**TRAIN["runs"], **runs}}})["train"])


def test_one_seed_keeps_the_names_and_more_seeds_add_a_suffix_to_the_others():
    assert (
        list(matrix())
        == list(matrix(seeds=[TRAIN["seed"]]))
        == ["micro-baseline", "micro-streamback", "micro-streamback-bf16_sr"]
    )
    runs = matrix(seeds=[TRAIN["seed"], 1, 2], stream_seeds=[1])
    assert list(runs) == [
        "micro-baseline",
        "micro-baseline-seed1",
        "micro-baseline-seed2",
        "micro-streamback",
        "micro-streamback-seed1",
        "micro-streamback-seed2",
        "micro-streamback-bf16_sr-seed1",
    ]
    assert [(s.seed, s.init_seed, s.data_seed) for s in runs.values()] == [(7, 7, 7), (1, 1, 1), (2, 2, 2)] * 2 + [
        (1, 1, 1)
    ]
    assert {s.arm for s in runs.values()} == {"micro-baseline", "micro-streamback", "micro-streamback-bf16_sr"}
    # each comparison pairs a run with the baseline of its own seed
    assert comparisons(runs) == [
        ("micro", "micro-baseline", "micro-streamback"),
        ("micro", "micro-baseline-seed1", "micro-streamback-seed1"),
        ("micro", "micro-baseline-seed2", "micro-streamback-seed2"),
        ("micro", "micro-baseline-seed1", "micro-streamback-bf16_sr-seed1"),
    ]
    assert {comparison_name(runs[b]) for _, _, b in comparisons(runs)} == {"streamback", "streamback-bf16_sr"}
    # PolyPythias' two kinds of seed: one varies, the other stays train.seed's
    assert [(s.init_seed, s.data_seed) for s in matrix(seeds=[7, 3], seeds_vary="init").values()][:2] == [
        (7, 7),
        (3, 7),
    ]
    assert [(s.init_seed, s.data_seed) for s in matrix(seeds=[7, 3], seeds_vary="data").values()][:2] == [
        (7, 7),
        (7, 3),
    ]
    with pytest.raises(StreambackError, match="train.runs.seeds"):
        validate_config({"train": {"runs": {"seeds": [1, 1]}}})


def test_adding_seeds_leaves_every_trained_run_s_params_as_they_were():
    """A run of train.seed is given the same settings with or without more seeds (so Snakemake
    reruns none of them); a run of another seed is given that seed, and its matrix names it."""
    base = validate_config({"model": MODEL, "train": TRAIN})
    seeded = merge_config(base, {"train": {"runs": {"seeds": [TRAIN["seed"], 1]}}})
    for run in run_matrix(base["train"]):
        assert jobs.train(base, run) == jobs.train(seeded, run), run
    given = jobs.train(seeded, "micro-streamback-seed1")["train"]
    assert given["runs"]["seeds"] == [1] and given["seed"] == TRAIN["seed"]
    assert list(run_matrix(validate_config({"train": given})["train"])) == ["micro-streamback-seed1"]
    vary = merge_config(base, {"train": {"runs": {"seeds": [TRAIN["seed"], 1], "seeds_vary": "init"}}})
    assert jobs.train(vary, "micro-baseline") == jobs.train(base, "micro-baseline")
    assert jobs.train(vary, "micro-baseline-seed1")["train"]["runs"]["seeds_vary"] == "init"


def trainer_of(tokens, tmp_path, run, **runs):
    from streamback.train.trainer import Trainer

    cfg = validate_config({"model": MODEL, "train": {**TRAIN, "runs": {**TRAIN["runs"], **runs}}})
    spec = run_matrix(cfg["train"])[run]
    return Trainer(
        spec,
        cfg["train"],
        cfg["model"],
        tokens,
        tmp_path / "out" / run,
        tmp_path / "ckpt" / run,
        Distributed(0, 1, torch.device("cpu")),
    )


def test_within_a_seed_both_blocks_start_alike_and_see_the_same_batches(tokens, tmp_path):
    seeds = {"seeds": [TRAIN["seed"], 1, 2], "stream_seeds": [TRAIN["seed"], 1, 2]}
    trainers = {
        run: trainer_of(tokens, tmp_path, run, **seeds)
        for run in (
            "micro-baseline",
            "micro-streamback",
            "micro-streamback-bf16_sr",
            "micro-baseline-seed1",
            "micro-streamback-seed1",
            "micro-baseline-seed2",
        )
    }

    def weights(run):
        return {k: v.detach().clone() for k, v in trainers[run].model.state_dict().items()}

    def batches(run, steps=5):
        t = trainers[run]
        return np.stack(
            [
                train_windows(t.seed, step, t.batch_size, num_windows(t.train_data.num_tokens, t.seq_len))
                for step in range(steps)
            ]
        )

    for a, b in (
        ("micro-baseline", "micro-streamback"),
        ("micro-baseline", "micro-streamback-bf16_sr"),
        ("micro-baseline-seed1", "micro-streamback-seed1"),
    ):
        wa, wb = weights(a), weights(b)
        assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa), (a, b)
        assert np.array_equal(batches(a), batches(b)), (a, b)
    for a, b in (("micro-baseline", "micro-baseline-seed1"), ("micro-baseline-seed1", "micro-baseline-seed2")):
        wa, wb = weights(a), weights(b)
        assert not any(torch.equal(wa[k], wb[k]) for k in wa if "norm" not in k), (
            a,
            b,
        )  # norm gains start at 1 in every seed
        assert not np.array_equal(batches(a), batches(b)), (a, b)
    assert (
        trainers["micro-baseline"].identity == trainer_of(tokens, tmp_path, "micro-baseline").identity
    )  # the same recipe directory
    assert trainers["micro-baseline-seed1"].recipe_dir != trainers["micro-baseline"].recipe_dir


def test_seed_variance_is_each_arm_s_spread_over_its_seeds():
    """seed_variance.csv from hand-made tables: each arm's mean and sd (ddof 1) over its seeds, the
    losses from the loss-difference rows (the baseline's and the compared run's), the scores from benchmarks.csv."""
    import pandas as pd

    from streamback.report.seeds import seed_variance

    cfg = validate_config(
        {
            "model": MODEL,
            "train": {**TRAIN, "runs": {**TRAIN["runs"], "seeds": [TRAIN["seed"], 1, 2], "stream_seeds": [1]}},
        }
    )
    runs = run_matrix(cfg["train"])
    accuracy = {name: 0.5 + 0.01 * i for i, name in enumerate(runs)}
    benchmarks = pd.DataFrame(
        [{"run": r, "task": "t", "filter": "none", "metric": "acc", "value": v} for r, v in accuracy.items()]
    )
    loss = pd.DataFrame(
        [
            {
                "shape": "micro",
                "comparison": "streamback",
                "seed": s,
                "split": "val",
                "baseline_loss": 3.0 + s / 10,
                "compared_loss": 2.9 + s / 10,
            }
            for s in (TRAIN["seed"], 1, 2)
        ]
        + [
            {
                "shape": "micro",
                "comparison": "streamback-bf16_sr",
                "seed": 1,
                "split": "val",
                "baseline_loss": 3.1,
                "compared_loss": 3.3,
            }
        ]
        + [{"shape": "micro", "comparison": "streamback", "seed": "all", "split": "val", "baseline_loss": 9.0}]
    )
    table = seed_variance(cfg["train"], benchmarks, loss).set_index(["arm", "task"])
    base = table.loc[("micro-baseline", "loss")]
    # derived: the same formula by hand on the same floats (fp64 roundings only, within approx's default 1e-6); here and
    # below
    assert (
        base.seeds == 3
        and base["mean"] == pytest.approx(np.mean([3.7, 3.1, 3.2]))
        and base.sd == pytest.approx(np.std([3.7, 3.1, 3.2], ddof=1))
    )
    assert table.loc[("micro-streamback", "loss")]["mean"] == pytest.approx(np.mean([3.6, 3.0, 3.1]))
    single = table.loc[("micro-streamback-bf16_sr", "loss")]
    assert single.seeds == 1 and single["mean"] == 3.3 and np.isnan(single.sd)
    scores = [accuracy[r] for r in ("micro-baseline", "micro-baseline-seed1", "micro-baseline-seed2")]
    assert table.loc[("micro-baseline", "t")].sd == pytest.approx(np.std(scores, ddof=1))
    assert set(table.index.get_level_values("arm")) == {
        "micro-baseline",
        "micro-streamback",
        "micro-streamback-bf16_sr",
    }
