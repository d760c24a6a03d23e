"""`snakemake --profile slurm` submits real jobs to a local Slurm cluster: the whole default
study and a train job requeued while it runs (a run trained on two nodes: test_slurm_nodes.py, so
that pytest-xdist's workers run the two modules at once).

.ci/run installs Debian's slurm-wlm and munge and starts the cluster with
tests/slurm/start-cluster.sh (a node for every job, and two more slurmd "nodes" on the same host
for the 2-node run); on a machine without Slurm these tests are skipped.
"""

import re
import subprocess

from streamback import layout

from conftest import ROOT, SLURM_SITE, snakemake_command, start_slurm
from helpers.slurm import SLURM as pytestmark  # noqa: F401  (the module's marks)
from helpers.slurm import squeue as _squeue


def test_requeued_training_job_resumes_bit_identical(run_snakemake, tmp_path):
    """`scontrol requeue` of a running train job (what preemption does): the trainer saves a
    checkpoint on SIGTERM and exits 75, Slurm runs the job again, the rerun resumes from that
    checkpoint, and the final weights equal those of an uninterrupted run bit for bit."""
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
            "tokens": 100 * 4 * 128,
            "checkpoint": {"every": 10, "keep": 2},
            "schedule": {"warmup_steps": 10, "decay_steps": 50},
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
    try:
        checkpoints = tmp_path / layout.checkpoint_dir(
            run
        )  # the recipe's live metrics, once the trainer made its directory
        deadline = time.monotonic() + 400
        while not any(
            len(p.read_text().splitlines()) >= 15
            for d in layout.recipe_dirs(checkpoints)  # well into the run, past a checkpoint
            if (p := d / layout.METRICS_FILE).exists()
        ):
            assert workflow.poll() is None and time.monotonic() < deadline, "the train job did not start"
            time.sleep(0.5)
        (job,) = [
            jid for jid, workdir in _squeue("%i", "%Z") if workdir == str(tmp_path)
        ]  # this workflow's only job now
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
    assert 0 < stopped < 100 and f"resuming from step {stopped}" in log

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
    tables = {"preflight", "eval_tasks", "benchmark_table", "training_curves", "seed_variance", "depth", "study_report"}
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
