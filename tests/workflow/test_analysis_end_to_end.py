"""The end-to-end half of test_analysis.py (commands run as processes, compiled or multi-process runs, Snakemake): the
same subjects, at the pace of whole runs."""

import math
import re

import numpy as np
import pandas as pd
import pytest
import yaml

from streamback import layout
from streamback.train.metrics import read_metrics

from helpers.analysis import SHAPES, analyze, matrix, matrix_tokens  # noqa: F401  (matrix: a fixture)

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.slow
def test_every_kind_through_the_command(matrix, monkeypatch, capsys):
    """Every kind on the seeded matrix: each table says the run's seed; the loss differences come
    per seed and over the seeds, with the values streamback.stats gives."""
    from streamback.analysis.loss import BOOTSTRAP_RESAMPLES, model_window_losses
    from streamback.data.shards import TokenDataset
    from streamback.stats import across_seeds, hierarchical_bootstrap, seed_mde, seeds_needed, sign_flip_p, within_se
    from streamback.train.batches import val_windows

    root, config = matrix
    runs = [
        f"{shape}-{arm}"
        for shape in SHAPES
        for arm in ("baseline", "baseline-seed1", "streamback", "streamback-seed1", "streamback-mxfp8")
    ]
    columns = {
        "layer_error": [
            "run",
            "seed",
            "variant",
            "kind",
            "layer",
            "max_abs_error",
            "rel_error",
            "sign_flips",
            "sign_flip_fraction",
        ],
        "envelope": ["run", "seed", "layer", "max", "min", "abs_p999"],
        "envelope_training": ["run", "seed", "step"],
        "swallowed": ["run", "seed", "variant", "layer", "sublayer", "swallowed_fraction", "lost_mass_fraction"],
        "loss_difference": [
            "shape",
            "comparison",
            "seed",
            "split",
            "final_difference",
            "ci_low",
            "ci_high",
            "boot_low",
            "boot_high",
            "seeds",
        ],
    }
    for kind in [k for k in layout.ANALYSIS_TABLES if k != "public"]:  # public: tests/unit/test_public.py
        status, _, err = analyze(monkeypatch, capsys, root, config, kind)
        assert status == 0, err[-3000:]
        for name in layout.ANALYSIS_TABLES[kind]:
            table = pd.read_csv(root / layout.table(name))
            if name in columns:
                assert list(table.columns[: len(columns[name])]) == columns[name]
        for path in layout.analysis_outputs(kind, runs, list(SHAPES)):
            assert (root / path).stat().st_size > 0, path
    assert (root / layout.figure("envelope", "svg")).read_text().lstrip().startswith("<svg")
    assert (root / layout.figure("swallowed-b-tall", "png")).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    errors = pd.read_csv(root / layout.table("layer_error"))
    assert sorted(errors.run.unique()) == sorted(runs) and set(errors.variant) == {"bf16", "fp32", "nvfp4_sr"}
    assert set(errors[errors.run == "a-short-streamback-seed1"].seed) == {1} and set(
        errors[errors.run == "a-short-baseline"].seed
    ) == {0}
    assert len(errors[errors.run == "b-tall-baseline"]) == 3 * (5 + 5 + 4)
    final = pd.read_csv(root / layout.table("loss_difference"))
    assert sorted(final.comparison.unique()) == ["streamback", "streamback-mxfp8"]
    per_seed, over = final[final.seed != "all"], final[final.seed == "all"]
    assert len(per_seed) == 2 * (2 + 1) * 2 and len(over) == 2 * 2 * 2  # shapes x (seeds of each comparison) x splits
    assert ((per_seed.ci_low < per_seed.final_difference) & (per_seed.final_difference < per_seed.ci_high)).all()
    for row in over.itertuples():
        seeds = per_seed[
            (per_seed["shape"] == row.shape) & (per_seed.comparison == row.comparison) & (per_seed.split == row.split)
        ]
        summary = across_seeds(seeds.final_difference.to_numpy(), 0.95)
        # derived: the same formula by hand on the same floats (fp64 roundings only, within approx's default 1e-6); here
        # and below
        assert row.seeds == len(seeds) == summary["n"] and row.final_difference == pytest.approx(
            summary["mean"], abs=1e-12
        )
        if row.seeds > 1:
            assert (row.ci_low, row.ci_high, row.sd) == pytest.approx(
                (summary["low"], summary["high"], summary["sd"]), abs=1e-12
            )
            assert row.verdict.startswith(("within seed noise", "consistent across seeds"))
        else:
            assert math.isnan(row.ci_low) and row.verdict.startswith(
                "one training seed: training randomness is not covered"
            )
    # the seeds-then-windows bootstrap of a-short's streamback val difference, recomputed from the models
    val = TokenDataset(matrix_tokens(config), "val")
    windows = val_windows(10**9, 8, 0, 1)[:8]
    diffs = [
        model_window_losses(root / layout.model_file(f"a-short-baseline{s}"), val, windows, 32, 4, "cpu")
        - model_window_losses(root / layout.model_file(f"a-short-streamback{s}"), val, windows, 32, 4, "cpu")
        for s in ("", "-seed1")
    ]
    row = over[(over["shape"] == "a-short") & (over.comparison == "streamback") & (over.split == "val")].iloc[0]
    # exact but for the CSV's decimal round trip: the same seeded bootstrap of the same items
    assert (row.boot_low, row.boot_high) == pytest.approx(
        hierarchical_bootstrap(diffs, 0.95, BOOTSTRAP_RESAMPLES)[1:], abs=1e-9
    )
    noise = within_se(diffs)
    sigma = max(np.std([d.mean() for d in diffs], ddof=1), noise)
    # derived: the same formulas by hand in fp64 (a few 2^-53, far inside 1e-12 and 1e-9)
    assert (row.within_se, row.p_seeds) == pytest.approx((noise, sign_flip_p([d.mean() for d in diffs])), abs=1e-12)
    assert row.mde == pytest.approx(seed_mde(sigma, 2, 0.05, 0.8), rel=1e-9)
    assert (row.seeds_for_band, row.seeds_for_target) == pytest.approx(
        (seeds_needed(sigma, 0.001), seeds_needed(sigma, 0.002)), nan_ok=True
    )
    curves = pd.read_csv(root / layout.table("loss_curves"))
    b, o = (read_metrics(root / layout.metrics_file(f"a-short-{block}")) for block in ("baseline", "streamback"))
    pick = (curves["shape"] == "a-short") & (curves.comparison == "streamback") & (curves.split == "train")
    # derived: the same formula by hand on the same floats (fp64 roundings only, within approx's default 1e-6); here and
    # below
    assert curves[pick & (curves.seed == "0")].difference.tolist() == pytest.approx(
        [x["loss"] - y["loss"] for x, y in zip(b, o)], abs=1e-12
    )
    both = curves[pick & (curves.seed != "all")].pivot(index="step", columns="seed", values="smoothed")
    mean = curves[pick & (curves.seed == "all")].set_index("step")
    assert mean.smoothed.tolist() == pytest.approx(both.mean(axis=1).tolist(), abs=1e-12)
    assert mean.band_low.tolist() == pytest.approx(
        both.min(axis=1).tolist()
    ) and mean.band_high.tolist() == pytest.approx(both.max(axis=1).tolist())


