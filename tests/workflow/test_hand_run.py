"""A stage run by hand (`streamback train --config FILE`) trains the bits that rule `train` trains
from the same config, on either kernel path (`cpu_bf16`), with the execution settings the rule
passes (the kernels, the run's threads) read from the config file."""

import os
import subprocess
import sys

import pytest
import torch
import yaml

from streamback import layout
from streamback.config import DEFAULT_CONFIG, merge_config, read_config_file
from streamback.model import compute
from streamback.model.weights import read_model

from conftest import ROOT

# kernel-sensitive: CI runs these again on the other kernel path (.ci/run): under the fp32 cap (ONEDNN_MAX_CPU_ISA,
# ATEN_CPU_CAPABILITY), which changes the fp32 kernels of both modes; not under STREAMBACK_FORCE_NATIVE_BF16=1, which
# changes neither (the skip below)
pytestmark = pytest.mark.kernels

RUN = "tiny-fat-short-baseline"
# the default config, tiny: one run of 10 steps on a small corpus
TINY = {
    "data": {
        "synthetic": {"documents": 600, "files": 1},
        "tokenizer": {"vocab_size": 300, "train_documents": 600},
        "val_fraction": 0.1,
        "processes": 1,
    },
    "train": {
        "runs": {"shapes": ["tiny-fat-short"], "blocks": ["baseline"], "streams": [], "seeds": [0]},
        "tokens": 10 * 4 * 128,
        "schedule": {"warmup_steps": 2, "decay_steps": 4},
        "log": {"every": 5, "stream_every": 5, "shadow_every": 0, "val_every": 5, "val_sequences": 8},
        "checkpoint": {"every": 5},
    },
}


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get(compute.FORCE_NATIVE_ENV) == "1",
    reason=f"{compute.FORCE_NATIVE_ENV}=1 changes only what `auto` resolves to; an explicit cpu_bf16 runs as without it",
)
@pytest.mark.parametrize("cpu_bf16", ["native", "emulated"])
def test_a_hand_run_trains_the_rules_bits(run_snakemake, tmp_path, cpu_bf16):
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(merge_config(read_config_file(DEFAULT_CONFIG), {**TINY, "cpu_bf16": cpu_bf16})))
    result = run_snakemake(
        layout.summary_file(RUN), "--cores", "1", "--directory", tmp_path, "--configfile", config, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-3000:]
    kernels = "bf16 on fp32 kernels" if cpu_bf16 == "emulated" else "native bf16"
    assert f"parameters on cpu ({kernels})" in (tmp_path / "logs" / "train" / f"{RUN}.log").read_text()

    hand = tmp_path / "hand"
    cmd = [
        sys.executable,
        "-m",
        "streamback",
        "train",
        "--config",
        str(config),
        "--run-name",
        RUN,
        "--outdir",
        str(hand / "out"),
        "--checkpoints",
        str(hand / "ckpt"),
        "--tensorboard",
        str(hand / "tb"),
    ]
    # the environment the rule's job had (the machine's CPU dispatch too: ONEDNN_MAX_CPU_ISA and
    # ATEN_CPU_CAPABILITY pick other fp32 kernels), less what the config decides: no
    # STREAMBACK_CPU_BF16, no OMP_NUM_THREADS
    env = {k: v for k, v in os.environ.items() if k not in ("STREAMBACK_CPU_BF16", "OMP_NUM_THREADS")}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"parameters on cpu ({kernels})" in proc.stderr
    rule, by_hand = (
        read_model(tmp_path / layout.model_file(RUN)).state,
        read_model(hand / "out" / layout.MODEL_FILE).state,
    )
    assert rule.keys() == by_hand.keys()
    assert all(torch.equal(rule[key], by_hand[key]) for key in rule)
