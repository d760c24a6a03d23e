"""`streamback bench`: training-step throughput, MFU and memory of the model variants.

For each shape x variant (`baseline`, `streamback`, `streamback-reversible`) x mode (`eager`,
`compiled` = `streamback.train.parallel.apply_compile`, TorchTitan's per-block torch.compile), one
process times forward + backward (bf16 compute, fp32 master weights, cross-entropy on random
tokens; no optimizer step) at micro-batch `--batch` x `--seq-len`, after `--warmup` untimed
steps (compilation happens there), prints a line per configuration as it finishes, and reports:
- tokens/s from the median step time (each step timed alone: CUDA events on a GPU, the host
  clock on the CPU), its ratio to the baseline of the same shape and mode, and the spread
  (slowest over fastest step) as a noise gauge;
- MFU: model FLOPs per second over the bf16 matmul rate measured on the same device (TorchTitan's
  FLOP count: 6 x parameters except the token embedding + 12 x layers x heads x head_dim x
  seq_len per token, attention counted as if not causal);
- peak memory: torch.cuda.max_memory_allocated on a GPU (n/a on the CPU), and beside it the
  estimate of `streamback.measure.memory` for the same step (eager, fake tensors; `--no-estimate` skips);
- saved activations: bytes autograd keeps for the backward pass (distinct storages, counted with
  saved-tensor hooks on one extra step; for the reversible stream, its own count of what it
  keeps plus its cached deltas), which needs no GPU;
- the live precision signals' cost (`streamback.train.signals`, the trainer's stream record on one
  step in `train.log.stream_every` of `--config`) as a share of the step at that cadence: measured,
  from the median of `--steps` steps under the stream record (envelope and signals) after the plain
  ones, and counted on fake tensors, the signals' bytes and elementwise operations against the
  step's bytes and model FLOPs (`streamback.measure.traffic.signals_cost`; `--no-estimate` skips it).
Writes `--out` (JSON) and a Markdown table beside it (same name, .md), both atomically, and
prints the table. A configuration that fails (out of memory, a compiler error) is reported as
such and the others still run. Runs unchanged on a CUDA machine with torch alone.

Defaults by device: on a GPU the paper's step (4 x 2048 tokens, Llama 3's vocabulary) of the
paper's shapes, eager and compiled; on the CPU the tiny shapes at 2 x 64 tokens and a 2048-word
vocabulary, eager only, on one thread (on a shared CPU, threads make the step times erratic far
more than one thread does; docs/measurements.md), which takes seconds. A warning says when the timed steps are too few
(under MIN_STEPS) or too uneven for
a stable ratio to the baseline: when the 95% interval of a configuration's median step time (from
its order statistics, distribution-free) is wider than +-NOISE_LIMIT of it.
"""

from __future__ import annotations

import argparse
import gc
import math
import statistics
from pathlib import Path

import torch

from streamback import layout
from streamback.config import load_config
from streamback.errors import StreambackError
from streamback.io import markdown_table as table_of
from streamback.io import write_json, write_text
from streamback.measure.memory import estimate_step_memory
from streamback.measure.step import (
    CPU_SHAPES,
    GPU_SHAPES,
    VARIANTS,
    add_step_arguments,
    flops_per_token,
    model_args,
    parse_names,
    random_tokens,
    require_positive,
    step_seconds,
    step_sizes,
    training_step,
)
from streamback.measure.traffic import signals_cost
from streamback.model import compute
from streamback.model.model import Transformer
from streamback.model.reversible import SavedTensorBytes
from streamback.train.parallel import apply_compile
from streamback.train.signals import StreamRecord

HELP = "time a training step of every shape x block x eager/compiled; tokens/s, MFU, memory"

