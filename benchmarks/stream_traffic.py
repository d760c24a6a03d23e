"""Memory traffic of an eager training step per block: what the fp32 stream costs in bytes moved.

Runs one forward + backward on fake tensors (`streamback.memory.fake_training_step`: no data,
no arithmetic) and counts, for every operator, the bytes of its tensor inputs (read) and outputs
(written); operators that return no new storage (views, reshapes of contiguous tensors,
metadata queries) move nothing. An eager step launches about one kernel per operator,
so the sum is the traffic of the unfused step, and the difference between the StreamBack and
baseline blocks is what the fp32 stream costs when nothing fuses it away. FLOPs are the bench's
count (`streamback.bench.flops_per_token`, TorchTitan's). Printed per shape: FLOPs and the time they take at
`--tflops`, bytes moved and their time at `--bandwidth`, and the StreamBack - baseline extra
bytes as a share of the baseline step time `--step-ms` if given (e.g. the issue's measured
146 ms for fat-short compiled), else of the FLOP floor.

    python benchmarks/stream_traffic.py                          # the paper shapes, 4 x 2048 tokens
    python benchmarks/stream_traffic.py --shapes fat-short --step-ms 146.4
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from streamback.config import DEFAULT_CONFIG, load_config  # noqa: E402
from streamback.measure.step import GPU_SHAPES, VARIANTS, fake_training_step, flops_per_token, model_args, parse_names  # noqa: E402
from streamback.model.model import Transformer  # noqa: E402
from streamback.model.reversible import storage_id  # noqa: E402


def _tensors(tree) -> list[torch.Tensor]:
    return [t for t in tree_leaves(tree) if isinstance(t, torch.Tensor)]


class Traffic(TorchDispatchMode):
    """Bytes read (tensor inputs) and written (outputs) by every operator that writes memory:
    one whose outputs include a new storage, or one that writes in place."""

    def __init__(self):
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs, outputs = _tensors((args, kwargs)), _tensors(out)
        known = {storage_id(t) for t in inputs}
        if func._schema.is_mutable or any(storage_id(t) not in known for t in outputs):
            self.bytes += sum(t.nbytes for t in inputs) + sum(t.nbytes for t in outputs)
        return out


def measure(margs, batch: int, seq_len: int) -> tuple[int, int]:
    """(bytes moved, FLOPs) of one eager forward + backward."""
    traffic = Traffic()
    fake_training_step(margs, batch, seq_len, lambda model: traffic)
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
    parser.add_argument("--step-ms", type=float, default=None, help="measured baseline step time to compare the extra with")
    args = parser.parse_args()
    model_cfg = load_config(args.config)["model"]
    print(f"{'shape':12} {'variant':22} {'TFLOP':>7} {'floor ms':>9} {'GB moved':>9} {'at BW ms':>9} {'extra GB':>9} {'extra ms':>9} {'of step':>8}")
    for shape in parse_names(args.shapes, model_cfg["shapes"], "shapes"):
        base = None
        for variant in parse_names(args.variants, VARIANTS, "variants"):
            moved, flops = measure(model_args(model_cfg, shape, variant, args.vocab_size), args.batch, args.seq_len)
            floor_ms = flops / (args.tflops * 1e12) * 1e3
            base = base or (moved, args.step_ms or floor_ms)
            extra = moved - base[0]
            extra_ms = extra / (args.bandwidth * 1e12) * 1e3
            print(f"{shape:12} {variant:22} {flops / 1e12:7.4g} {floor_ms:9.4g} {moved / 1e9:9.4g} {moved / (args.bandwidth * 1e12) * 1e3:9.4g}"
                  f" {extra / 1e9:9.3g} {extra_ms:9.3g} {100 * extra_ms / base[1]:7.2f}%", flush=True)


if __name__ == "__main__":
    main()
