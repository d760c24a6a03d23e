"""Rule `train`: the default recipe trains its tiny models, each ending well below the unigram baseline; the launch
lines the paper config gives Slurm; the requeue of a train job under torchrun."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from streamback import layout
from streamback.config import load_config
from streamback.data.shards import TokenDataset
from streamback.model import execution
from streamback.runs import train_steps
from streamback.train import trainer
from streamback.train.metrics import read_metrics

from conftest import ROOT

BASELINES = [f"{shape}-baseline" for shape in ("tiny-skinny-tall", "tiny-medium", "tiny-fat-short")]  # of seed 0


def unigram_entropy(data_dir) -> float:
    """Entropy (nats) of the train split's token frequencies: the loss of the best context-free model."""
    train = TokenDataset(data_dir, "train")
    counts = np.bincount(train.read(0, train.num_tokens), minlength=train.vocab_size)
    p = counts[counts > 0] / train.num_tokens
    return float(-(p * np.log(p)).sum())


@pytest.mark.slow
def test_default_config_trains_its_models(study, tmp_path):
    """The default recipe itself (config/config.yaml: its steps, schedule, batch and learning rate) trains the
    three shapes' baseline runs of seed 0, each ending well below the unigram baseline, with bf16 on fp32 kernels
    forced (`cpu_bf16: emulated`, decided once for the process as `cli.main` does). In this process, on the shared
    study's corpus (4,000 stories; the runs read their 66K tokens whatever the corpus holds): that study runs the
    default config's rules through Snakemake, the corpus to the page, on fewer steps; test_hand_run checks that a
    rule's job and a hand run train the same bits and that `cpu_bf16` reaches the job."""
    cfg = load_config(ROOT / "config" / "config.yaml")
    data = study.root / layout.tokens_dir({"corpus": "synthetic"})
    unigram = unigram_entropy(data)
    steps = train_steps(cfg["train"])
    with execution.applied(execution.decide("emulated", threads=1)):
        for run in BASELINES:
            out, checkpoints = tmp_path / run / "out", tmp_path / run / "ckpt"
            assert trainer.train(cfg["train"], cfg["model"], run, data, out, checkpoints) == 0
            summary = json.loads((out / "summary.json").read_text())
            assert summary["steps"] == steps and summary["seed"] == 0
            assert summary["kernels"] == "bf16 on fp32 kernels on cpu" and not summary["kernel_changes"], summary
            assert [r["step"] for r in read_metrics(out / layout.METRICS_FILE)] == list(range(1, steps + 1))
            assert summary["final_val_loss"] < unigram - 1.0, (run, summary["final_val_loss"], unigram)
            assert (out / layout.MODEL_FILE).stat().st_size > 0
            (recipe,) = layout.recipe_dirs(checkpoints)
            assert (recipe / f"step_{steps:09d}" / ".metadata").exists()


NODES = (
    r'nodes=\$\(squeue -h -o %N -j "\$\{SLURM_JOB_ID:\?[^}]*\}"\); head=\$\(scontrol show hostnames "\$nodes" \| sed '
    r"-n 1p\); "
    r'head=\$\(scontrol -o show node "\$head" \| sed -n "s/\.\* NodeAddr=\\\(\[\^ \]\*\\\)\.\*/\\1/p"\); '
)
TORCHRUN = (
    r"PET_SIGNALS_TO_HANDLE=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1 TORCH_ELASTIC_SHUTDOWN_TIMEOUT=300 \S+ -m "
    r"torch.distributed.run "
)


@pytest.mark.parametrize(
    "resources, expect",
    [
        (
            {"nodes": 1},
            [r"--launch '[^']*--nproc-per-node 8 --standalone -m streamback' ", r"resources: .*gpu=8, cpus_per_gpu=8"],
        ),
        (
            {"nodes": 2},
            [
                NODES
                + r"srun --nodes 2 --ntasks 2 --ntasks-per-node 1 --cpus-per-task 64 --gpus-per-task 8 "
                + r"--kill-on-bad-exit=1 env "
                + TORCHRUN
                + r'--nproc-per-node 8 --nnodes 2 --rdzv-backend c10d --rdzv-endpoint "\$head:29500" '
                + r'--rdzv-id "\$SLURM_JOB_ID" -m streamback\' ',
                (
                    r"resources: .*nodes=2, cpus_per_task=64, tasks=2, mpi=srun, "
                    r"slurm_extra=--gpus-per-task=8 --signal=URG@300"
                ),
            ],
        ),
        # on the CPU: `processes` gloo processes per node, threads x processes CPUs
        (
            {"gpus": 0, "processes": 2, "threads": 3},
            [
                r"--launch 'OMP_NUM_THREADS=3 " + TORCHRUN + r"--nproc-per-node 2 --standalone -m streamback' ",
                r"resources: .*nodes=1(?!.*gpu)(?!.*cpus_per_task)",
            ],
        ),
        (
            {"gpus": 0, "processes": 2, "threads": 3, "nodes": 2},
            [
                NODES
                + r"srun --nodes 2 --ntasks 2 --ntasks-per-node 1 --cpus-per-task 6 --kill-on-bad-exit=1 env "
                + r"OMP_NUM_THREADS=3 "
                + TORCHRUN
                + r"--nproc-per-node 2 --nnodes 2 --rdzv-backend c10d",
                # no sbatch options of its own: the stop signal's alone (an unmeasured run's lead: no preflight yet)
                r"resources: .*nodes=2, cpus_per_task=6, tasks=2, mpi=srun, slurm_extra=--signal=URG@300\n",
            ],
        ),
        ({"gpus": 0, "threads": 2}, [r"""--launch 'OMP_NUM_THREADS=2 "\$STREAMBACK_PYTHON" -m streamback' """]),
    ],
    ids=["gpu-1-node", "gpu-2-nodes", "cpu-1-node", "cpu-2-nodes", "cpu-1-process"],
)
def test_paper_runs_launch_torchrun_across_their_allocation(run_snakemake, tmp_path, resources, expect):
    extra = tmp_path / "nodes.yaml"
    extra.write_text(yaml.safe_dump({"train": {"resources": resources}}))
    result = run_snakemake(
        layout.summary_file("fat-short-streamback"),
        "-n",
        "-p",
        "--profile",
        "slurm",
        "--directory",
        tmp_path,
        "--configfile",
        ROOT / "config" / "paper.yaml",
        extra,
    )
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-3000:]
    job = out[out.index("rule train:") :]
    for pattern in expect:
        assert re.search(pattern, job), pattern
    assert "streamback train-attempt --launch" in job and "--run-name fat-short-streamback" in job
    assert f"--checkpoints {layout.checkpoint_dir('fat-short-streamback')} " in job