MODES = ("eager", "compiled")
MIN_STEPS = 10  # fewer timed steps give no stable median (a 2-step CPU run put StreamBack far off the baseline)
NOISE_LIMIT = 0.05  # half-width of the median's 95% interval, relative to it, beyond which a speed is uncertain


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_step_arguments(parser, per_device=True)
    parser.add_argument(
        "--shapes",
        default=None,
        help=f"comma-separated shape names (default: {GPU_SHAPES} on a GPU, {CPU_SHAPES} on the CPU)",
    )
    parser.add_argument(
        "--modes",
        default=None,
        help="comma-separated, from eager, compiled (default: both on a GPU; eager on the CPU, "
        "where compiling needs a C++ compiler and about a minute a configuration)",
    )
    parser.add_argument(
        "--steps", type=int, default=20, help=f"timed steps per configuration (under {MIN_STEPS} get a warning)"
    )
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (compilation happens here)")
    parser.add_argument(
        "--threads", type=int, default=None, help="CPU threads (default: 1 on the CPU, torch's choice with a GPU)"
    )
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    parser.add_argument(
        "--no-estimate", dest="estimate", action="store_false", help="skip the fake-tensor peak-memory estimate"
    )
    parser.add_argument(
        "--out", type=Path, default=layout.BENCH_FILE, help="JSON output; the table goes beside it as .md"
    )


def run(args: argparse.Namespace) -> int:
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise StreambackError("--device cuda: no CUDA device is available")
    step_sizes(args, device)
    require_positive(args, ("batch", "seq_len", "vocab_size", "steps"))
    if args.threads is not None and args.threads < 1:
        raise StreambackError(f"--threads must be at least 1, got {args.threads}")
    config = load_config(args.config)
    model_cfg, args.stream_every = config["model"], config["train"]["log"]["stream_every"]
    shapes = parse_names(
        args.shapes or (GPU_SHAPES if device.type == "cuda" else CPU_SHAPES), model_cfg["shapes"], "shapes"
    )
    variants = parse_names(args.variants, VARIANTS, "variants")
    modes = parse_names(args.modes or (",".join(MODES) if device.type == "cuda" else "eager"), MODES, "modes")
    if args.seq_len > model_cfg["max_seq_len"]:
        raise StreambackError(
            f"--seq-len {args.seq_len} exceeds model.max_seq_len {model_cfg['max_seq_len']} of {args.config}"
        )
    threads, previous = args.threads or (1 if device.type == "cpu" else None), torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        result = measure(args, device, model_cfg, shapes, variants, modes)
    finally:
        torch.set_num_threads(previous)  # as it was, for a caller in the same process (benchmarks/gpu_checks.py)
    table = markdown_table(result)
    write_json(args.out, result)
    write_text(args.out.with_suffix(".md"), table)
    print(table)
    return 0


