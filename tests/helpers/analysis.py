"""The analyses' shared test pieces: hand-written metrics files, and a small matrix of untrained runs with
`streamback analyze` run on it in this process."""

import json

import numpy as np
import pytest
import yaml

from streamback import layout
from streamback.model.model import ModelArgs, Transformer
from streamback.model.weights import save_model


def write_metrics(path, losses, val, extra=None):
    """A metrics.jsonl: a record per step (tokens = 100 x step), val_loss at the steps of `val`, `extra` fields by
    step."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = []
    for step, loss in enumerate(losses, 1):
        record = {"step": step, "tokens": 100 * step, "loss": float(loss)} | (extra or {}).get(step, {})
        if step in val:
            record["val_loss"] = val[step]
        lines.append(json.dumps(record) + "\n")
    path.write_text("".join(lines))


SHAPES = {
    "a-short": {"n_layers": 2, "dim": 64, "n_heads": 4, "n_kv_heads": 1, "multiple_of": 32},
    "b-tall": {"n_layers": 4, "dim": 48, "n_heads": 4, "n_kv_heads": 1, "multiple_of": 32},
}


@pytest.fixture(scope="module")
def matrix(tmp_path_factory, tokens):
    """results/runs/ of a 2-shape x {baseline, streamback (training seeds 0 and 1), streamback-mxfp8
    (seed 0)} matrix: random models and hand-written metrics; the config that names them."""
    from streamback.config import validate_config
    from streamback.runs import run_matrix

    root = tmp_path_factory.mktemp("analysis")
    config = validate_config(
        {
            "data": {"dir": str(tokens)},
            "model": {"shapes": SHAPES},
            "train": {
                "runs": {"shapes": list(SHAPES), "streams": ["mxfp8"], "seeds": [0, 1], "stream_seeds": [0]},
                "seq_len": 32,
                "tokens": 320,
                "batch_size": 1,
                "micro_batch_size": 1,
                "schedule": {"warmup_steps": 1, "decay_steps": 1},
                "log": {"val_sequences": 8},
            },
            "analysis": {
                "batch_size": 2,
                "reference": "fp64",
                "variants": ["bf16", "fp32", "nvfp4_sr"],
                "micro_batch_size": 4,
                "smooth_steps": 2,
            },
        }
    )
    vocab = json.loads((tokens / "manifest.json").read_text())["vocab_size"]
    for seed, (name, spec) in enumerate(run_matrix(config["train"]).items()):
        args = ModelArgs.from_config(config["model"], spec.shape, vocab, spec.block, spec.stream)
        model = Transformer(args)
        model.init_weights(seed)
        save_model(root / layout.model_file(name), args, model.state_dict())
        rng = np.random.default_rng(seed)
        reach = {
            "stream_absmax": [2.0] * (args.n_layers + 1),
            "stream_max": [2.0] * (args.n_layers + 1),
            "stream_min": [-1.5] * (args.n_layers + 1),
        }
        write_metrics(
            root / layout.metrics_file(name),
            5 - np.arange(10) * 0.1 + rng.normal(0, 0.01, 10),
            {5: 4.6, 10: 4.1 + seed / 100},
            {5: reach, 10: reach},
        )
        (root / layout.summary_file(name)).write_text("{}\n")
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return root, path


def analyze(monkeypatch, capsys, root, config, *args) -> tuple[int, str, str]:
    """`streamback analyze ...` in `root` (in this process: no second import of torch); exit status, stdout, stderr."""
    from streamback.cli import main

    monkeypatch.chdir(root)
    status = main(["analyze", *map(str, args), "--config", str(config), "--device", "cpu", "--threads", "1"])
    out = capsys.readouterr()
    return status, out.out, out.err


def matrix_tokens(config_path):
    """The token directory the matrix's config names."""
    return yaml.safe_load(config_path.read_text())["data"]["dir"]
