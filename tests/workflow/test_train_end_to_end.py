"""The end-to-end half of test_train.py (commands run as processes, compiled or multi-process runs, Snakemake): the same
subjects, at the pace of whole runs."""

import random
import shutil
import signal
import sys

import numpy as np
import pytest
import torch

from streamback import layout
from streamback.model.weights import read_model
from streamback.train import checkpoint as ckpt
from streamback.train import trainer as train_module
from streamback.train.metrics import read_metrics

from helpers.train import (  # noqa: F401  (reference: the module's reference run, a fixture)
    STEPS,
    cli,
    deterministic,
    final_weights,
    live_recipe,
    recipe_of,
    reference,
    resume_matches,
    run_inprocess,
    wait_for_step,
)

# kernel-sensitive: CI runs these again on the other kernel path (.ci/run)
pytestmark = pytest.mark.kernels


@pytest.mark.slow
def test_sigkill_at_a_random_step_then_rerun_equals_uninterrupted(reference, tokens, tmp_path):
    kill_at = random.randint(6, STEPS - 4)
    proc = cli(tokens, tmp_path)
    wait_for_step(proc, live_recipe(reference, tmp_path) / "metrics.jsonl", kill_at)
    proc.kill()
    proc.communicate()
    assert proc.returncode == -signal.SIGKILL, f"killed at step {kill_at}"
    assert (
        ckpt.list_checkpoints(live_recipe(reference, tmp_path)) and not (tmp_path / "out" / layout.MODEL_FILE).exists()
    )
    resume_matches(reference, tokens, tmp_path)


@pytest.mark.slow
def test_sigterm_saves_and_exits_resumable(reference, tokens, tmp_path):
    proc = cli(tokens, tmp_path)
    live = live_recipe(reference, tmp_path)
    wait_for_step(proc, live / "metrics.jsonl", 3)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == train_module.EXIT_REQUEUE, err
    logged = read_metrics(live / "metrics.jsonl")[-1]["step"]
    assert logged < STEPS and f"saved the checkpoint of step {logged}" in err
    assert ckpt.list_checkpoints(live)[-1][0] == logged  # the last completed step
    resume_matches(reference, tokens, tmp_path)


def test_a_changed_recipe_trains_beside_the_old_one_which_resumes_at_its_end(
    reference, tokens, tmp_path, capsys, monkeypatch
):
    """A changed learning rate is another run: it trains from its first step in a directory of its
    own and leaves the reference recipe's checkpoints as they were. Asked for again (what
    `snakemake -R train` does), the reference recipe resumes at its end, says so, and writes the
    same weights and metrics. `streamback checkpoints` says how the two differ; `--prune` keeps
    the recipe the run's model came from."""
    from streamback.cli import main

    shutil.copytree(reference["root"] / "ckpt", tmp_path / "ckpt")
    old = recipe_of(tmp_path)
    untouched = {p: p.stat().st_mtime_ns for p in old.rglob("*")}
    assert run_inprocess(tokens, tmp_path, optimizer={"lr": 1e-3}) == 0
    new = next(p for p in layout.recipe_dirs(tmp_path / "ckpt") if p != old)
    err = capsys.readouterr().err
    assert (
        "starting:" in err
        and f"checkpoints in {new}" in err
        and f"this run's other recipes are kept ({old.name})" in err
    )
    assert {p: p.stat().st_mtime_ns for p in old.rglob("*")} == untouched
    assert [s for s, _ in ckpt.list_checkpoints(new)] == [25, 30]
    assert not torch.equal(
        final_weights(tmp_path / "out" / layout.MODEL_FILE)["output.weight"], reference["model"]["output.weight"]
    )

    assert run_inprocess(tokens, tmp_path) == 0
    err = capsys.readouterr().err
    assert (
        f"resuming from step {STEPS}:" in err
        and "this recipe was trained to its end" in err
        and f"delete {old} and rerun" in err
    )
    model = final_weights(tmp_path / "out" / layout.MODEL_FILE)
    assert all(torch.equal(model[k], reference["model"][k]) for k in model)
    assert deterministic(read_metrics(tmp_path / "out" / layout.METRICS_FILE)) == deterministic(reference["metrics"])

    run = "micro-streamback"  # where the command looks: results/checkpoints/<run>, results/runs/<run>
    monkeypatch.chdir(tmp_path)
    for link, target in ((layout.checkpoint_dir(run), tmp_path / "ckpt"), (layout.run_dir(run), tmp_path / "out")):
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(target)
    assert main(["checkpoints"]) == 0
    out = capsys.readouterr().out
    assert f"  {old.name}  step 30 of 30" in out and f"in use: the model of {layout.summary_file(run)}" in out
    assert f"  {new.name}  step 30 of 30" in out and "differs in optimizer.lr 0.001 (in use: 0.003)" in out
    assert main(["checkpoints", "--prune"]) == 0
    assert f"removed {layout.checkpoint_dir(run) / new.name}" in capsys.readouterr().out
    assert layout.recipe_dirs(tmp_path / "ckpt") == [old]


