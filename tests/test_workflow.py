"""The Snakemake workflow: both configs dry-run; a bad config stops it before any job."""

import shutil
import subprocess
import sys

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


def test_runs_that_cannot_be_trained_stop_a_dry_run(run_snakemake, tmp_path):
    """The cross-key check (streamback.runs.check_runs) runs before any job: `snakemake -n` fails,
    naming each problem, in a few lines (no traceback, no job list)."""
    bad = {
        "model": {"shapes": {"tiny-medium": {"n_layers": 2, "dim": 12, "n_heads": 8, "n_kv_heads": 3}}},
        "train": {"batch_size": 12, "seq_len": 4096, "schedule": {"warmup_steps": 40, "decay_steps": 40}},
    }
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(bad))
    result = run_snakemake("-n", "--directory", tmp_path, "--configfile", tmp_path / "bad.yaml")
    out = result.stderr + result.stdout
    assert result.returncode != 0
    for words in ["model.shapes.tiny-medium: n_heads (8) must be a multiple of n_kv_heads (3)",
                  "model.shapes.tiny-medium: head_dim = dim // n_heads = 12 // 8 = 1 is too small",
                  "train.seq_len (4096) exceeds model.max_seq_len (2048)",
                  "warmup_steps (40) + decay_steps (40) exceed the run's",
                  "train.batch_size (12) must be a multiple of micro_batch_size (16) x processes (1)"]:
        assert words in out, words
    assert f"config/config.yaml merged with {tmp_path / 'bad.yaml'}" in out
    assert len(out.splitlines()) < 12 and "Traceback" not in out and "rule " not in out


def test_an_invalid_yaml_config_is_named_with_its_line(run_snakemake, tmp_path):
    """Snakemake's own message for invalid YAML names neither file nor line; the Snakefile reads its
    config file first. (A --configfile is read by Snakemake before the Snakefile runs: `streamback
    check FILE` names its line, tested in test_cli.py.)"""
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "workflow", repo / "workflow")
    shutil.copytree(ROOT / "config", repo / "config")
    shutil.copy(ROOT / "Snakefile", repo / "Snakefile")
    lines = (repo / "config" / "config.yaml").read_text().splitlines()
    at = lines.index("drift:") + 2
    lines[at] = "\t" + lines[at].lstrip()  # indented with a tab
    (repo / "config" / "config.yaml").write_text("\n".join(lines) + "\n")
    cmd = [sys.executable, "-m", "snakemake", "-s", str(repo / "Snakefile"), "-n", "--directory", str(tmp_path)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    out = result.stderr + result.stdout
    assert result.returncode != 0
    assert f"config file {repo / 'config' / 'config.yaml'}, line {at + 1}, column 1 is not valid YAML" in out, out
    assert len(out.splitlines()) < 5


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
