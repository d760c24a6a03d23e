"""`snakemake --profile slurm` submits real jobs to a local Slurm cluster: the whole default
study, a train job requeued while it runs and then stopped by its time limit, and the run's lock
judged against the queue's real jobs (a run trained on two nodes: test_slurm_nodes.py, so
that pytest-xdist's workers run the two modules at once).

.ci/run installs Debian's slurm-wlm and munge and starts the cluster with
tests/slurm/start-cluster.sh (a node for every job, and two more slurmd "nodes" on the same host
for the 2-node run); on a machine without Slurm these tests are skipped.
"""

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from streamback import layout

from conftest import ROOT, SLURM_SITE, snakemake_command, start_slurm
from helpers.slurm import SLURM as pytestmark  # noqa: F401  (the module's marks)
from helpers.slurm import squeue as _squeue

STEPS = 100  # the train job's steps: long enough to be stopped twice


def pending(pid: int, sig: int) -> bool:
    """Whether `sig` was sent to process `pid` and waits (it is stopped): /proc's mask of pending signals."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:  # it ended
        return False
    mask = int(re.search(r"^ShdPnd:\s*([0-9a-f]+)", status, re.MULTILINE).group(1), 16)
    return bool(mask >> (sig - 1) & 1)


def test_a_train_job_requeued_then_stopped_by_its_time_limit_resumes_bit_identical(run_snakemake, tmp_path):
    """One train job through `--profile slurm`, stopped twice: `scontrol requeue` while it runs
    (what preemption does: the trainer saves on SIGTERM and exits 75, Slurm runs the same job
    again, which resumes), then, on the rerun, its time limit shortened to one minute: Slurm sends
    the SIGURG that the rule asked for (`--signal=URG@<lead>` in its slurm_extra; a lead of 55 s
    here, so the signal comes at Slurm's next time-limit check, within 30 s), the trainer saves
    and exits 75, and Snakemake's retry (the profile's: `retries: 0` is no rule-level 0), a new
    job, resumes. The final weights equal those of an uninterrupted run bit for bit. While Slurm's
    check comes the trainer is held stopped (SIGSTOP, the signal pending until SIGCONT), so that
    a run of 100 steps, seconds long, is not over before it."""
    import time

    import torch
    import yaml

    from streamback.config import DEFAULT_CONFIG, validate_config
    from streamback.model.weights import read_model

    run = "tiny-fat-short-streamback"
    small = {
        "data": {"synthetic": {"documents": 3000, "files": 1}},
        "train": {
            "runs": {"shapes": ["tiny-fat-short"], "blocks": ["streamback"], "streams": []},
            "tokens": STEPS * 4 * 128,
            "checkpoint": {"every": 10, "keep": 2},
            "schedule": {"warmup_steps": 10, "decay_steps": 50},
            "resources": {"signal_lead": 55},
        },
    }
    (tmp_path / "small.yaml").write_text(yaml.safe_dump(small))
    tokens = run_snakemake(
        layout.tokens_dir({"corpus": "synthetic"}) / "manifest.json",
        "--cores",
        "2",
        "--directory",
        tmp_path,
        "--configfile",
        tmp_path / "small.yaml",
    )  # here: Slurm is for the train job
    assert tokens.returncode == 0, tokens.stderr[-3000:]
    start_slurm()
    cmd = snakemake_command(
        layout.summary_file(run),
        "--profile",
        "slurm",
        *SLURM_SITE,
        "--directory",
        tmp_path,
        "--configfile",
        tmp_path / "small.yaml",
    )
    workflow = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    checkpoints = tmp_path / layout.checkpoint_dir(run)
    history = checkpoints / layout.TRAIN_LOG

    def wait_for(what, done, seconds=400):
        deadline = time.monotonic() + seconds
        while not done():
            if workflow.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"{what}: {workflow.communicate()[0][-3000:] if workflow.poll() is not None else ''}")
            time.sleep(0.5)

    def steps_logged():  # the recipe's live metrics, once the trainer made its directory
        logs = [p for d in layout.recipe_dirs(checkpoints) if (p := d / layout.METRICS_FILE).exists()]
        return max((len(p.read_text().splitlines()) for p in logs), default=0)

    def train_job():
        (job,) = [jid for jid, name, workdir in _squeue("%i", "%j", "%Z") if workdir == str(tmp_path)]
        return job  # this workflow's only job now

    try:
        wait_for("the train job did not start", lambda: steps_logged() >= 15)  # well into the run, past a checkpoint
        job = train_job()
        subprocess.run(["scontrol", "requeue", job], check=True)
        wait_for("not requeued", lambda: any(state == "PENDING" for jid, state in _squeue("%i", "%T") if jid == job))
        # Slurm holds a requeued job for about two minutes before it is eligible again: release it now
        subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], check=True)
        wait_for("the requeued job did not resume", lambda: history.read_text().count("resuming from step") >= 1)
        wait_for("the requeued job did not train", lambda: steps_logged() >= 25)
        assert train_job() == job
        trainer = json.loads((checkpoints / layout.TRAINER_LOCK).read_text())["pid"]  # the lock's stamp
        os.kill(trainer, signal.SIGSTOP)
        try:
            subprocess.run(["scontrol", "update", f"JobId={job}", "TimeLimit=1"], check=True)

            # Slurm sends SIGCONT with its signal (as before SIGTERM), so the trainer may go on by itself
            def heard():
                return "SIGURG received" in history.read_text() or pending(trainer, signal.SIGURG)

            wait_for("no SIGURG from Slurm", heard, seconds=90)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(trainer, signal.SIGCONT)
        out, _ = workflow.communicate(timeout=400)
    finally:
        if workflow.poll() is None:
            workflow.kill()
    assert workflow.returncode == 0, out[-3000:]
    log = (tmp_path / "logs" / "train" / f"{run}.log").read_text()
    attempts = log.split("=== attempt started")[1:]
    assert len(attempts) == 3, log[-3000:]
    requeued, limited, retried = attempts
    jobs = [re.search(r"Slurm job (\d+)", attempt.splitlines()[0]).group(1) for attempt in attempts]
    assert jobs[0] == jobs[1] == job != jobs[2]  # requeued: the same job; retried: a new one
    assert "SIGTERM received: saved the checkpoint of step" in requeued and "ended with status 75" in requeued
    assert "SIGURG received: saved the checkpoint of step" in limited and "ended with status 75" in limited
    first = int(requeued.split("saved the checkpoint of step ")[1].split(";")[0])
    second = int(limited.split("saved the checkpoint of step ")[1].split(";")[0])
    assert 0 < first < second < STEPS and f"resuming from step {first}" in limited
    assert f"resuming from step {second}" in retried and "ended with status 0" in retried

    # the same run, uninterrupted, outside Slurm
    from snakemake.utils import update_config

    from streamback.train.trainer import train

    config = yaml.safe_load(DEFAULT_CONFIG.read_text())
    update_config(config, small)  # as --configfile merges it
    config = validate_config(config)

    from streamback.model import compute

    torch.set_num_threads(1)
    with compute.use(config["cpu_bf16"]):  # the kernels the workflow's jobs ran on (STREAMBACK_CPU_BF16)
        assert (
            train(
                config["train"],
                config["model"],
                run,
                tmp_path / layout.tokens_dir(config["data"]),
                tmp_path / "whole",
                tmp_path / "whole-ckpt",
            )
            == 0
        )
    resumed, whole = (
        read_model(tmp_path / layout.model_file(run)).state,
        read_model(tmp_path / "whole" / layout.MODEL_FILE).state,
    )
    assert all(torch.equal(resumed[k], whole[k]) for k in whole)


def test_the_whole_default_study_runs_through_slurm(study):
    """Every job of the default study (corpus, tokenize, the preflights, the training runs, evaluation,
    analyses, drift), smaller: conftest's `study`, which test_study reads, goes through sbatch, each
    job with its Slurm log in the profile's slurm-logdir; the local rules (tables, figures, the
    page) run beside Snakemake."""
    assert study.slurm
    steps = int(re.findall(r"(\d+) of (\d+) steps \(100%\) done", study.output)[-1][1])
    submitted = re.findall(r"has been submitted with SLURM jobid (\d+)", study.output)
    # every job but the local rules: `all`, which has nothing to run, the gate and recipe files, the task files, and
    # the tables, figures and page made from what the jobs wrote
    local = re.findall(r"^localrule (\w+):", study.output, re.MULTILINE)
    # and the plan (rule plan: `streamback plan` of the config, seconds), which the study asks for beside `all`
    tables = {
        "preflight",
        "eval_tasks",
        "benchmark_table",
        "training_curves",
        "seed_variance",
        "depth",
        "study_report",
        "plan",
    }
    assert {"all", "train_recipe", *tables} <= set(local) <= {"all", "train_recipe", "preflight_unbounded", *tables}
    assert not {"corpus", "tokenize", "train", "evaluate", "analyze_layer_error", "drift"} & set(local)
    assert len(set(submitted)) == steps - len(local), (len(submitted), steps, len(local))
    rules = set(re.findall(r"^(?:local)?rule (\w+):", study.output, re.MULTILINE))
    assert {
        "corpus",
        "tokenize",
        "train",
        "evaluate",
        "benchmark_table",
        "analyze_layer_error",
        "analyze_loss_difference",
        "drift",
        "training_curves",
        "study_report",
    } <= rules
    assert (study.root / layout.STUDY_PAGE).stat().st_size > 100_000
    assert len(list((study.root / "logs" / "slurm").rglob("*.log"))) == len(set(submitted))


def test_the_run_lock_asks_the_cluster_whether_its_holder_still_runs(tmp_path, monkeypatch):
    """The lock of a run (streamback.train.runlock) stamped by a job that runs on the cluster holds
    against a trainer elsewhere, whose flock sees nothing (`use_flock=False`: a node-local flock);
    a train job waits for it; once Slurm says the job ended, the lock is taken over."""
    import time

    from streamback.errors import StreambackError
    from streamback.train import runlock

    start_slurm()
    submit = ["sbatch", "--parsable", "--partition=multinode", "--mem=10", "--time=5", "-o", "/dev/null"]
    job = subprocess.run([*submit, "--wrap", "sleep 300"], capture_output=True, text=True, check=True).stdout.strip()
    try:
        deadline = time.monotonic() + 120
        while runlock.slurm_job_state(job) != "RUNNING":
            assert time.monotonic() < deadline, f"job {job} did not start"
            time.sleep(0.5)
        monkeypatch.setenv("SLURM_JOB_ID", job)  # the trainer of that job, as far as its lock's stamp goes
        runlock.lock_run(tmp_path, use_flock=False)
        monkeypatch.delenv("SLURM_JOB_ID")
        with pytest.raises(StreambackError, match=rf"is held by Slurm job {job} on host .*\(job {job} is RUNNING\)"):
            runlock.lock_run(tmp_path, use_flock=False)
        monkeypatch.setenv("SLURM_JOB_ID", "1")  # a job that a restarted controller submitted
        said = []
        stop = iter([False, True])
        assert not runlock.wait_for_holder(tmp_path, said.append, poll_s=0.1, stopped=lambda: next(stop))
        assert said and f"scancel {job}" in said[0]
        # its attempt (the train rule's) waits before it starts anything, until the holder's job ends
        history = tmp_path / layout.TRAIN_LOG
        attempt = subprocess.Popen(
            [sys.executable, "-m", "streamback", "train-attempt", "--launch", "echo", "--checkpoints", tmp_path,
             "--history", history, "--log", tmp_path / "job.log", "--lock-poll", "0.2", "--", "--run-name", "r"],
            env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        while f"this run is held by Slurm job {job}" not in (history.read_text() if history.exists() else ""):
            assert attempt.poll() is None and time.monotonic() < deadline + 60, attempt.communicate()[0]
            time.sleep(0.2)
        assert "train --run-name r" not in history.read_text()  # nothing started yet
        subprocess.run(["scancel", job], check=True)
        assert attempt.wait(timeout=60) == 0, attempt.communicate()[0]
        story = history.read_text()
        assert "train --run-name r --checkpoints" in story and "ended with status 0" in story  # then it started
        while runlock.slurm_job_state(job) in runlock.LIVE_STATES:
            assert time.monotonic() < deadline + 60, f"job {job} did not end"
            time.sleep(0.5)
        assert runlock.wait_for_holder(tmp_path, poll_s=0.1)
        said = []
        runlock.lock_run(tmp_path, said.append, use_flock=False).close()
        assert said[0].startswith(f"took over {tmp_path / layout.TRAINER_LOCK}: its holder, Slurm job {job} ")
    finally:
        subprocess.run(["scancel", job], check=False)  # ended already, or not
    assert runlock.slurm_job_state("2147483000") is None  # a job Slurm never had
