"""config/depth.yaml, the depth tier: the paper's 80 / 40 / 20 layers at tiny widths with about equal
parameters in the blocks, every run trainable, and a dry run that plans three depths x two blocks x
the seeds, the export of the 80-layer baseline through analyze_public, and rule depth."""

import re

import pytest
import torch

from streamback.config import merge_config, read_config_file, validate_config
from streamback.model.model import ModelArgs, Transformer
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