def _job_processes(directory, snakemake: int) -> dict[int, list[bytes]]:
    """{pid: argv} of the processes of the job Snakemake runs in `directory` (not Snakemake itself)."""
    found = {}
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and int(proc.name) != snakemake and os.readlink(proc / "cwd") == str(directory):
                found[int(proc.name)] = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
    return found


@pytest.mark.slow
def test_requeue_status_under_torchrun_and_the_log_of_every_attempt(run_snakemake, tokens, tmp_path):
    """Rule train with 2 CPU processes (`processes: 2`: torchrun, gloo): SIGUSR1 to torchrun makes the
    trainers save and exit 75, which torchrun reports as 1; the rule exits 75 all the same. The
    rerun resumes, and logs/train/<run>.log holds both attempts (Snakemake deletes a job's log
    before each attempt; the rule keeps them in results/checkpoints/<run>/train.log)."""
    shutil.copy(tokens.parent / "part.parquet", tmp_path / "part.parquet")
    shutil.copytree(tokens, tmp_path / "tokens")  # newer than its input: the tokenize rule has nothing to do
    config = {
        "data": {
            "source": "local",
            "local": {"files": [str(tmp_path / "part.parquet")]},
            "dir": str(tmp_path / "tokens"),
        },
        "model": {
            "shapes": {"micro": {"n_layers": 2, "dim": 32, "n_heads": 2, "n_kv_heads": 1, "multiple_of": 16}},
            "max_seq_len": 64,
        },
        "train": {
            "runs": {"shapes": ["micro"], "blocks": ["streamback"], "streams": []},
            "tokens": 40 * 8 * 32,
            "seq_len": 32,
            "batch_size": 8,
            "micro_batch_size": 4,
            "schedule": {"warmup_steps": 4, "decay_steps": 8},
            "checkpoint": {"every": 5, "keep": 2},
            "log": {"every": 10, "stream_every": 10, "val_every": 20, "val_sequences": 16},
            "resources": {"processes": 2, "threads": 1},
        },
    }
    (tmp_path / "micro.yaml").write_text(yaml.safe_dump(config))
    target = layout.summary_file("micro-streamback")
    args = (target, "--cores", "2", "--directory", tmp_path, "--configfile", tmp_path / "micro.yaml")
    snakemake = subprocess.Popen(
        [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), *map(str, args)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    checkpoints = tmp_path / layout.checkpoint_dir(
        "micro-streamback"
    )  # the recipe's live metrics, once the trainer made its directory
    deadline = time.time() + 300
    while not any(
        len(p.read_text().splitlines()) >= 8
        for d in layout.recipe_dirs(checkpoints)
        if (p := d / layout.METRICS_FILE).exists()
    ):
        assert snakemake.poll() is None and time.time() < deadline, snakemake.communicate()[0][-3000:]
        time.sleep(0.05)
    job = _job_processes(tmp_path, snakemake.pid)  # the rule's shell, torchrun and its two workers
    assert sum(argv[1:3] == [b"-m", b"torch.distributed.run"] for argv in job.values()) == 1, job
    for pid in job:  # as Slurm signals every process of a job (sbatch --signal=USR1@<s>, or SIGTERM at its time limit)
        os.kill(pid, signal.SIGUSR1)
    out, _ = snakemake.communicate(timeout=300)
    assert snakemake.returncode != 0, out[-3000:]
    log = tmp_path / "logs" / "train" / "micro-streamback.log"
    first = log.read_text()
    assert "exiting with status 75 to be resumed" in first and "2 process(es)" in first
    assert first.rstrip().endswith("=== attempt ended with status 75 (the launcher returned 1)"), first[-2000:]

    result = run_snakemake(*args, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    story = log.read_text()
    assert story.startswith(first) and story.count("=== attempt started") == 2
    assert "resuming from step" in story.split("=== attempt started")[2]
    assert story.rstrip().endswith("=== attempt ended with status 0 (the launcher returned 0)")
    assert os.path.samefile(log, tmp_path / layout.train_log("micro-streamback"))
    assert json.loads((tmp_path / target).read_text())["steps"] == 40
    assert not list((tmp_path / layout.checkpoint_dir("micro-streamback")).glob(".exit-status*"))