@pytest.mark.slow
def test_the_rules_run_the_analyses_of_trained_runs(matrix, run_snakemake, tokens):
    """Snakemake on the analyses, the runs already trained (their files newer than the token
    manifest, whose input corpus is older): all four rules are planned, two of them (one reading
    the metrics of the compared runs, one the models of all runs) run, then Snakemake's report."""
    root, config = matrix
    settings = yaml.safe_load(config.read_text())
    settings["data"].update(source="local", local={"files": [str(tokens.parent / "part.parquet")]})
    (root / "snake.yaml").write_text(yaml.safe_dump(settings))
    every = [layout.table(name) for kind, names in layout.ANALYSIS_TABLES.items() if kind != "public" for name in names]
    for path in every:
        (root / path).unlink(missing_ok=True)
    common = ("--rerun-triggers", "mtime", "--directory", root, "--configfile", root / "snake.yaml")
    planned = run_snakemake(*every, "-n", *common)
    assert planned.returncode == 0, planned.stderr[-3000:]
    jobs = re.findall(r"^rule (\w+):", planned.stdout, flags=re.M)
    assert sorted(jobs) == ["analyze_envelope", "analyze_layer_error", "analyze_loss_difference", "analyze_swallowed"]
    targets = [layout.table("envelope"), layout.table("loss_difference")]
    result = run_snakemake(*targets, "--cores", "2", *common)
    assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-3000:]
    for kind in ("envelope", "loss-difference"):
        assert f"analyze {kind}: 10 models on cpu" in (root / "logs" / "analysis" / f"{kind}.log").read_text()
    assert len(pd.read_csv(root / layout.table("envelope")).run.unique()) == 10
    result = run_snakemake(
        *targets, "--directory", root, "--configfile", root / "snake.yaml", "--report", root / "report.html"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert (root / "report.html").stat().st_size > 0
