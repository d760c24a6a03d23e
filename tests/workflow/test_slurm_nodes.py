"""`snakemake --profile slurm` trains a run on two nodes of the local Slurm cluster (`multinode`,
tests/slurm/start-cluster.sh): it matches one node, resumes after a requeue and across node counts.

.ci/run installs Debian's slurm-wlm and munge and starts the cluster; on a machine without Slurm
these tests are skipped.
"""

import re
import shutil
import subprocess
import time

import yaml

from streamback import layout

from conftest import ROOT, SLURM_SITE, snakemake_command, start_slurm
from helpers.slurm import SLURM as pytestmark  # noqa: F401  (the module's marks)
from helpers.slurm import squeue as _squeue

# ---- a run on two nodes --------------------------------------------------------------------------

MICRO_RUN = "micro-streamback"
MICRO_STEPS = 40


def _micro_workdir(tokens, root, **resources):
    """A working directory with the `tokens` shards (copied after their input, so newer: tokenize
    has nothing to do) and a config training a micro model for 40 steps, every 5th step's
    checkpoint kept."""
    root.mkdir()
    shutil.copy(tokens.parent / "part.parquet", root / "part.parquet")
    shutil.copytree(tokens, root / "tokens", copy_function=shutil.copy)
    config = {
        "data": {
            "source": "local",
            "local": {"files": [str(root / "part.parquet")]},
            "dir": str(root / "tokens"),
            "tokenizer": {"vocab_size": 300},
            "val_fraction": 0.1,
            "shard_tokens": 20000,
            "processes": 1,
        },  # as conftest's tokens
        "model": {
            "shapes": {"micro": {"n_layers": 2, "dim": 32, "n_heads": 2, "n_kv_heads": 1, "multiple_of": 16}},
            "max_seq_len": 64,
        },
        "train": {
            "runs": {"shapes": ["micro"], "blocks": ["streamback"], "streams": []},
            "tokens": MICRO_STEPS * 8 * 32,
            "seq_len": 32,
            "batch_size": 8,
            "micro_batch_size": 4,
            "schedule": {"warmup_steps": 4, "decay_steps": 8},
            "checkpoint": {"every": 5, "keep": 10},
            "log": {"every": 10, "stream_every": 10, "val_every": 20, "val_sequences": 16},
            "resources": {"threads": 1, "mem_mb": 1000, "runtime": 20, **resources},
        },
    }
    (root / "micro.yaml").write_text(yaml.safe_dump(config))
    return root


TWO_NODES = {"nodes": 2, "processes": 1}
ONE_NODE = {"nodes": 1, "processes": 2}


def _snakemake(root, partition=None):
    """Snakemake on the micro run: locally, or through Slurm with the train job and its preflight in `partition`
    (tests/slurm/start-cluster.sh's `multinode` holds node1 and node2)."""
    # the train job and its preflight, which runs on the same resources, in `partition`
    resources = [f"{rule}:slurm_partition={partition}" for rule in ("preflight_run", "train")]
    how = ["--profile", "slurm", *SLURM_SITE, "--set-resources", *resources] if partition else ["--cores", "2"]
    cmd = snakemake_command(
        layout.summary_file(MICRO_RUN), *how, "--directory", root, "--configfile", root / "micro.yaml"
    )
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _finish(workflow, root):
    """Wait for Snakemake on the micro run to succeed; returns the run's train log."""
    try:
        out, _ = workflow.communicate(timeout=600)
    finally:
        if workflow.poll() is None:
            workflow.kill()
    assert workflow.returncode == 0, out[-3000:]
    return (root / "logs" / "train" / f"{MICRO_RUN}.log").read_text()


def _resume_from(source, root, step):
    """Give `root` the checkpoints of `source`'s run up to `step`, so that its run resumes there."""
    shutil.copytree(source / layout.checkpoint_dir(MICRO_RUN), root / layout.checkpoint_dir(MICRO_RUN))
    (recipe,) = layout.recipe_dirs(root / layout.checkpoint_dir(MICRO_RUN))
    from streamback.train.checkpoint import list_checkpoints

    for at, path in list_checkpoints(recipe):
        if at > step:
            shutil.rmtree(path)


def _weights(root):
    from streamback.model.weights import read_model

    return read_model(root / layout.model_file(MICRO_RUN)).state


