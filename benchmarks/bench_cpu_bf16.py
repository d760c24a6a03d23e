"""bf16 compute on the CPU: native bf16 kernels against bf16 on fp32 kernels (streamback.model.compute).

Prints, on one thread, a 512x512 matmul's rate and a tiny shape's training step as the trainer
runs it (the default study's micro-batch and sequence, the config's 2048-word vocabulary bound:
forward, backward, gradient clipping and AdamW's step) on three paths measured in the same
process, interleaved: native bf16, bf16 on fp32 kernels ("emulated"), and fp32 compute (the speed
the emulated path aims at); then the ratios. With `--avx2` it runs the same in a child
process whose oneDNN and ATen are capped at AVX2 (`ONEDNN_MAX_CPU_ISA=AVX2
ATEN_CPU_CAPABILITY=avx2`), so a machine with native bf16 also measures the AVX2 machine's case;
`--both` prints this machine's figures and then the AVX2 ones.

    python benchmarks/bench_cpu_bf16.py --both [--steps 10] [--shapes tiny-medium]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

from streamback.config import DEFAULT_CONFIG, load_config
from streamback.measure.step import random_tokens, training_step
from streamback.model import compute
from streamback.model.model import ModelArgs, Transformer
from streamback.train.optim import adamw, clip_gradients

AVX2 = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}
PATHS = {  # name -> (compute dtype, cpu_bf16 mode)
    "native bf16": (torch.bfloat16, "native"),
    "emulated bf16": (torch.bfloat16, "emulated"),
    "fp32 compute": (torch.float32, "native"),
}


def median_seconds(fn, steps: int) -> float:
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def matmul_rates(steps: int) -> dict[str, float]:
    """GFLOP/s of a 512x512x512 product by compute.linear on each path."""
    a, b = torch.randn(512, 512), torch.randn(512, 512)
    rates = {}
    for name, (dtype, mode) in PATHS.items():
        x, w = a.to(dtype), b.to(dtype)
        with compute.use(mode):
            compute.linear(x, w)
            rates[name] = 2 * 512**3 / median_seconds(lambda: compute.linear(x, w), steps) / 1e9
    return rates


def step_tokens() -> tuple[int, int]:
    """The default study's micro-batch and sequence length."""
    train = load_config(DEFAULT_CONFIG)["train"]
    return train["micro_batch_size"], train["seq_len"]


def step_times(shape: str, steps: int, rounds: int) -> dict[str, float]:
    """Median training-step seconds of `shape` (baseline block) on each path, the paths interleaved
    over `rounds` so that the machine's load falls on all of them alike."""
    cfg = load_config(DEFAULT_CONFIG)
    args = ModelArgs.from_config(cfg["model"], shape, 2048, block="baseline")
    tokens = random_tokens(2048, *step_tokens())
    steps_of = {}
    for name, (dtype, _) in PATHS.items():
        model = Transformer(args, compute_dtype=dtype)
        model.init_weights(0)
        steps_of[name] = trainer_step(model, cfg["train"])
    times = {name: [] for name in PATHS}
    for _ in range(rounds):
        for name, (_, mode) in PATHS.items():
            with compute.use(mode):
                steps_of[name](tokens)  # warm
                times[name].append(median_seconds(lambda: steps_of[name](tokens), steps))
    return {name: statistics.median(t) for name, t in times.items()}


def trainer_step(model, train_cfg: dict):
    """One step as streamback.train.trainer takes it on the CPU: forward and backward
    (`training_step`), then the trainer's own clipping and optimizer step."""
    params, opt = list(model.parameters()), train_cfg["optimizer"]
    optimizer = adamw(params, opt)

    def step(tokens):
        training_step(model, tokens)
        clip_gradients(params, opt).item()
        optimizer.step()

    return step


def report(args) -> None:
    torch.set_num_threads(1)
    print(
        f"CPU capability {torch.backends.cpu.get_cpu_capability()}, native bf16 matmuls: "
        f"{compute.cpu_has_native_bf16()}, "
        f"auto takes: {compute.path('cpu')}; one thread"
    )
    rates = matmul_rates(max(3, args.steps))
    print("512x512 matmul GFLOP/s: " + ", ".join(f"{name} {rate:.1f}" for name, rate in rates.items()))
    for shape in args.shapes.split(","):
        t = step_times(shape, args.steps, args.rounds)
        print(
            f"{shape} step ({' x '.join(map(str, step_tokens()))} tokens): "
            + ", ".join(f"{name} {s * 1e3:.0f} ms" for name, s in t.items())
            + f"; native / emulated {t['native bf16'] / t['emulated bf16']:.2f}x"
            + f", emulated / fp32 {t['emulated bf16'] / t['fp32 compute']:.2f}x",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="tiny-skinny-tall,tiny-medium,tiny-fat-short")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per path and round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds over the paths, interleaved")
    parser.add_argument(
        "--avx2", action="store_true", help="measure as an AVX2-only CPU (a child process with oneDNN and ATen capped)"
    )
    parser.add_argument("--both", action="store_true", help="this CPU, then as an AVX2-only one")
    args = parser.parse_args()
    if os.environ.get("_BENCH_CHILD"):  # the capped child: its figures only
        report(args)
        return
    if args.both or not args.avx2:
        print("== this CPU")
        report(args)
    if args.both or args.avx2:
        print("== capped at AVX2 (" + " ".join(f"{k}={v}" for k, v in AVX2.items()) + ")", flush=True)
        child = [
            sys.executable,
            __file__,
            "--shapes",
            args.shapes,
            "--steps",
            str(args.steps),
            "--rounds",
            str(args.rounds),
        ]
        # an Inductor cache of its own: compiled code cached under the capped ISA must not serve uncapped processes
        env = {
            **os.environ,
            **AVX2,
            "_BENCH_CHILD": "1",
            "TORCHINDUCTOR_CACHE_DIR": os.path.join(tempfile.gettempdir(), "torchinductor_avx2"),
        }
        subprocess.run(child, env=env, check=True)


if __name__ == "__main__":
    main()
