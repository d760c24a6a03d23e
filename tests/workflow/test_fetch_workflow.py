"""A GPU tier's first run on a cluster whose compute nodes are offline, small: `snakemake fetch`
against the local Hub (tests/helpers/hub.py), then tokenize, the preflights, training, evaluate
and an analysis with no network at all (`unshare -n`), as docs/slurm.md tells it. The default
config reads nothing from the Hub: its DAG plans no fetch."""

import json
import subprocess

import pytest
import yaml

from streamback import layout
from streamback.config import merge_config

from conftest import snakemake_command
from helpers.hub import hub_environment, local_hub, needs_unshare, no_network, tier_config  # noqa: F401

# the tiny tier on the Hub's data: one run (a shape's baseline, one seed), a few steps
TINY = {
    "train": {
        "tokens": 15360,
        "runs": {"shapes": ["tiny-fat-short"], "blocks": ["baseline"], "streams": [], "seeds": [0]},
        "schedule": {"warmup_steps": 5, "decay_steps": 10},
        "checkpoint": {"every": 10},
        "log": {"every": 10, "stream_every": 10, "val_every": 10, "val_sequences": 16},
    },
    "analysis": {"public_models": {}},
}
RUNS = ("tiny-fat-short-baseline",)


def test_the_default_config_plans_no_fetch(run_snakemake, tmp_path):
    result = run_snakemake("-n", "--directory", tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "rule tokenize:" in result.stdout and "rule fetch:" not in result.stdout


@pytest.mark.slow
@needs_unshare
def test_fetch_on_the_login_node_then_every_job_offline(local_hub, tmp_path):
    config = merge_config(tier_config(tmp_path), TINY)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    env = hub_environment(local_hub.hub, tmp_path)

    def snakemake(*args, offline):
        command = snakemake_command(*args, "--cores", "2", "--configfile", "config.yaml")
        return subprocess.run(
            no_network(command) if offline else command,
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=1200,
        )

    # before the fetch, a compute job names what it lacks, and the fix
    early = snakemake(str(layout.tokens_dir(config["data"]) / "manifest.json"), offline=True)
    assert early.returncode != 0
    assert "its README.md is not in the Hub cache" in early.stderr and "run `snakemake fetch`" in early.stderr

    fetch = snakemake("fetch", offline=False)
    assert fetch.returncode == 0, fetch.stderr[-3000:]
    record = json.loads((tmp_path / layout.FETCH_RECORD).read_text())
    assert record["dataset"]["commit"] == local_hub.dataset.commit

    study = snakemake("preflight", "analyze_layer_error", "benchmark_table", offline=True)
    assert study.returncode == 0, study.stderr[-5000:]
    manifest = json.loads((tmp_path / layout.tokens_dir(config["data"]) / "manifest.json").read_text())
    assert manifest["source"]["commit"] == record["dataset"]["commit"]
    assert manifest["tokenizer"]["commit"] == local_hub.tokenizer.commit
    for run in RUNS:
        results = json.loads((tmp_path / layout.eval_results(run)).read_text())
        assert "acc,none" in results["results"]["hellaswag"], run
    assert (tmp_path / layout.table("layer_error")).stat().st_size > 0
    assert (tmp_path / layout.table(layout.PREFLIGHT_TABLE)).stat().st_size > 0
