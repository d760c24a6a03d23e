"""The full-precision shadow's gap against its rounding bound, at the paper's depths, at initialisation.

For each shape: a model with the project's `init_weights` (seed 0), a 2,048-token vocabulary and
random tokens (2 x 128), bf16 compute on this CPU's kernel path; one forward with the bf16 stream
and one with an fp64 stream (`Transformer.stream_as`), max |h| per layer boundary through
`Transformer.capture`. Prints per shape the largest relative gap of max |h|, the same in bf16 grid
steps at the shadow's max, its ratio to `shadow_gap_bound` (the preflight's bound; above 1 fails),
how many boundaries the old fixed bound (4 grid steps) refused, and the bound in grid steps at
boundaries 20, 40 and 80. The figures after the preflight's steps come from the preflight records
(tests/unit/test_preflight.py; docs/measurements.md).

    PYTHONPATH=. python benchmarks/bench_shadow_depth.py [--shapes 80x512,40x1512,...]
"""

from __future__ import annotations

import argparse
import time

import torch

from streamback.model.formats import StreamFormat
from streamback.model.model import ModelArgs, Transformer
from streamback.train.signals import shadow_gap_bound

# name: (layers, dim, heads, kv heads, multiple_of), the one-GPU tier's and the paper's deep shapes
SHAPES = {
    "80x512": (80, 512, 8, 2, 128),
    "40x756": (40, 756, 8, 2, 128),
    "40x1512": (40, 1512, 16, 4, 256),
    "80x1024": (80, 1024, 16, 4, 256),
    "80x64": (80, 64, 4, 1, 32),
}
OLD_GRID_STEPS = 4


def profile(name: str) -> dict:
    layers, dim, heads, kv, multiple = SHAPES[name]
    args = ModelArgs(
        dim=dim,
        n_layers=layers,
        n_heads=heads,
        n_kv_heads=kv,
        vocab_size=2048,
        multiple_of=multiple,
        max_seq_len=128,
        block="baseline",
        stream="bf16",
    )
    model = Transformer(args)
    model.init_weights(seed=0)
    tokens = torch.randint(0, 2048, (2, 128), generator=torch.Generator().manual_seed(0))
    absmax = {}
    with torch.no_grad():
        for label in ("bf16", "fp64"):
            with (
                model.stream_as(StreamFormat.parse(label)),
                model.capture(("residual",), fn=lambda h: h.abs().amax()) as seen,
            ):
                model(tokens)
                absmax[label] = [float(v) for v in seen["residual"]]
    run, shadow = absmax["bf16"], absmax["fp64"]
    fmt = StreamFormat.parse("bf16")
    gaps = [abs(a - s) / s for a, s in zip(run, shadow)]
    grid = [float(fmt.spacing(torch.tensor(s))) / s for s in shadow]
    bounds = shadow_gap_bound(fmt, run, shadow)
    return {
        "gap": max(gaps),
        "at": gaps.index(max(gaps)),
        "grid_steps": max(g / r for g, r in zip(gaps, grid)),
        "of_bound": max(g / b for g, b in zip(gaps, bounds) if b > 0),
        "old_refused": sum(g > OLD_GRID_STEPS * r for g, r in zip(gaps, grid)),
        "bound_steps": {b: bounds[b] / grid[b] for b in (20, 40, 80) if b < len(bounds)},
        "max_h": shadow[-1],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=",".join(SHAPES))
    torch.set_num_threads(2)
    for name in parser.parse_args().shapes.split(","):
        started = time.perf_counter()
        p = profile(name)
        steps = ", ".join(f"{b}: {s:.1f}" for b, s in p["bound_steps"].items())
        print(
            f"{name}: largest gap {p['gap']:.4f} at boundary {p['at']} ({p['grid_steps']:.1f} bf16 grid steps), "
            f"{p['of_bound']:.3f} of the bound; the old 4-step bound refused {p['old_refused']} boundaries; "
            f"bound in grid steps at boundary {steps}; max |h| at the last {p['max_h']:.3g} "
            f"({time.perf_counter() - started:.0f} s)",
            flush=True,
        )


if __name__ == "__main__":
    main()
