"""Rule `train`: the default config trains its six tiny models through Snakemake on 2 cores and
each ends well below the unigram baseline; the launch lines the paper config gives Slurm."""

import json
import re

import numpy as np
import pytest
import yaml

from streamback import layout
from streamback.data.shards import TokenDataset
from streamback.train.metrics import read_metrics

from conftest import ROOT

SIX = [f"{shape}-{block}" for shape in ("tiny-skinny-tall", "tiny-medium", "tiny-fat-short") for block in ("baseline", "streamback")]


def unigram_entropy(data_dir) -> float:
    """Entropy (nats) of the train split's token frequencies: the loss of the best context-free model."""
    train = TokenDataset(data_dir, "train")
    counts = np.bincount(train.read(0, train.num_tokens), minlength=train.vocab_size)
    p = counts[counts > 0] / train.num_tokens
    return float(-(p * np.log(p)).sum())


@pytest.mark.slow
def test_default_config_trains_the_six_models(run_snakemake, tmp_path):
    """`snakemake --cores 2` on the six runs of config/config.yaml, with a smaller corpus (6,000
    stories instead of 40,000; the runs read their 123K tokens whatever the corpus holds)."""
    small = tmp_path / "small.yaml"
    small.write_text(yaml.safe_dump({"data": {"synthetic": {"documents": 6000, "files": 1}}}))
    targets = [layout.summary_file(run) for run in SIX]
    result = run_snakemake(*targets, "--cores", "2", "--directory", tmp_path,
                           "--configfile", ROOT / "config" / "config.yaml", small, timeout=1200)
    assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-3000:]
    unigram = unigram_entropy(tmp_path / layout.tokens_dir({"corpus": "synthetic"}))
    for run in SIX:
        out = tmp_path / layout.run_dir(run)
        summary = json.loads((out / "summary.json").read_text())
        assert summary["steps"] == 60
        assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == list(range(1, 61))
        assert summary["final_val_loss"] < unigram - 1.0, (run, summary["final_val_loss"], unigram)
        assert (out / layout.MODEL_FILE).stat().st_size > 0
        assert (tmp_path / layout.checkpoint_dir(run) / "step_000000060" / ".metadata").exists()


@pytest.mark.parametrize(
    "nodes, expect",
    [
        (1, [r"--nproc-per-node 8 --standalone -m streamback train", r"resources: .*gpu=8, cpus_per_gpu=8"]),
        (2, [r'head=\$\(scontrol show hostnames "\$SLURM_JOB_NODELIST" \| sed -n 1p\); srun --kill-on-bad-exit=1 env '
             r"PET_SIGNALS_TO_HANDLE=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1 ",
             r'--nnodes 2 --rdzv-backend c10d --rdzv-endpoint "\$head:29500"',
             r"resources: .*nodes=2, cpus_per_task=64, tasks=2, mpi=srun, slurm_extra=--gpus-per-task=8"]),
    ],
)
def test_paper_runs_launch_torchrun_across_their_allocation(run_snakemake, tmp_path, nodes, expect):
    extra = tmp_path / "nodes.yaml"
    extra.write_text(yaml.safe_dump({"train": {"resources": {"nodes": nodes}}}))
    result = run_snakemake(layout.summary_file("fat-short-streamback"), "-n", "-p", "--profile", "slurm",
                           "--directory", tmp_path, "--configfile", ROOT / "config" / "paper.yaml", extra)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-3000:]
    job = out[out.index("rule train:"):]
    for pattern in expect:
        assert re.search(pattern, job), pattern
    assert "--run-name fat-short-streamback" in job and f"--checkpoints {layout.checkpoint_dir('fat-short-streamback')}" in job