def measure(args: argparse.Namespace, device: torch.device, model_cfg: dict, shapes, variants, modes) -> dict:
    """Time every configuration, printing a line as each finishes; the result (see `run`)."""
    warnings = []
    if args.steps < MIN_STEPS:
        warnings.append(
            f"{args.steps} timed step(s) per configuration are too few for a stable ratio to the baseline (a 2-step "
            f"run "
            f"put StreamBack at 1.87x): time at least {MIN_STEPS} (--steps)"
        )
        print(f"warning: {warnings[-1]}", flush=True)
    matmul, kernels = matmul_flops(device), compute.path(device)
    print(
        f"bf16 compute on {device_name(device)}: {kernels} (cpu_bf16 {compute.mode()}); its matmul {matmul / 1e12:.2f} "
        f"TFLOP/s; "
        f"a training step of {args.batch} x {args.seq_len} tokens, "
        f"vocabulary {args.vocab_size}, {args.steps} timed after {args.warmup} untimed, {torch.get_num_threads()} "
        f"thread(s); "
        f"live signals every {args.stream_every} steps"
    )
    print("  ".join(COLUMNS), flush=True)
    rows, estimates = [], {}
    for shape in shapes:
        for mode in modes:
            for variant in variants:
                row = {"shape": shape, "variant": variant, "mode": mode}
                row.update(bench_one(model_cfg, shape, variant, mode, args, device, matmul))
                if args.estimate and (shape, variant) not in estimates:  # the same for every mode
                    margs = model_args(model_cfg, shape, variant, args.vocab_size)
                    estimates[shape, variant] = (
                        estimate_step_memory(margs, args.batch, args.seq_len)["peak"] / 2**30,
                        signals_cost(margs, args.batch, args.seq_len, args.stream_every),
                    )
                peak, cost = estimates.get((shape, variant), (None, None))
                row.update(
                    est_peak_gib=peak,
                    signals_bytes_share=cost and cost["bytes_share"],
                    signals_flops_share=cost and cost["flops_share"],
                )
                rows.append(row)
                print(_format_row(row, rows), flush=True)
    noisy = [r for r in rows if not r.get("error") and (r["median_noise"] is None or r["median_noise"] > NOISE_LIMIT)]
    if noisy and args.steps >= MIN_STEPS:
        warnings.append(
            f"the median step time of {len(noisy)} of {len(rows)} configurations is known only to more than "
            f"+-{100 * NOISE_LIMIT:.0f}% (95%; the 'median +-' column): ratios to the baseline within that are noise. "
            "A busy machine? Time more steps (--steps), with the machine otherwise idle"
        )
        print(f"warning: {warnings[-1]}", flush=True)
    return {
        "device": device_name(device),
        "torch": torch.__version__,
        "compute": kernels,
        "matmul_tflops": matmul / 1e12,
        "batch": args.batch,
        "seq_len": args.seq_len,
        "vocab_size": args.vocab_size,
        "steps": args.steps,
        "warmup": args.warmup,
        "threads": torch.get_num_threads(),
        "stream_every": args.stream_every,
        "rows": rows,
        "warnings": warnings,
    }


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def _sync(device: torch.device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_flops(device: torch.device) -> float:
    """Measured bf16 matmul rate (FLOP/s) of square matrices on random data (median of timed
    products after warm-up), on the kernels the model's bf16 compute takes (`compute.linear`):
    the MFU denominator."""
    n = 8192 if device.type == "cuda" else 1024
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        compute.linear(a, b)
    _sync(device)
    return (
        2
        * n**3
        / statistics.median(step_seconds(lambda: compute.linear(a, b), 20 if device.type == "cuda" else 3, device))
    )


def median_interval(times: list[float], confidence: float = 0.95) -> tuple[float, float] | None:
    """A distribution-free interval for the median of `times`: the order statistics x_(j) and
    x_(n+1-j) for the largest j whose coverage, 1 - 2 P(Binomial(n, 1/2) < j), is at least
    `confidence` (n = 10: the 2nd and 9th of the sorted times, 97.9%); None when n is too small
    for any (n < 6 at 95%)."""
    n, ordered = len(times), sorted(times)
    best = None
    for j in range(1, n // 2 + 1):
        if 1 - 2 * sum(math.comb(n, i) for i in range(j)) / 2**n >= confidence:
            best = j
    return None if best is None else (ordered[best - 1], ordered[n - best])


def median_noise(times: list[float]) -> float | None:
    """Half the width of the median's 95% interval over the median (None when there is none)."""
    interval = median_interval(times)
    return None if interval is None else (interval[1] - interval[0]) / (2 * statistics.median(times))


def bench_one(model_cfg, shape, variant, mode, args, device, matmul) -> dict:
    margs = model_args(model_cfg, shape, variant, args.vocab_size)
    tokens = random_tokens(args.vocab_size, args.batch, args.seq_len, device)
    model = None
    try:
        with torch.device(device):
            model = Transformer(margs)
        model.init_weights(0)
        if mode == "compiled":
            apply_compile(model)

        def step():
            training_step(model, tokens)

        for _ in range(args.warmup):
            step()
        _sync(device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        times = step_seconds(step, args.steps, device)
        seconds = statistics.median(times)
        peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
        record = StreamRecord(model, signals=True)

        def signal_step():  # the trainer's step every stream_every: its forward under the stream record
            with record.capture() as stream:
                training_step(model, tokens)
            record.add(stream)

        signal_step()  # a compiled block compiles its parts-returning variant here
        signal_seconds = statistics.median(step_seconds(signal_step, args.steps, device))
        model.zero_grad(set_to_none=True)
        counter = SavedTensorBytes()
        with counter:
            logits = model(tokens[:, :-1])
        saved = (
            sum(model.reversible_stats[k] for k in ("kept_bytes", "delta_bytes"))
            if margs.reversible
            else counter.nbytes
        )
        del logits
        tokens_per_s = args.batch * args.seq_len / seconds
        return {
            "tokens_per_s": tokens_per_s,
            "step_s": seconds,
            "step_spread": max(times) / min(times),
            "median_noise": median_noise(times),
            "mfu": flops_per_token(model, args.seq_len) * tokens_per_s / matmul,
            "peak_mem_gib": peak,
            "saved_activation_bytes": saved,
            "signals_step_s": signal_seconds,
            "signals_time_share": (signal_seconds - seconds) / (args.stream_every * seconds),
            "error": None,
        }
    except Exception as err:  # report this configuration's failure (OOM, compiler) and go on
        return {"error": f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"}
    finally:
        del model
        gc.collect()
        if mode == "compiled":
            torch._dynamo.reset()
        if device.type == "cuda":
            torch.cuda.empty_cache()


def _baseline_ratio(row, rows):
    base = next(
        (r for r in rows if r["shape"] == row["shape"] and r["mode"] == row["mode"] and r["variant"] == "baseline"),
        None,
    )
    if base is None or base.get("error") or row.get("error"):
        return None
    return row["tokens_per_s"] / base["tokens_per_s"]


COLUMNS = (
    "shape",
    "variant",
    "mode",
    "tok/s",
    "vs baseline",
    "median +-",
    "spread",
    "MFU",
    "peak GiB",
    "est. GiB",
    "saved MiB",
    "signals time",
    "signals bytes",
    "signals FLOPs",
)


def _cells(row, rows):
    if row.get("error"):
        return [row["shape"], row["variant"], row["mode"], row["error"]] + [""] * (len(COLUMNS) - 4)
    ratio = _baseline_ratio(row, rows)
    return [
        row["shape"],
        row["variant"],
        row["mode"],
        f"{row['tokens_per_s']:,.0f}",
        "" if ratio is None else f"{ratio:.3f}",
        "n/a" if row.get("median_noise") is None else f"{100 * row['median_noise']:.1f}%",
        f"{row['step_spread']:.2f}",
        f"{100 * row['mfu']:.1f}%",
        "n/a" if row["peak_mem_gib"] is None else f"{row['peak_mem_gib']:.2f}",
        "" if row.get("est_peak_gib") is None else f"{row['est_peak_gib']:.2f}",
        f"{row['saved_activation_bytes'] / 2**20:,.1f}",
        f"{100 * row['signals_time_share']:+.2f}%",
        "" if row.get("signals_bytes_share") is None else f"{100 * row['signals_bytes_share']:.2f}%",
        "" if row.get("signals_flops_share") is None else f"{100 * row['signals_flops_share']:.4f}%",
    ]


def _format_row(row, rows) -> str:
    return "  ".join(_cells(row, rows))


def table(result: dict) -> tuple[tuple[str, ...], list[list]]:
    """The table's header and rows of text cells, as bench.md and the study page show them."""
    return COLUMNS, [_cells(row, result["rows"]) for row in result["rows"]]


def markdown_table(result: dict) -> str:
    head = (
        f"Training step (forward + backward, bf16 compute: {result.get('compute', 'native bf16')}), micro-batch "
        f"{result['batch']} x {result['seq_len']}, "
        f"vocabulary {result['vocab_size']}, on {result['device']} (torch {result['torch']}); "
        f"MFU against a measured bf16 matmul rate of {result['matmul_tflops']:.2f} TFLOP/s. Signals: the live "
        f"precision signals' "
        f"cost as a share of the step when they run every {result.get('stream_every', '?')} steps (time: measured, the "
        f"stream record "
        f"with its envelope; bytes and FLOPs: counted on fake tensors, the signals alone).\n\n"
    )
    notes = "".join(f"\nWarning: {w}\n" for w in result.get("warnings", []))
    return head + table_of(*table(result)) + notes
