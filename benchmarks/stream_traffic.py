"""Memory traffic of an eager training step per block: what the fp32 stream costs in bytes moved.

Runs one forward + backward on fake tensors (`streamback.memory.fake_training_step`: no data,
no arithmetic) and counts, for every operator, the bytes of its tensor inputs (read) and outputs
(written) (`streamback.measure.traffic.Traffic`); operators that return no new storage (views,
reshapes of contiguous tensors, metadata queries) move nothing. An eager step launches about one kernel per operator,
so the sum is the traffic of the unfused step, and the difference between the StreamBack and
baseline blocks is what the fp32 stream costs when nothing fuses it away. FLOPs are the bench's
count (`streamback.bench.flops_per_token`, TorchTitan's). Printed per shape: FLOPs and the time they take at
`--tflops`, bytes moved and their time at `--bandwidth`, and the StreamBack - baseline extra
bytes as a share of the baseline step time `--step-ms` if given (e.g. a compiled fat-short step
of plain PyTorch on an H200: its 4 x 2048 tokens at the tokens/s in docs/measurements.md), else of
the FLOP floor.

With `--signals`, then what the trainer's live precision signals add (`streamback.measure.traffic.
signals_cost`, on one step in `train.log.stream_every` of `--config`): bytes per signal step and
their time at `--bandwidth`, and as shares of the step at that cadence, of its bytes and FLOPs.

    python benchmarks/stream_traffic.py                          # the paper shapes, 4 x 2048 tokens
    python benchmarks/stream_traffic.py --shapes fat-short --step-ms 146.4
    python benchmarks/stream_traffic.py --config config/paper.yaml --signals   # at the paper's stream_every
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from streamback.config import DEFAULT_CONFIG, load_config  # noqa: E402
from streamback.measure.step import GPU_SHAPES, VARIANTS, flops_per_token, model_args, parse_names  # noqa: E402
from streamback.measure.traffic import signals_cost, step_traffic  # noqa: E402
from streamback.model.model import Transformer  # noqa: E402


def measure(margs, batch: int, seq_len: int) -> tuple[int, int]:
    """(bytes moved, FLOPs) of one eager forward + backward."""
    traffic = step_traffic(margs, batch, seq_len)
    with torch.device("meta"):
        flops = flops_per_token(Transformer(margs), seq_len) * batch * seq_len
    return traffic.bytes, flops


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    parser.add_argument("--shapes", default=GPU_SHAPES)
    parser.add_argument("--variants", default="baseline,streamback")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--vocab-size", type=int, default=128256)
    parser.add_argument("--bandwidth", type=float, default=4.3, help="TB/s (an H200's measured copy rate)")
    parser.add_argument("--tflops", type=float, default=790.0, help="bf16 TFLOP/s (an H200's measured matmul rate)")
    parser.add_argument(
        "--step-ms", type=float, default=None, help="measured baseline step time to compare the extra with"
    )
    parser.add_argument(
        "--signals", action="store_true", help="then the live signals' cost, at the config's train.log.stream_every"
    )
    args = parser.parse_args()
    config = load_config(args.config)
    model_cfg = config["model"]
    print(
        f"{'shape':12} {'variant':22} {'TFLOP':>7} {'floor ms':>9} {'GB moved':>9} {'at BW ms':>9} {'extra GB':>9} "
        f"{'extra ms':>9} {'of step':>8}"
    )
    for shape in parse_names(args.shapes, model_cfg["shapes"], "shapes"):
        base = None
        for variant in parse_names(args.variants, VARIANTS, "variants"):
            moved, flops = measure(model_args(model_cfg, shape, variant, args.vocab_size), args.batch, args.seq_len)
            floor_ms = flops / (args.tflops * 1e12) * 1e3
            base = base or (moved, args.step_ms or floor_ms)
            extra = moved - base[0]
            extra_ms = extra / (args.bandwidth * 1e12) * 1e3
            print(
                f"{shape:12} {variant:22} {flops / 1e12:7.4g} {floor_ms:9.4g} {moved / 1e9:9.4g} "
                f"{moved / (args.bandwidth * 1e12) * 1e3:9.4g}"
                f" {extra / 1e9:9.3g} {extra_ms:9.3g} {100 * extra_ms / base[1]:7.2f}%",
                flush=True,
            )
    if args.signals:
        every = config["train"]["log"]["stream_every"]
        print(
            f"\nlive signals every {every} steps: {'shape':12} {'variant':22} {'GB':>7} {'at BW ms':>9} "
            f"{'of bytes':>9} {'of FLOPs':>10}"
        )
        for shape in parse_names(args.shapes, model_cfg["shapes"], "shapes"):
            for variant in parse_names(args.variants, VARIANTS, "variants"):
                cost = signals_cost(
                    model_args(model_cfg, shape, variant, args.vocab_size), args.batch, args.seq_len, every
                )
                print(
                    f"{'':31} {shape:12} {variant:22} {cost['bytes'] / 1e9:7.4g} "
                    f"{cost['bytes'] / (args.bandwidth * 1e9):9.4g} "
                    f"{100 * cost['bytes_share']:8.3f}% {100 * cost['flops_share']:9.5f}%",
                    flush=True,
                )


if __name__ == "__main__":
    main()
