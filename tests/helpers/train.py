"""The micro training runs several test modules share: their config, the run in this process or as
`streamback train`, the module's uninterrupted reference run, and checks of a resumed run against it."""

import os
import subprocess
import sys
import time

import pytest
import torch
import yaml

from streamback import layout
from streamback.config import validate_config
from streamback.model.weights import read_model
from streamback.train import checkpoint as ckpt
from streamback.train import trainer as train_module
from streamback.train.metrics import DETERMINISTIC, read_metrics

from conftest import ROOT

STEPS = 30
MODEL = {
    "shapes": {"micro": {"n_layers": 2, "dim": 32, "n_heads": 2, "n_kv_heads": 1, "multiple_of": 16}},
    "max_seq_len": 64,
}
TRAIN = {
    "runs": {"shapes": ["micro"], "blocks": ["baseline", "streamback"], "streams": ["bf16_sr"]},
    "seed": 7,
    "tokens": STEPS * 8 * 32,
    "seq_len": 32,
    "batch_size": 8,
    "micro_batch_size": 4,  # two micro-batches per step on one process, one each on two
    "optimizer": {"lr": 3e-3},
    "schedule": {"warmup_steps": 4, "decay_steps": 8},
    "checkpoint": {"every": 5, "keep": 2},
    "log": {"every": 10, "stream_every": 4, "shadow_every": 4, "val_every": 10, "val_sequences": 16},
}


def config(**train_overrides) -> dict:
    cfg = validate_config({"model": MODEL, "train": {**TRAIN, **train_overrides}})
    return cfg


def deterministic(records):
    return [{k: r[k] for k in DETERMINISTIC if k in r} for r in records]


def final_weights(path):
    return read_model(path).state


def recipe_of(root):
    """The one recipe directory of the run trained with root / "ckpt" as its checkpoint directory."""
    (only,) = layout.recipe_dirs(root / "ckpt")
    return only


def run_inprocess(data_dir, root, run="micro-streamback", **overrides):
    cfg = config(**overrides)
    torch.set_num_threads(1)
    return train_module.train(cfg["train"], cfg["model"], run, data_dir, root / "out", root / "ckpt")


def cli(data_dir, root, run="micro-streamback", launcher=(sys.executable,), env=None, **overrides):
    """Start `streamback train` in a subprocess (the way the rule does)."""
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(config(**overrides)))
    cmd = [
        *launcher,
        "-m",
        "streamback",
        "train",
        "--config",
        str(path),
        "--run-name",
        run,
        "--data",
        str(data_dir),
        "--outdir",
        str(root / "out"),
        "--checkpoints",
        str(root / "ckpt"),
        "--tensorboard",
        str(root / "tb"),
        "--threads",
        "1",
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.fixture(scope="session")  # read-only: every module that imports it reads the one made
def reference(tokens, tmp_path_factory):
    """An uninterrupted run of micro-streamback: its metrics and final parameters."""
    root = tmp_path_factory.mktemp("reference")
    assert run_inprocess(tokens, root) == 0
    return {
        "root": root,
        "metrics": read_metrics(root / "out" / layout.METRICS_FILE),
        "model": final_weights(root / "out" / layout.MODEL_FILE),
    }


def linear_state(seed):
    """A Linear(4, 3) after one AdamW step from `seed`: the model, its optimizer and their TrainState."""
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    return model, optimizer, ckpt.TrainState(model, optimizer)


def wait_for_step(proc, metrics, step, timeout=120):
    """Return once the running `proc` has logged `step` lines of `metrics`; fail if it ends first or after
    `timeout` s."""
    start = time.time()
    while time.time() - start < timeout:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= step:
            return
        assert proc.poll() is None, f"the run ended before step {step}: {proc.communicate()[1][-2000:]}"
        time.sleep(0.005)
    raise AssertionError(f"no step {step} after {timeout} s")


def live_recipe(reference, root):
    """Where a run of the reference's recipe under `root` keeps its checkpoints and live metrics."""
    return root / "ckpt" / recipe_of(reference["root"]).name


def resume_matches(reference, tokens, root):
    """Run `streamback train` again under `root`: it resumes and ends with the reference's metrics and weights."""
    proc = cli(tokens, root)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert "resuming from step" in err
    records = read_metrics(root / "out" / layout.METRICS_FILE)
    assert deterministic(records) == deterministic(reference["metrics"])  # every step once, same values
    model = final_weights(root / "out" / layout.MODEL_FILE)
    assert all(torch.equal(model[k], reference["model"][k]) for k in model)