def _same_weights(a, b):
    """As tests/unit/test_train.py judges FSDP2 on two processes against one: reduction order aside."""
    import torch

    # derived: as test_train_end_to_end's FSDP2 check: the same kernels on the same micro-batch shapes, and a sum of
    # two fp32 terms is order-free; 1e-5 at weights ~0.1 is ~1000 fp32 ulps, far below a step's update
    return a.keys() == b.keys() and all(torch.allclose(a[k], b[k], rtol=0, atol=1e-5) for k in a)


def test_a_run_on_two_nodes_matches_one_node_and_resumes_across_them_and_after_a_requeue(tokens, tmp_path):
    """`nodes: 2` on the CPU (one gloo process per node): srun starts a torchrun on node1 and one
    on node2, which meet at a c10d rendezvous on node1 and train with FSDP2. The run ends with the
    weights of the same run on one node with two processes; `scontrol requeue` midway makes both
    ranks save and stop, and the requeued job resumes on both nodes; a 2-node checkpoint resumes on
    one node and a 1-node checkpoint on two, each again to the same weights."""
    start_slurm()
    one = _micro_workdir(tokens, tmp_path / "one", **ONE_NODE)
    assert "2 process(es) x 1 micro-batches" in _finish(_snakemake(one), one)
    reference = _weights(one)

    two = _micro_workdir(tokens, tmp_path / "two", **TWO_NODES)
    workflow = _snakemake(two, "multinode")
    try:
        checkpoints = two / layout.checkpoint_dir(MICRO_RUN)
        deadline = time.monotonic() + 600  # its preflight job on the two nodes runs first
        while not any(
            len(p.read_text().splitlines()) >= 15
            for d in layout.recipe_dirs(checkpoints)
            if (p := d / layout.METRICS_FILE).exists()
        ):
            assert workflow.poll() is None, workflow.communicate()[0][-3000:]
            assert time.monotonic() < deadline, "the 2-node train job did not get going"
            time.sleep(0.5)
        (job,) = [jid for jid, workdir in _squeue("%i", "%Z") if workdir == str(two)]
        steps = subprocess.run(
            ["squeue", "-h", "-s", "-j", job, "-o", "%i|%N"], capture_output=True, text=True, check=True
        ).stdout
        assert f"{job}.0|node[1-2]" in steps.split(), steps  # the torchruns' step, one task on each node
        subprocess.run(["scontrol", "requeue", job], check=True)
        while not any(state == "PENDING" for jid, state in _squeue("%i", "%T") if jid == job):
            time.sleep(0.5)
        subprocess.run(
            ["scontrol", "update", f"JobId={job}", "StartTime=now"], check=True
        )  # Slurm would hold it ~2 min
    except BaseException:
        workflow.kill()
        raise
    log = _finish(workflow, two)
    assert log.count(f"Slurm job {job}") == 2 and "SIGTERM received: saved the checkpoint of step" in log
    stopped = int(log.split("saved the checkpoint of step ")[1].split(";")[0])
    assert (
        10 < stopped < MICRO_STEPS
        and f"resuming from step {stopped}:" in log
        and "2 process(es) x 1 micro-batches" in log
    )
    assert _same_weights(_weights(two), reference)

    # a checkpoint the 2-node job wrote before it was requeued, resumed on one node (the default
    # partition's, two processes on its CPUs); a 1-node one on two nodes; both jobs at the same time
    back, across = tmp_path / "back", tmp_path / "across"
    _resume_from(two, _micro_workdir(tokens, back, **ONE_NODE), 10)
    _resume_from(one, _micro_workdir(tokens, across, **TWO_NODES), 10)
    workflows = {across: _snakemake(across, "multinode"), back: _snakemake(back, "debug")}
    try:
        for root, nodes in ((back, "1"), (across, "2")):
            attempt = _finish(workflows[root], root).split("=== attempt started")[
                -1
            ]  # the log came with the checkpoints
            assert "resuming from step 10:" in attempt and "2 process(es)" in attempt
            job = re.search(r"Slurm job (\d+)", attempt).group(1)
            allocation = subprocess.run(
                ["scontrol", "-o", "show", "job", job], capture_output=True, text=True, check=True
            ).stdout
            assert f" NumNodes={nodes} " in allocation and " NumCPUs=2 " in allocation, (
                allocation
            )  # threads x processes per node
            assert _same_weights(_weights(root), reference), root.name
    finally:
        for workflow in workflows.values():
            if workflow.poll() is None:
                workflow.kill()
