"""A run's records name the kernels it computed on (summary.json, metrics.header.json, each
checkpoint's meta.json), and a resume onto other kernels is refused in one line naming both and
the setting that allows it; allowed, the change is recorded."""

import json
import shutil

import pandas as pd
import pytest
import torch

from streamback import layout
from streamback.config import validate_config
from streamback.errors import StreambackError
from streamback.model import compute
from streamback.train import checkpoint as ckpt
from streamback.train import trainer as train_module
from streamback.train.metrics import header_file, read_header, read_metrics

# kernel-sensitive: CI runs these again on the other kernel path (.ci/run)
pytestmark = pytest.mark.kernels

RUN = "micro-baseline"
EMULATED, NATIVE = "bf16 on fp32 kernels on cpu", "native bf16 on cpu"


def config(**checkpoint):
    return validate_config(
        {
            "model": {
                "shapes": {"micro": {"n_layers": 2, "dim": 32, "n_heads": 2, "n_kv_heads": 1, "multiple_of": 16}},
                "max_seq_len": 64,
            },
            "train": {
                "runs": {"shapes": ["micro"], "blocks": ["baseline"], "streams": []},
                "seed": 3,
                "tokens": 10 * 4 * 32,
                "seq_len": 32,
                "batch_size": 4,
                "micro_batch_size": 4,
                "schedule": {"warmup_steps": 2, "decay_steps": 4},
                "checkpoint": {"every": 5, "keep": 2, **checkpoint},
                "log": {"every": 5, "val_every": 5, "val_sequences": 4},
            },
        }
    )


def train(tokens, root, mode, **checkpoint):
    cfg = config(**checkpoint)
    torch.set_num_threads(1)
    with compute.use(mode):
        return train_module.train(cfg["train"], cfg["model"], RUN, tokens, root / "out", root / "ckpt")


def records(root):
    (recipe,) = layout.recipe_dirs(root / "ckpt")
    summary = json.loads((root / "out" / layout.SUMMARY_FILE).read_text())
    metas = [ckpt.read_meta(path) for _, path in ckpt.list_checkpoints(recipe)]
    return recipe, summary, read_header(root / "out" / layout.METRICS_FILE), metas


def test_the_records_name_the_kernels_and_another_path_is_refused_unless_allowed(tokens, tmp_path):
    assert train(tokens, tmp_path, "emulated") == 0
    recipe, summary, header, metas = records(tmp_path)
    for record in (summary, header, *metas):
        assert (record["kernels"], record["kernel_changes"]) == (EMULATED, [])
    assert_one_record_per_step(tmp_path / "out" / layout.METRICS_FILE, steps=10)

    shutil.rmtree(ckpt.checkpoint_dir(recipe, 10))  # the run resumes from step 5
    with pytest.raises(StreambackError) as err:
        train(tokens, tmp_path, "native")
    message = str(err.value)
    assert "\n" not in message and f"{ckpt.checkpoint_dir(recipe, 5)} was trained on {EMULATED}" in message
    assert (
        f"this process computes on {NATIVE} (cpu_bf16 native)" in message
        and "train.checkpoint.resume_on_other_kernels: true" in message
    )
    assert [s for s, _ in ckpt.list_checkpoints(recipe)] == [5]  # refused before anything changed

    assert train(tokens, tmp_path, "native", resume_on_other_kernels=True) == 0
    _, summary, header, metas = records(tmp_path)
    change = [{"step": 5, "from": EMULATED, "to": NATIVE}]
    assert (
        (summary["kernels"], summary["kernel_changes"])
        == (header["kernels"], header["kernel_changes"])
        == (NATIVE, change)
    )
    assert [(m["step"], m["kernels"], m["kernel_changes"]) for m in metas] == [(5, EMULATED, []), (10, NATIVE, change)]
    assert_one_record_per_step(tmp_path / "out" / layout.METRICS_FILE, steps=10)  # the resumed log too


def assert_one_record_per_step(path, steps):
    """The log is the step table as a user reads a JSONL file (`pandas.read_json(lines=True)`): one
    row per step, no header column; the header lies beside it (metrics.header.json)."""
    table = pd.read_json(path, lines=True)
    assert table["step"].tolist() == list(range(1, steps + 1))
    assert "header" not in table.columns and "kernels" not in table.columns
    # the same table as the records (pandas' own float parser may differ in the last digit)
    # derived: pandas' float parser may round the last of JSON's 17 digits differently: 1 ulp (2^-52 = 2e-16)
    pd.testing.assert_frame_equal(table, pd.DataFrame(read_metrics(path)), check_exact=False, rtol=1e-12)
    assert table["loss"].notna().all() and table["tokens"].tolist() == [step * 4 * 32 for step in range(1, steps + 1)]
    assert header_file(path).name == layout.METRICS_HEADER_FILE
    assert json.loads(header_file(path).read_text()) == read_header(path)
