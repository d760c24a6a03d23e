"""config/dose.yaml, the dose tier, through Snakemake: a dry run plans every arm of its two depths and
two doses for its three seeds, a preflight per arm, and no public model (tests/unit/test_dose_tier.py
checks the matrix itself)."""

import re

from streamback.config import merge_config, read_config_file, validate_config
from streamback.runs import run_matrix

from conftest import ROOT

CONFIG = ROOT / "config" / "dose.yaml"


def test_the_tier_dry_runs(run_snakemake, tmp_path):
    result = run_snakemake("-n", "--configfile", CONFIG, "--directory", tmp_path)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-3000:]
    tier = validate_config(merge_config(read_config_file(ROOT / "config" / "config.yaml"), read_config_file(CONFIG)))
    matrix = run_matrix(tier["train"])
    counts = dict(re.findall(r"^(\w+)\s+(\d+)$", out, re.MULTILINE))
    assert counts["train"] == counts["evaluate"] == str(len(matrix)) == "36"
    assert counts["preflight_run"] == str(len({spec.arm for spec in matrix.values()})) == "12"
    assert "analyze_public" not in counts and "export_hf" not in counts
    assert "wildcards: run=l80-dose-large-streamback-bf16_sr-seed2\n" in out
