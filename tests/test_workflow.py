"""The Snakemake workflow: both configs dry-run; a bad config stops it before any job."""

import pytest
import yaml

from conftest import ROOT


@pytest.mark.parametrize("name", ["config.yaml", "paper.yaml"])
def test_dry_run(run_snakemake, tmp_path, name):
    result = run_snakemake("-n", "--configfile", ROOT / "config" / name, "--directory", tmp_path)
    assert result.returncode == 0, result.stderr + result.stdout
    assert "rule drift" in result.stdout + result.stderr


def test_slurm_profile_dry_run(run_snakemake, tmp_path):
    """`--profile slurm` resolves from the repository root and its keys are accepted."""
    result = run_snakemake("-n", "--profile", "slurm", "--configfile", ROOT / "config" / "paper.yaml",
                           "--directory", tmp_path, cwd=ROOT)
    # The Slurm executor needs sbatch only when submitting; a dry run must parse the profile.
    assert result.returncode == 0, result.stderr + result.stdout


def test_bad_config_stops_before_any_job(run_snakemake, tmp_path):
    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    config["drift"]["steps"] = -5
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(config))
    result = run_snakemake("--cores", "1", "--configfile", path, "--directory", tmp_path)
    assert result.returncode != 0
    out = result.stderr + result.stdout
    assert "steps" in out and "minimum" in out
    assert not (tmp_path / "results").exists()


def test_override_file_merges_over_the_default(run_snakemake, tmp_path):
    """`--configfile small.yaml` updates config/config.yaml key by key (the README's advice)."""
    small = tmp_path / "small.yaml"
    small.write_text("drift: {steps: 0}\n")
    result = run_snakemake("-n", "--directory", tmp_path, "--configfile", small)
    assert result.returncode != 0
    out = result.stderr + result.stdout
    assert "steps" in out and "minimum" in out
    small.write_text("drift: {steps: 5}\n")
    result = run_snakemake("-n", "--directory", tmp_path, "--configfile", small)
    assert result.returncode == 0, result.stderr


def test_every_rule_declares_log_threads_resources_and_env():
    """House rule for rule files: a `log:`, `threads`, `resources` and a conda env on every rule."""
    import re

    for smk in sorted((ROOT / "workflow" / "rules").glob("*.smk")):
        blocks = re.split(r"^rule (\w+):\n", smk.read_text(), flags=re.M)[1:]
        for name, body in zip(blocks[::2], blocks[1::2]):
            body = body.split("\n\n\n")[0]  # the rule's own block, up to the next top-level statement
            for keyword in ("log:", "threads:", "resources:", "conda:", "shell:"):
                assert f"\n    {keyword}" in "\n" + body, f"{smk.name}: rule {name} lacks {keyword}"
