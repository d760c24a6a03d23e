"""config/depth.yaml, the depth tier: the paper's 80 / 40 / 20 layers at tiny widths with about equal
parameters in the blocks, every run trainable, and a dry run that plans three depths x two blocks x
the seeds, the export of the 80-layer baseline through analyze_public, and rule depth; and rule depth
on the shared default study's three depths (8, 4, 2 layers)."""

import re

import pandas as pd
import pytest
import torch

from streamback import layout
from streamback.config import merge_config, read_config_file, validate_config
from streamback.model.model import ModelArgs, Transformer
from streamback.report.depth import MEASURES
from streamback.runs import check_runs, run_matrix

from conftest import ROOT

CONFIG = ROOT / "config" / "depth.yaml"


@pytest.fixture(scope="module")
def tier():
    """The tier as Snakemake sees it: merged over config/config.yaml."""
    base = read_config_file(ROOT / "config" / "config.yaml")
    return validate_config(merge_config(base, read_config_file(CONFIG)))


def test_the_paper_s_depths_with_about_equal_blocks(tier):
    shapes = {s: tier["model"]["shapes"][s] for s in tier["train"]["runs"]["shapes"]}
    assert sorted(s["n_layers"] for s in shapes.values()) == [20, 40, 80]
    blocks = {}
    for name in shapes:
        with torch.device("meta"):
            model = Transformer(ModelArgs.from_config(tier["model"], name, 2048))
        blocks[name] = sum(p.numel() for p in model.layers.parameters())
    assert max(blocks.values()) / min(blocks.values()) < 1.15, blocks
    check_runs(tier["train"], tier["model"], tier["data"])  # every run can be built and trained


def test_the_tier_dry_runs_three_depths_two_blocks_and_its_seeds(run_snakemake, tmp_path, tier):
    result = run_snakemake("-n", "--configfile", CONFIG, "--directory", tmp_path)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-3000:]
    matrix = run_matrix(tier["train"])
    seeds = tier["train"]["runs"]["seeds"]
    assert len(seeds) >= 5 and len(matrix) == 3 * 2 * len(seeds)
    assert {(s.shape, s.block) for s in matrix.values()} == {
        (f"depth-{d}", b) for d in (80, 40, 20) for b in ("baseline", "streamback")
    }
    counts = dict(re.findall(r"^(\w+)\s+(\d+)$", out, re.MULTILINE))
    assert counts["train"] == counts["evaluate"] == str(len(matrix))
    assert counts["export_hf"] == counts["analyze_public"] == counts["depth"] == "1"
    assert "wildcards: run=depth-80-baseline\n" in out  # the one export: the 80-layer baseline


@pytest.mark.slow
def test_the_default_study_s_depths_through_rule_depth(study):
    """The shared default study (conftest's `study`: depths 8, 4 and 2, two seeds; streams below bf16 on
    tiny-medium, seed 0) runs rule depth on its analyses' real tables: its loss rows are
    loss_difference.csv's, its flip ratios layer_error.csv's run by run, each measure has a trend, and
    the page has the section."""
    root = study.root
    table = pd.read_csv(root / layout.table("depth"))
    trend = pd.read_csv(root / layout.table("depth_trend"))
    main = table[table.comparison == "streamback"]
    assert main.depth.tolist() == [2, 4, 8] and (main.seeds == 2).all() and (main.runs == 4).all()
    streams = table[table.comparison != "streamback"]
    assert set(streams.stream) == {"bf16_sr", "mxfp8", "nvfp4"} and (streams.depth == 4).all()
    loss = pd.read_csv(root / layout.table("loss_difference"))
    over = loss[(loss.seed.astype(str) == "all") & (loss.split == "val")].set_index(["shape", "comparison"])
    for row in table.itertuples():
        # exact up to the CSV's decimal round trip: the same figure read from two tables
        assert row.val_difference == pytest.approx(over.loc[(row.shape, row.comparison), "final_difference"])
    errors = pd.read_csv(root / layout.table("layer_error"))
    grads = errors[errors.kind == "gradients"].groupby(["run", "variant"]).sign_flips.sum().unstack()
    per_run = grads["fp32"] / grads["bf16"]
    for row in main.itertuples():
        runs = [r for r in per_run.index if re.fullmatch(rf"{row.shape}-(baseline|streamback)(-seed\d+)?", r)]
        # derived: the same formula by hand on the same floats (fp64 roundings only, within approx's default 1e-6)
        assert len(runs) == 4 and row.grad_flip_ratio == pytest.approx(per_run[runs].mean())
    ours = trend[trend.comparison == "streamback"].set_index("measure")
    assert set(ours.index) == set(MEASURES) and (ours.depths == 3).all() and ours.slope.notna().all()
    assert set(trend.verdict) <= {"grows with depth", "shrinks", "no trend this tier resolves"}
    assert (trend[trend.comparison != "streamback"].verdict == "no trend this tier resolves").all()  # one depth
    page = (root / layout.STUDY_PAGE).read_text()
    assert "<h2>Does it matter more with depth?</h2>" in page
    assert "Over depths of 2, 4, 8 layers (2 training seeds each)" in page
