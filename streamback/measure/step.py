"""The training step that every measurement measures, defined once.

One forward + backward of `Transformer(model_args(...))` (bf16 compute, fp32 master weights) with
the next-token loss on random tokens, no optimizer step, at micro-batch `batch` x `seq_len`; the
model variants compared (`VARIANTS`); the command-line arguments that choose them; per-step
timing; and TorchTitan's FLOP count. `streamback bench` times it, `streamback memory` estimates
its peak memory on fake tensors, `benchmarks/stream_traffic.py` counts its bytes.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from streamback.config import DEFAULT_CONFIG
from streamback.errors import StreambackError
from streamback.model import compute
from streamback.model.model import ModelArgs, Transformer, count_params

VARIANTS = {  # name -> (block, reversible)
    "baseline": ("baseline", False),
    "streamback": ("streamback", False),
    "streamback-reversible": ("streamback", True),
}
GPU_SHAPES = "skinny-tall,medium,fat-short"
CPU_SHAPES = "tiny-skinny-tall,tiny-medium,tiny-fat-short"
# micro-batch, sequence and vocabulary of the measured step: the study's (Llama 3's vocabulary) on a
# GPU; on a CPU, sizes at which the tiny shapes take milliseconds a step
GPU_STEP = {"batch": 4, "seq_len": 2048, "vocab_size": 128256}
CPU_STEP = {"batch": 2, "seq_len": 64, "vocab_size": 2048}


def parse_names(text: str, allowed, what: str) -> list[str]:
    """The comma-separated names of `text`, each checked against `allowed` (named --`what`)."""
    names = [n for n in text.split(",") if n]
    bad = [n for n in names if n not in allowed]
    if bad or not names:
        raise StreambackError(f"--{what}: unknown {bad or 'empty list'}; choose from {', '.join(allowed)}")
    return names


def add_step_arguments(parser: argparse.ArgumentParser, per_device: bool = False) -> None:
    """The training step measured: model config, variants, sizes (GPU_STEP's; with `per_device`,
    None unless given, for `step_sizes` to choose by device)."""
    parser.add_argument(
        "--config", type=Path, default=DEFAULT_CONFIG, help="config file whose model section names the shapes"
    )
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated, from " + ", ".join(VARIANTS))
    for key, flag, what in (
        ("batch", "--batch", "micro-batch size in sequences"),
        ("seq_len", "--seq-len", "tokens per sequence"),
        ("vocab_size", "--vocab-size", "vocabulary (the study's: the Llama 3 tokenizer's)"),
    ):
        if per_device:
            parser.add_argument(
                flag,
                type=int,
                default=None,
                help=f"{what} (default: {GPU_STEP[key]} on a GPU, {CPU_STEP[key]} on the CPU)",
            )
        else:
            parser.add_argument(flag, type=int, default=GPU_STEP[key], help=what)


def step_sizes(args: argparse.Namespace, device: torch.device) -> None:
    """Fill the sizes left unset (None) with the device's defaults: GPU_STEP or CPU_STEP."""
    for key, value in (GPU_STEP if device.type == "cuda" else CPU_STEP).items():
        if getattr(args, key) is None:
            setattr(args, key, value)


def require_positive(args: argparse.Namespace, keys) -> None:
    for key in keys:
        if getattr(args, key) < 1:
            raise StreambackError(f"--{key.replace('_', '-')} must be at least 1")


def model_args(model_cfg: dict, shape: str, variant: str, vocab_size: int):
    """ModelArgs of `shape` as `variant` (a VARIANTS name) with `vocab_size` words."""

    block, reversible = VARIANTS[variant]
    return ModelArgs.from_config(model_cfg, shape, vocab_size, block=block, reversible=reversible)


def random_tokens(vocab_size: int, batch: int, seq_len: int, device=None) -> torch.Tensor:
    """[batch, seq_len + 1] tokens, the same for every variant (seed 0): inputs and next-token targets."""
    generator = torch.Generator(device=device).manual_seed(0)
    return torch.randint(0, vocab_size, (batch, seq_len + 1), device=device, generator=generator)


def training_step(model, tokens: torch.Tensor) -> None:
    """The measured step, the trainer's: gradients cleared, forward with the next-token loss
    (`Transformer.forward` with targets), backward."""
    model.zero_grad(set_to_none=True)
    model(tokens[:, :-1], targets=tokens[:, 1:]).backward()


def fake_training_step(margs, batch: int, seq_len: int, watch, compute_dtype: torch.dtype = torch.bfloat16) -> None:
    """`training_step` of `Transformer(margs)` on fake tensors (shapes and storages, no data, no
    arithmetic), run inside the context `watch(model)` returns (e.g. a dispatch mode). The step of
    a GPU: native bf16 kernels, whatever this CPU would run (streamback.model.compute)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with torch.device("meta"):
        model = Transformer(margs, compute_dtype=compute_dtype)
    with FakeTensorMode(allow_non_fake_inputs=True):
        model.to_empty(device="cpu")  # fake storages; no values are ever computed
        tokens = torch.randint(0, margs.vocab_size, (batch, seq_len + 1))
        with watch(model), compute.use("native"):
            training_step(model, tokens)


def step_seconds(step, steps: int, device: torch.device) -> list[float]:
    """Wall time of each of `steps` calls of `step`: CUDA events on a GPU, the host clock else."""
    times = []
    for _ in range(steps):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
    return times


def flops_per_token(model, seq_len: int) -> int:
    """TorchTitan's count: 6 x parameters but the token embedding + 12 x layers x heads x head_dim x
    seq_len (attention counted as if not causal)."""

    a = model.args
    return 6 * count_params(model, exclude_embeddings=True) + 12 * a.n_layers * a.n_heads * a.head_dim * seq_len
