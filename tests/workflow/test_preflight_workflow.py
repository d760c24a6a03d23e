"""The preflight in the workflow: the paper and one-GPU tiers' dry runs plan a `preflight_run` job
per arm ahead of its runs' train jobs, with the same resources; on a tiny study `snakemake
preflight` runs the preflights alone, a second call reruns none of them, and a changed resource
or execution setting reruns exactly them."""

import re

import pytest
import yaml

from streamback import layout
from streamback.config import load_config
from streamback.jobs import SIGNAL_UNMEASURED_S

from conftest import ROOT

# the default's train.preflight.steps: a preflight's runtime is sized from them
PREFLIGHT_STEPS = load_config(ROOT / "config" / "config.yaml")["train"]["preflight"]["steps"]

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


def resources_of(job) -> dict:
    """A planned job's resources, as Snakemake prints them (`name=value, ...`)."""
    return dict(item.split("=", 1) for item in re.split(r", (?=\w+=)", job["resources"]))


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
        # it waits for its arm's verdict and the matrix's (the budget), not for a record
        arm = re.search(r"results/preflight/([^,\s]+)\.pass", train["input"]).group(1)
        assert (
            "results/preflight/matrix.pass" in train["input"]
            and "results/preflight/" + arm + ".json" not in train["input"]
        )
        # the same GPUs, nodes, memory and partition (slurm_extra); its own runtime, sized from its steps
        train_resources, preflight_resources = (resources_of(j) for j in (train, preflights[arm]))
        # the train job's own: the stop signal ahead of its time limit (an unmeasured run's lead: no preflight yet)
        own = train_resources.pop("slurm_extra").removesuffix(f"--signal=URG@{SIGNAL_UNMEASURED_S}").strip()
        if own:
            train_resources["slurm_extra"] = own
        assert int(preflight_resources.pop("runtime")) == min(
            int(train_resources.pop("runtime")), 15 + 2 * PREFLIGHT_STEPS
        ), arm
        assert train_resources == preflight_resources, (train["wildcards"], arm)
        assert train["wildcards"].removeprefix("run=").startswith(arm)
    assert all(f"results/preflight/{arm}.json" in table["input"] for arm in preflights)
    # both tiers state a cost (train.stated_gpu_hours), so the table writes the gate every train job waits for
    assert "results/preflight/matrix.pass" in table["output"] and not by_rule(jobs, "preflight_unbounded")


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
    arms = ("tiny-fat-short-baseline", "tiny-fat-short-streamback")
    gates = [tmp_path / layout.preflight_gate(arm) for arm in arms]
    assert [gate.read_text() for gate in gates] == [layout.PASSED] * 2
    assert not (tmp_path / layout.PREFLIGHT_MATRIX_GATE).exists()  # no bound set: the table writes no gate

    # Over the tiers table's cost (each run's own checks still pass): the preflights run again, the
    # matrix fails in one line naming the projection, the bound and the costliest arm, and no train job starts.
    (tmp_path / "stated.yaml").write_text(yaml.safe_dump({"train": {"stated_gpu_hours": 1e-9}}))
    models = [str(layout.model_file(f"{arm}{seed}")) for arm in arms for seed in ("", "-seed1")]
    over = run_snakemake(*models, *args, tmp_path / "stated.yaml")
    assert over.returncode != 0
    failed = [line for line in over.stderr.splitlines() if line.startswith("preflight matrix: FAILED")]
    assert len(failed) == 1, over.stderr[-3000:]
    assert re.fullmatch(
        r"preflight matrix: FAILED stated cost: projected [\d.,]+ CPU process-hours for the matrix \(bound: 1\.5 x the "
        r"tiers table's 0\.00, train\.stated_gpu_hours\); the costliest arm: tiny-fat-short-\w+, [\d.,]+ CPU "
        r"process-hours \(2 runs\)",
        failed[0],
    ), failed[0]
    finished = re.findall(r"Finished jobid: \d+ \(Rule: (\w+)\)", over.stderr)
    assert finished.count("preflight_run") == 2 and "train" not in finished, finished
    assert not any((tmp_path / model).exists() for model in models) and not (tmp_path / "logs" / "train").exists()
    assert not (tmp_path / layout.PREFLIGHT_MATRIX_GATE).exists()
    assert [gate.read_text() for gate in gates] == [layout.PASSED] * 2  # each arm passed again
