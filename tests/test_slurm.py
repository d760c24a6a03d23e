"""`snakemake --profile slurm` submits real jobs to a (local, one-node) Slurm cluster.

.ci/run installs Debian's slurm-wlm and munge and starts the cluster with
tests/slurm/start-cluster.sh; on a machine without Slurm this test is skipped.
"""

import shutil
import subprocess

import pytest

from streamback import layout

from conftest import ROOT

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("sbatch") is None, reason="Slurm is not installed (see tests/slurm/)"),
]


def test_profile_submits_jobs_to_slurm(run_snakemake, tmp_path):
    small = tmp_path / "small.yaml"
    small.write_text("drift: {steps: 200, coords: 256, seeds: [0]}\n")
    subprocess.run(["bash", str(ROOT / "tests" / "slurm" / "start-cluster.sh")], check=True, timeout=120)
    result = run_snakemake(
        layout.DRIFT_DIR / layout.DRIFT_FILES["summary"],
        "--profile", "slurm",  # resolved from the working directory, the repository root
        # site settings a real cluster would put in the profile: this one has no accounting
        "--slurm-no-account", "--slurm-status-command", "squeue",
        "--slurm-init-seconds-before-status-checks", "1",
        "--directory", tmp_path,
        "--configfile", small,  # merged over config/config.yaml
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "has been submitted with SLURM jobid" in result.stderr
    assert (tmp_path / layout.DRIFT_DIR / layout.DRIFT_FILES["summary"]).stat().st_size > 0
    slurm_logs = list((tmp_path / "logs" / "slurm").rglob("*.log"))
    assert slurm_logs, "the profile's slurm-logdir holds the job's Slurm log"


def _squeue(*fields):
    out = subprocess.run(["squeue", "-h", "-o", "|".join(fields)], capture_output=True, text=True, check=True).stdout
    return [line.split("|") for line in out.splitlines() if line]


def test_requeued_training_job_resumes_bit_identical(tmp_path):
    """`scontrol requeue` of a running train job (what preemption does): the trainer saves a
    checkpoint on SIGTERM and exits 75, Slurm runs the job again, the rerun resumes from that
    checkpoint, and the final weights equal those of an uninterrupted run bit for bit."""
    import sys
    import time

    import torch
    import yaml

    from streamback.config import DEFAULT_CONFIG, validate_config
    from streamback.model.weights import read_model

    run = "tiny-fat-short-streamback"
    small = {"data": {"synthetic": {"documents": 6000, "files": 1}},
             "train": {"runs": {"shapes": ["tiny-fat-short"], "blocks": ["streamback"], "streams": []},
                       "tokens": 200 * 16 * 128, "checkpoint": {"every": 10, "keep": 2}, "schedule": {"warmup_steps": 10, "decay_steps": 50}}}
    (tmp_path / "small.yaml").write_text(yaml.safe_dump(small))
    subprocess.run(["bash", str(ROOT / "tests" / "slurm" / "start-cluster.sh")], check=True, timeout=120)
    cmd = [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), str(layout.summary_file(run)), "--profile", "slurm",
           "--slurm-no-account", "--slurm-status-command", "squeue", "--slurm-init-seconds-before-status-checks", "1",
           "--directory", str(tmp_path), "--configfile", str(tmp_path / "small.yaml")]
    workflow = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        checkpoints = tmp_path / layout.checkpoint_dir(run)  # the recipe's live metrics, once the trainer made its directory
        deadline = time.monotonic() + 400
        while not any(len(p.read_text().splitlines()) >= 15 for d in layout.recipe_dirs(checkpoints)  # well into the run, past a checkpoint
                      if (p := d / layout.METRICS_FILE).exists()):
            assert workflow.poll() is None and time.monotonic() < deadline, "the train job did not start"
            time.sleep(0.5)
        (job,) = [jid for jid, workdir in _squeue("%i", "%Z") if workdir == str(tmp_path)]  # this workflow's only job now
        subprocess.run(["scontrol", "requeue", job], check=True)
        while not any(state == "PENDING" for jid, state in _squeue("%i", "%T") if jid == job):
            time.sleep(0.5)
        # Slurm holds a requeued job for about two minutes before it is eligible again: release it now
        subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], check=True)
        out, _ = workflow.communicate(timeout=400)
    finally:
        if workflow.poll() is None:
            workflow.kill()
    assert workflow.returncode == 0, out[-3000:]
    log = (tmp_path / "logs" / "train" / f"{run}.log").read_text()
    assert "SIGTERM received: saved the checkpoint of step" in log and f"Slurm job {job}" in log
    stopped = int(log.split("saved the checkpoint of step ")[1].split(";")[0])
    assert 0 < stopped < 200 and f"resuming from step {stopped}" in log

    # the same run, uninterrupted, outside Slurm
    from snakemake.utils import update_config

    from streamback.train.trainer import train

    config = yaml.safe_load(DEFAULT_CONFIG.read_text())
    update_config(config, small)  # as --configfile merges it
    config = validate_config(config)

    torch.set_num_threads(1)
    assert train(config["train"], config["model"], run, tmp_path / layout.tokens_dir(config["data"]), tmp_path / "whole", tmp_path / "whole-ckpt") == 0
    resumed, whole = read_model(tmp_path / layout.model_file(run)).state, read_model(tmp_path / "whole" / layout.MODEL_FILE).state
    assert all(torch.equal(resumed[k], whole[k]) for k in whole)


def test_the_whole_default_study_runs_through_slurm(tmp_path):
    """Every job of the default study (corpus, tokenize, the training runs, evaluation, analyses,
    drift, training curves, the study page), smaller as in test_study, goes through sbatch."""
    import re
    import sys

    import yaml

    from test_study import SMALL

    (tmp_path / "small.yaml").write_text(yaml.safe_dump(SMALL))
    subprocess.run(["bash", str(ROOT / "tests" / "slurm" / "start-cluster.sh")], check=True, timeout=120)
    cmd = [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "--profile", "slurm", "--slurm-no-account",
           "--slurm-status-command", "squeue", "--slurm-init-seconds-before-status-checks", "1",
           "--directory", str(tmp_path), "--configfile", str(tmp_path / "small.yaml")]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1500)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    steps = int(re.findall(r"(\d+) of (\d+) steps \(100%\) done", out)[-1][1])
    submitted = re.findall(r"has been submitted with SLURM jobid (\d+)", out)
    assert len(set(submitted)) == steps - 1, (len(submitted), steps)  # every job but `all`, which has nothing to run
    rules = set(re.findall(r"^(?:local)?rule (\w+):", out, re.M))
    assert {"corpus", "tokenize", "train", "evaluate", "benchmark_table", "analyze_layer_error", "analyze_loss_difference",
            "drift", "training_curves", "study_report"} <= rules
    assert (tmp_path / layout.STUDY_PAGE).stat().st_size > 100_000
    assert len(list((tmp_path / "logs" / "slurm").rglob("*.log"))) == len(set(submitted))
