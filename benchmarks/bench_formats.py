"""Cost of one residual addition per stream format, relative to a plain fp32 add (same run).

    python benchmarks/bench_formats.py                 # eager, [8, 2048, 1024], CPU
    python benchmarks/bench_formats.py --compile       # also torch.compile'd adds
    python benchmarks/bench_formats.py --device cuda

Deltas are fp32 (the StreamBack block's sublayer outputs); the bf16/fp16 nearest rows also time
the baseline case of a delta already in the stream dtype (torch's native add). Times are the
median of `--repeat` calls after one warm-up call.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from streamback.measure.step import step_seconds
from streamback.model.formats import STREAM_FORMATS, StreamFormat


def _median_ms(fn, repeat: int, device: str) -> float:
    fn()
    return 1e3 * statistics.median(step_seconds(fn, repeat, torch.device(device)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", type=int, nargs="+", default=[8, 2048, 1024])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--compile", action="store_true", help="also time torch.compile'd adds")
    args = parser.parse_args()

    torch.manual_seed(0)
    x = torch.randn(*args.shape, device=args.device)
    delta = torch.randn(*args.shape, device=args.device) * 0.1
    print(f"shape {args.shape}, device {args.device}, torch {torch.__version__}, threads {torch.get_num_threads()}")

    cases = []  # the first case, fp32 + fp32, is the reference
    for name in STREAM_FORMATS:
        for rounding in ("nearest", "stochastic"):
            if (name, rounding) != ("fp32", "stochastic"):
                fmt = StreamFormat(name, rounding)
                cases.append((fmt, "fp32 delta"))
                if name in ("bf16", "fp16") and rounding == "nearest":
                    cases.append((fmt, "native delta"))

    modes = ["eager"] + (["compiled"] if args.compile else [])
    reference = {}
    print(f"{'format':<14}{'delta':<14}" + "".join(f"{m + ' ms':>16}{m + ' x fp32':>16}" for m in modes))
    for fmt, kind in cases:
        h = fmt.enter(x)
        d = delta.to(fmt.container_dtype) if kind == "native delta" else delta
        row = f"{fmt.label:<14}{kind:<14}"
        for mode in modes:
            add = fmt.add
            if mode == "compiled":
                torch._dynamo.reset()
                add = torch.compile(fmt.add, fullgraph=True)
            ms = _median_ms(lambda: add(h, d), args.repeat, args.device)
            reference.setdefault(mode, ms)
            row += f"{ms:>16.2f}{ms / reference[mode]:>16.2f}"
        print(row, flush=True)


if __name__ == "__main__":
    main()
