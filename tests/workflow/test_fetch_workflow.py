"""A GPU tier's first run on a cluster whose compute nodes are offline, small: `snakemake fetch`
against the local Hub (tests/helpers/hub.py), then tokenize, the preflights, training, evaluate
and an analysis with no network at all (`unshare -n`), as docs/slurm.md tells it. The default
config reads nothing from the Hub: its DAG plans no fetch."""

import json
import re
import subprocess

import pytest
import yaml

from streamback import layout
from streamback.config import merge_config

from conftest import ROOT, snakemake_command
from helpers.hub import DATASET, hub_environment, local_hub, needs_unshare, no_network, tier_config  # noqa: F401

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


def test_the_default_config_plans_no_fetch_and_a_tier_fetches_first(run_snakemake, tmp_path):
    result = run_snakemake("-n", "--directory", tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "rule tokenize:" in result.stdout and not re.search(r"rule fetch", result.stdout)
    # a tier's tokenize waits for its data's fetch, its evaluate jobs for their tasks' (local rules: fetch.smk)
    tier = run_snakemake("-n", "--directory", tmp_path, "--configfile", ROOT / "config" / "one-gpu.yaml")
    assert tier.returncode == 0, tier.stderr[-3000:]
    blocks = {b.split(":")[0]: b for b in re.split(r"\n(?=(?:local)?rule \w+:\n)", tier.stdout)}
    assert f"input: {layout.fetch_record('data')}" in blocks["rule tokenize"]
    assert str(layout.fetch_record("tasks")) in blocks["rule evaluate"]
    assert "rule fetch_data" in blocks and "rule fetch_tasks" in blocks


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

    # without the network, tokenize's fetch_data (run first, as a local rule) says what it cannot reach
    early = snakemake(str(layout.tokens_dir(config["data"]) / "manifest.json"), offline=True)
    assert early.returncode != 0
    assert f"streamback fetch: error: cannot fetch hub dataset {DATASET} (revision main)" in early.stderr, early.stderr
    assert not (tmp_path / layout.tokens_dir(config["data"])).exists()

    fetch = snakemake("fetch", offline=False)
    assert fetch.returncode == 0, fetch.stderr[-3000:]
    record = json.loads((tmp_path / layout.fetch_record("data")).read_text())
    assert json.loads((tmp_path / layout.fetch_record("tasks")).read_text())["tasks"][0]["task"] == "hellaswag"
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
