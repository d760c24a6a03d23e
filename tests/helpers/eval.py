"""The evaluation stage's shared test pieces: two micro runs trained once per module, both evaluated on the local
tasks, a scorer, and a stage run with scoring refused."""

import os

import pytest
import torch

from streamback import layout
from streamback.config import validate_config
from streamback.eval import stage, taskdata
from streamback.eval.scoring import Scorer, open_run
from streamback.train import trainer

MODEL = {
    "shapes": {"micro": {"n_layers": 2, "dim": 32, "n_heads": 2, "n_kv_heads": 1, "multiple_of": 16}},
    "max_seq_len": 64,
}
TRAIN = {
    "runs": {"shapes": ["micro"], "blocks": ["baseline", "streamback"], "streams": [], "seeds": None},
    "seed": 7,
    "tokens": 30 * 8 * 32,
    "seq_len": 32,
    "batch_size": 8,
    "micro_batch_size": 8,
    "optimizer": {"lr": 3e-3},
    "schedule": {"warmup_steps": 4, "decay_steps": 8},
    "checkpoint": {"every": 30, "keep": 1},
    "log": {"every": 10, "stream_every": 10, "val_every": 30, "val_sequences": 8},
}
RUNS = ("micro-baseline", "micro-streamback")
SMALL = {"local": {"seed": 1000, "pairs": 6, "documents": 8}, "bootstrap_iters": 100, "batch_size": 16}
TEXTS = [
    "The dog runs.",
    "Mia counts to five: one, two, three, four, five.",
    "A cat",
    "Four dark friends [and three shelves (blue and heavy)] miss every song.",
]


@pytest.fixture(scope="session")  # read-only: every module that imports it reads the one made
def runs(tokens, tmp_path_factory):
    """{run: model file} of the two micro runs, trained on conftest's token shards."""
    root = tmp_path_factory.mktemp("eval-runs")
    cfg = validate_config({"model": MODEL, "train": TRAIN})
    torch.set_num_threads(1)
    for run in RUNS:
        assert trainer.train(cfg["train"], cfg["model"], run, tokens, root / "runs" / run, root / "ckpt" / run) == 0
    return {run: root / "runs" / run / layout.MODEL_FILE for run in RUNS}


@pytest.fixture(scope="module")
def evaluated(runs, tokens, tmp_path_factory):
    """Both runs through `stage.evaluate` on the five local tasks, in a working directory of their own."""
    root = tmp_path_factory.mktemp("evaluated")
    cfg = validate_config({"eval": SMALL})["eval"]
    cwd = os.getcwd()
    os.chdir(root)
    try:
        taskdata.write_tasks(cfg["tasks"], cfg["local"], corpus_seed=0)
        results = {run: stage.evaluate(cfg, runs[run], tokens, layout.eval_dir(run)) for run in RUNS}
    finally:
        os.chdir(cwd)
    return {"root": root, "cfg": cfg, "results": results}


def scorer(runs, tokens, run="micro-baseline", dtype=torch.float32, batch_size=4):
    """A Scorer of `run` (of the `runs` fixture) at `dtype`, and the opened run it scores."""
    opened = open_run(runs[run], tokens)
    return Scorer(opened.model(compute_dtype=dtype), opened.tokenizer, opened.eos_id, batch_size=batch_size), opened


@pytest.fixture
def no_scoring(monkeypatch):
    """Scoring raises: a check that passes too late shows up as this error instead of its own."""

    def refuse(*args, **kwargs):
        raise AssertionError("scored before the bad input was caught")

    monkeypatch.setattr(Scorer, "loglikelihood", refuse)
    monkeypatch.setattr(Scorer, "generate", refuse)


def run_stage(cfg_overrides, model, tokens, outdir):
    """`stage.evaluate` of `model` with SMALL and `cfg_overrides` as the eval config; what it returns."""
    cfg = validate_config({"eval": {**SMALL, **cfg_overrides}})["eval"]
    return stage.evaluate(cfg, model, tokens, outdir)
