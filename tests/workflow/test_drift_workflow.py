"""The drift rule end to end: the shared study's drift job (conftest's `study`: a real Snakemake run,
through Slurm where it is installed), its files and findings, and a Snakemake report of its outputs."""

import pandas as pd
import pytest

from streamback import layout

from helpers.drift import assert_note_findings

FIGURES = layout.DRIFT_FIGURES


@pytest.mark.slow
def test_drift_rule_end_to_end(study, run_snakemake, tmp_path):
    # the note's grid (settings, 4000 steps, start 600), on fewer coordinates and seeds (conftest's SMALL)
    root = study.root
    out = root / layout.DRIFT_DIR
    assert (
        "drift: 8 paths x 3 settings x 2 seeds x 256 coordinates x 4000 steps"
        in (root / "logs" / "drift.log").read_text()
    )
    summary = pd.read_csv(out / "summary.csv")
    assert len(summary) == 3 * 9 * 2  # nine paths, fp8_e4m3's rows not simulated
    assert {"mu", "sigma", "path", "seed", "steps", "coords", "start", "drift", "drift_ratio"} <= set(summary.columns)
    assert_note_findings(summary)

    trajectories = pd.read_parquet(out / "trajectories.parquet")
    assert list(trajectories.columns) == ["mu", "sigma", "path", "seed", "step", "mean", "std"]
    assert sorted(trajectories.step.unique()) == list(range(0, 4001, 10))
    keys = ["mu", "sigma", "path", "seed"]
    ends = (
        trajectories[trajectories.step == 0]
        .merge(trajectories[trajectories.step == 4000], on=keys)
        .merge(summary, on=keys)
    )
    assert len(ends) == 3 * 8 * 2 and ((ends.mean_y - ends.mean_x - ends.drift).abs() < 1e-3).all()

    spacing = pd.read_csv(out / "spacing.csv")
    probe = spacing[(spacing.kind == "probe") & (spacing.format == "bf16") & (spacing.value == 600)]
    assert probe.gap.tolist() == [4.0, 4.0] and probe.result.tolist() == [600.0, 604.0]

    for name in FIGURES:
        assert (out / f"{name}.svg").read_text().lstrip().startswith("<svg")
        assert (out / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = (out / "report.html").read_text()
    assert "https://cdn" not in page and "<script src" not in page
    assert page.count('vegaEmbed("#chart') == len(FIGURES) and "<table" in page
    bf16 = summary[(summary.path == "bf16") & (summary.mu == 0.2) & (summary.sigma == 0.5)].drift_ratio.mean()
    assert f"{100 * bf16:.2f}%" in page  # the reading is computed from the table

    # the outputs marked report() and their captions make a Snakemake report (read from the study; nothing runs)
    result = run_snakemake(
        "drift", "--directory", root, "--configfile", root / "small.yaml", "--report", tmp_path / "snakemake.html"
    )
    assert result.returncode == 0, result.stderr + result.stdout
    assert "drift_ratio.svg" in (tmp_path / "snakemake.html").read_text()
