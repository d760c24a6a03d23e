"""The preflight in the workflow: the paper and one-GPU tiers' dry runs plan a `preflight_run` job
per arm ahead of its runs' train jobs, with the same resources; on a tiny study `snakemake
preflight` runs the preflights alone, a second call reruns none of them, and a changed resource
or execution setting reruns exactly them."""

import re

import pytest
import yaml

from streamback import layout

from conftest import ROOT

TINY = {
    "data": {"synthetic": {"documents": 2000, "files": 1}},
    "train": {
        "tokens": 15360,
        "runs": {"shapes": ["tiny-fat-short"], "streams": [], "seeds": [0, 1]},
        "schedule": {"warmup_steps": 5, "decay_steps": 10},
        "checkpoint": {"every": 10},
        "log": {"every": 10, "stream_every": 10, "val_every": 10, "val_sequences": 16},
    },
    "analysis": {"public_models": {"tiny-skinny-tall-baseline-hf": None}},  # its run is not in this matrix
}


def planned(output: str) -> list[dict]:
    """Every job of a dry run's output: its rule, wildcards, inputs, resources and reason."""
    jobs = []
    for block in re.split(r"\n\[[^\]]+\]\n", output):
        rule = re.match(r"(?:local)?rule (\w+):", block.strip())
        if not rule:
            continue
        fields = dict(re.findall(r"^    (\w+): (.*)$", block, flags=re.M))
        jobs.append({"rule": rule.group(1), **fields})
    return jobs


def by_rule(jobs, rule):
    return [j for j in jobs if j["rule"] == rule]


@pytest.mark.parametrize("name", ["paper.yaml", "one-gpu.yaml"])
def test_every_train_job_has_a_preflight_ahead_on_the_same_resources(run_snakemake, tmp_path, name):
    result = run_snakemake("-n", "--configfile", ROOT / "config" / name, "--directory", tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = planned(result.stdout)
    preflights = {j["wildcards"].removeprefix("arm="): j for j in by_rule(jobs, "preflight_run")}
    trains = by_rule(jobs, "train")
    (table,) = by_rule(jobs, "preflight")
    assert trains and len(preflights) <= len(trains)
    for train in trains:
        record = re.search(r"results/preflight/([^,\s]+)\.json", train["input"]).group(1)
        assert train["resources"] == preflights[record]["resources"], (train["wildcards"], record)
        assert train["wildcards"].removeprefix("run=").startswith(record)
    assert all(f"results/preflight/{arm}.json" in table["input"] for arm in preflights)


def test_snakemake_preflight_runs_the_preflights_alone_and_reruns_them_on_a_changed_setting(run_snakemake, tmp_path):
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(TINY))
    args = ("--cores", "2", "--directory", tmp_path, "--configfile", tmp_path / "tiny.yaml")
    result = run_snakemake("preflight", *args)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (
        re.findall(r"Finished jobid: \d+ \(Rule: (\w+)\)", result.stderr).count("preflight_run") == 2
    )  # two arms, two seeds each
    assert not (tmp_path / "results" / "runs").exists()  # nothing trained
    table = (tmp_path / layout.table(layout.PREFLIGHT_TABLE)).read_text()
    assert "tiny-fat-short-baseline" in table and "FAIL" not in table
    again = run_snakemake("-n", "preflight", *args)
    assert "Nothing to be done" in again.stdout + again.stderr
    # the train jobs wait for nothing more: their preflights are done
    trains = planned(run_snakemake("-n", *args).stdout)
    assert {j["rule"] for j in trains} >= {"train"} and not by_rule(trains, "preflight_run")
    for change in ({"resources": {"mem_mb": 3000}}, {"compile": True}):
        (tmp_path / "change.yaml").write_text(yaml.safe_dump({"train": change}))
        changed = planned(run_snakemake("-n", "preflight", *args, tmp_path / "change.yaml").stdout)
        reruns = by_rule(changed, "preflight_run")
        assert len(reruns) == 2 and all("params" in j["reason"].lower() for j in reruns), change