@pytest.mark.slow
def test_fsdp2_on_two_gloo_processes_matches_one(reference, tokens, tmp_path):
    """torchrun, 2 CPU processes, FSDP2 (bf16 parameters, fp32 reduction) vs 1 process.

    Each rank's micro-batch is one of the single process's two, and FSDP2's mean of the two
    ranks' gradients is the single process's sum of halves, so the runs agree (here bit for bit;
    the tolerance leaves room for reduction order). The trainer's stream-dtype watch stops the
    run if FSDP2's input cast turned the fp32 StreamBack stream into bf16 at any block.
    Midway, SIGUSR1 to torchrun (as the rule launches it) makes both ranks save and stop; two
    processes resume from their sharded checkpoint (through the restricted reader, dcp_safe) and
    are stopped again; one process then resumes from theirs and finishes the run.
    """
    torchrun = (sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2")
    forward = {
        "PET_SIGNALS_TO_HANDLE": "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1",
        "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "120",
    }  # as rule train
    live = live_recipe(reference, tmp_path)  # micro_batch_size and processes are not the recipe
    ref = reference["metrics"]
    for stop_at in (8, 16):
        proc = cli(tokens, tmp_path, launcher=torchrun, env=forward)
        wait_for_step(proc, live / "metrics.jsonl", stop_at)
        proc.send_signal(signal.SIGUSR1)
        _, err = proc.communicate(timeout=300)
        assert proc.returncode != 0 and f"exiting with status {train_module.EXIT_REQUEUE}" in err, err[-3000:]
        assert "2 process(es) x 1 micro-batches" in err and "stream fp32" in err
        assert stop_at == 8 or "resuming from step" in err
        stopped = read_metrics(live / "metrics.jsonl")
        assert ckpt.list_checkpoints(live)[-1][0] == stopped[-1]["step"] < STEPS
        # measured: 0 (bit for bit) on an AMD EPYC (docstring); derived: two ranks' fp32 sums of two terms are
        # order-free, and 1e-5 at losses ~6 is ~20 fp32 ulps
        assert np.allclose([r["loss"] for r in stopped], [r["loss"] for r in ref[: len(stopped)]], rtol=0, atol=1e-5)

    proc = cli(tokens, tmp_path)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0 and "1 process(es) x 2 micro-batches" in err, err[-3000:]
    records = read_metrics(tmp_path / "out" / layout.METRICS_FILE)
    assert [r["step"] for r in records] == [r["step"] for r in ref]
    # measured: 0 (bit for bit) there, as above; margin ~20 fp32 ulps at losses ~6
    assert np.allclose([r["loss"] for r in records], [r["loss"] for r in ref], rtol=0, atol=1e-5)
    assert records[-1]["val_loss"] == pytest.approx(ref[-1]["val_loss"], abs=1e-5)
    # the shadow (fp64 stream; the fp32 StreamBack run's is the shadow's to 1e-6) runs through FSDP2's forward alike
    shadows = [(r["shadow_absmax"], r["shadow_loss"]) for r in stopped if "shadow_loss" in r]
    assert (
        shadows
        # derived: the fp64 shadow is the fp32 stream's to 1e-6 (one fp32 rounding a layer, docstring); 1e-5 is 10x that
        and np.allclose(shadows[0][0], ref[3]["shadow_absmax"], rtol=1e-5)
        and abs(shadows[0][1] - ref[3]["shadow_loss"]) < 1e-5
    )
    # derived: an fp32 stream's gap to its fp64 shadow is a few fp32 roundings (2^-24 = 6e-8) per layer; 1e-5 holds 100+
    assert max(g for r in stopped if "shadow_gap" in r for g in r["shadow_gap"]) < 1e-5
    model = final_weights(tmp_path / "out" / layout.MODEL_FILE)
    for key, value in reference["model"].items():
        # measured: 0 (bit for bit) there; margin: 1e-5 at weights ~0.1 is ~1000 fp32 ulps, far below one step's update
        # (lr 3e-3)
        assert torch.allclose(model[key], value, rtol=0, atol=1e-5), key


def test_activation_checkpointing_and_the_reversible_stream_train_the_same_model(reference, tokens, tmp_path):
    """Recomputing blocks changes nothing; rebuilding the fp32 stream by subtraction only rounding."""
    ref = deterministic(reference["metrics"])
    assert run_inprocess(tokens, tmp_path / "ac", activation_checkpointing=True) == 0
    assert deterministic(read_metrics(tmp_path / "ac" / "out" / layout.METRICS_FILE)) == ref
    assert run_inprocess(tokens, tmp_path / "rev", reversible=True, activation_checkpointing=True) == 0
    records = read_metrics(tmp_path / "rev" / "out" / layout.METRICS_FILE)
    assert records[0]["loss"] == ref[0]["loss"]  # the forward pass is the plain one
    # derived: subtraction rebuilds each fp32 residual to one fp32 ulp; a ulp can flip a bf16 rounding of a delta (2^-8
    # of it): 1e-3 over 30 steps
    assert np.allclose([r["loss"] for r in records], [r["loss"] for r in ref], rtol=0, atol=1e-3)
    assert read_model(tmp_path / "rev" / "out" / layout.MODEL_FILE).args.reversible
