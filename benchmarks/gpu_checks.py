"""Every check of the project that needs a GPU, in one call that fits a lent machine's budget.

    PYTHONPATH=. python benchmarks/gpu_checks.py --out DIR                 # on a CUDA machine
    PYTHONPATH=. python benchmarks/gpu_checks.py --device cpu --quick --out DIR   # CPU, tiny sizes

Phases, in this order (`--parts` picks some), each check printed PASS/FAIL/INFO with its measured
number as it finishes; a failing check does not stop the others:
1. env: torch, GPU, capability; bf16 matmul rate (8192^3, random data, median of 10 timed by CUDA
   events, result checked against fp32) and device-to-device copy bandwidth (bytes read + written).
2. checks (tiny shapes; "medium" is 4 x 106: 106 % 32 = 10, so MX/NVFP4 end in a short block, and
   4 heads x 26 != 106, as medium's 16 x 94 != 1512): the stream's dtype and grid at every layer
   boundary for baseline and every StreamFormat eagerly (forward + backward); per-block
   apply_compile (Inductor) of the paper's two blocks and of one model per formats' code path:
   dtype and grid, and nearest logits as eager's up to rounding-order noise: at most
   `EQ_EAGER_FRACTION` of them may differ (fp32 reductions and transcendentals evaluated in
   another order flip a bf16 rounding now and then: on the CPU at 4 x 128 tokens, 0 to 21 of
   49,664 medium logits; skipped roundings, Inductor without emulate_precision_casts, make
   3,869 to 4,536 differ: the INFO finding, the control);
   every format's adds, round_to and SR in one Inductor graph (equal to eager and to torch's casts,
   unbiased); eagerly, round_to nearest equal to torch's casts and SR unbiased (round_to and the
   stream formats); the reversible stream's gradients against the plain model (fp32 and bf16
   compute, activation checkpointing, compiled per block) and its rebuild error, with
   tests/test_reversible.py's tolerances.
3. fsdp: FSDP2 (apply_fsdp) under a one-process NCCL group (gloo on the CPU): every format's
   dtype at every boundary and the trainer's own check (`StreamDtypeWatch`), eager and compiled
   then sharded (the trainer's order), the reversible stream, and FSDP2's default policy caught.
4. train: `torchrun --standalone --nproc-per-node 1 -m streamback train` of the checks' "medium"
   shape with compile on, at the checks' micro-batch (so Inductor's cache holds its compiled block),
   from carried token shards (`--tokens`): exit 0, finite and falling loss, validation.
   One process never builds FSDP2 or a process group (the trainer needs WORLD_SIZE > 1): phase 3
   covers FSDP2 with NCCL.
   eval: the `streamback` lm-eval backend's batched log-likelihood scoring (streamback.eval.scoring,
   no lm-eval on the device): fp32 batches equal one request at a time; items/s of each paper block.
   analysis: `streamback analyze`'s computations (streamback.analysis; no altair on the device, so no
   figures) on a random model of each paper shape, deepest first, at config/paper.yaml's analysis
   batch: seconds and peak GPU memory of layer-error (fp32 ground truth + every stream variant; its
   fp32 stream closer to the truth than its bf16 stream, the check), swallowed and envelope, and the
   window-loss rate that loss-difference runs at. A shape starts only while 40% of the budget is left.
5. bench: `streamback bench` (its CLI, one shape x mode x variant per call, in priority order:
   the issue's reference figures first) on config/paper.yaml at micro-batch 4 x 2048, until the
   time budget is spent; the rows left are listed as skipped. Goals: StreamBack >= 0.99x the
   baseline's tokens/s, tokens/s (so MFU) above the reference, reversible peak <= baseline peak.

Time: `--budget` seconds (default 420 on a GPU): compiled checks start only in the first 35%,
FSDP2's compiled ones in the first 45%, the training smoke in the first 60%, and each bench call
only if the time left covers the longest call of its kind so far. Outputs under `--out` (at most
8 files, none in subfolders, rewritten as the run goes, so a run stopped from outside keeps what
it did): summary.json (everything), summary.md (the table printed last), bench.json/.md (all
rows), train_metrics.jsonl, train.log, plus the caller's tee'd log. Exit status 1 if any check
failed (goals, findings and skipped items are reported, not failures), 0 otherwise.

On the lent H200 (torch 2.11, Python 3.12, no internet, no snakemake/datasets/jsonschema). Once,
here, in the repository root: the jsonschema stack as wheels (0.5 MB, ignored by .gitignore; attrs
and typing-extensions, which jsonschema and referencing require, are already on the device), and
the token shards of the default data stage (6 MB; the device cannot tokenize: no `datasets`):

    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1
    python -m streamback corpus && python -m streamback tokenize    # results/tokens/synthetic

Then one `run`, carry [".whl", "results/tokens/synthetic"], timeout_s 540, command:

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 || exit; set -o pipefail; python3 benchmarks/gpu_checks.py --out $OUT 2>&1 | tee $OUT/gpu_checks.log

It takes the 420 s budget plus the last item's overrun and ~20 s of installing and importing, so
with the machine's start about 9 of the session's 15 minutes. A rerun of what was skipped is
possible only at once, while the machine is still warm (30 s), e.g. the same command with
`--parts bench --bench-groups medium:compiled --budget 150` and timeout_s 240.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import gc
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import yaml

from streamback import layout
from streamback.config import DEFAULT_CONFIG, ROOT, load_config, validate_config
from streamback.io import markdown_table, write_json, write_text
from streamback.measure.bench import markdown_table as bench_table
from streamback.measure.step import step_seconds
from streamback.model.formats import STREAM_LABELS, StreamFormat
from streamback.model.model import ModelArgs, Transformer
from streamback.model.reversible import forward_residuals, step_back
from streamback.model.rounding import BF16, FP4_E2M1, FP8_E4M3, FP8_E5M2, FP16, FP32, round_to, ulp
from streamback.train.parallel import apply_activation_checkpointing, apply_compile

PARTS = ("env", "checks", "fsdp", "train", "eval", "analysis", "bench")
STREAMS = list(STREAM_LABELS)  # every format x rounding
SR_FORMATS = [StreamFormat.parse(s) for s in STREAMS if s.endswith("_sr")]
NATIVE_SPECS = [BF16, FP16, FP8_E4M3, FP8_E5M2]  # formats with a torch dtype to cast to
SR_SPECS = [BF16, FP16, FP8_E4M3, FP8_E5M2, FP4_E2M1]
SHAPES = {  # tiny shapes for the correctness checks
    "fat": dict(dim=128, n_layers=2, n_heads=4, n_kv_heads=1),
    "medium": dict(dim=106, n_layers=4, n_heads=4, n_kv_heads=1),
}
VOCAB = 97
# compiled logits may differ from eager ones in this fraction at most (see the docstring, phase 2)
EQ_EAGER_FRACTION = 1e-3
# Compiled checks, FSDP2's compiled checks and the training smoke start only before these fractions of the
# budget, so the bench keeps at least 40% of it.
SHARES = {"checks": 0.35, "fsdp": 0.45, "train": 0.60}
TRAIN_SHAPE, TRAIN_RUN = "check-medium", "check-medium-streamback"  # SHAPES["medium"], added to the config
# Plain PyTorch on one H200, torch 2.11, micro-batch 4 x 2048 (issue 3): tokens/s and peak GiB.
REFERENCE = {
    ("fat-short", "compiled", "baseline"): (55_966, 28.7),
    ("fat-short", "compiled", "streamback"): (55_344, 31.6),
    ("skinny-tall", "compiled", "baseline"): (47_030, 39.7),
    ("skinny-tall", "compiled", "streamback"): (45_940, 41.0),
    ("medium", "eager", "baseline"): (35_146, None),
    ("medium", "eager", "streamback"): (33_302, None),
}
VARIANTS = ("baseline", "streamback", "streamback-reversible")
LISTED = 20  # failures, findings and skipped items listed in the summary, each


@dataclasses.dataclass(frozen=True)
class Sizes:
    """Everything that differs between a GPU run and the quick CPU run: sizes, and how many items of
    each kind (formats compiled, bench groups); the code that runs is the same."""

    budget: float
    matmul_n: int
    copy_mib: int
    batch: int
    seq: int
    round_values: int
    sr_draws: int
    stream_sr_rows: int
    compiled_models: tuple  # (shape, stream) pairs compiled per block
    elementwise_streams: tuple  # stream formats whose adds are compiled together in one graph
    fsdp_compiled: tuple  # streams compiled and then sharded
    train_steps: int
    train_batch: int
    train_timeout: float
    bench_config: Path | None  # None: the script's own config (the default one plus TRAIN_SHAPE)
    bench_groups: tuple  # (shape, mode, variants), in priority order
    bench_batch: int
    bench_seq: int
    bench_vocab: int
    bench_steps: int
    bench_warmup: int
    bench_first_call: dict  # mode -> seconds assumed for a call before one of its kind has run


GPU = Sizes(
    budget=420, matmul_n=8192, copy_mib=1024, batch=4, seq=128, round_values=1_000_000, sr_draws=20_000,
    stream_sr_rows=20_000,
    # the paper's two blocks, then one model per code path of the formats (every format: elementwise_streams)
    compiled_models=(("fat", "baseline"), ("fat", "fp32"), ("medium", "baseline"), ("medium", "fp32"), ("medium", "bf16"),
                     ("medium", "mxfp8"), ("medium", "nvfp4_sr")),
    elementwise_streams=tuple(STREAMS),
    fsdp_compiled=("baseline", "fp32"),
    train_steps=60, train_batch=32, train_timeout=180,
    bench_config=ROOT / "config" / "paper.yaml",
    bench_groups=(
        ("fat-short", "compiled", VARIANTS), ("skinny-tall", "compiled", VARIANTS), ("medium", "eager", VARIANTS),
        ("fat-short", "eager", VARIANTS), ("skinny-tall", "eager", VARIANTS), ("medium", "compiled", VARIANTS),
    ),
    bench_batch=4, bench_seq=2048, bench_vocab=128256, bench_steps=10, bench_warmup=3,
    bench_first_call={"eager": 15, "compiled": 60},
)
QUICK = Sizes(
    budget=300, matmul_n=256, copy_mib=16, batch=2, seq=16, round_values=20_000, sr_draws=2_000, stream_sr_rows=2_000,
    compiled_models=(("medium", "fp8_e4m3"),),
    elementwise_streams=("bf16", "fp8_e4m3_sr"),  # a nearest and a stochastic one
    fsdp_compiled=("fp32",),
    train_steps=12, train_batch=8, train_timeout=240,
    # the shape and micro-batch of the reversible check and the training smoke: Inductor's cache has the block
    bench_config=None,
    bench_groups=((TRAIN_SHAPE, "eager", VARIANTS), (TRAIN_SHAPE, "compiled", ("streamback",))),
    bench_batch=2, bench_seq=16, bench_vocab=64, bench_steps=1, bench_warmup=1,
    bench_first_call={"eager": 5, "compiled": 30},
)


# ---- bookkeeping ---------------------------------------------------------------------------------


class Report:
    """Checks, findings and skipped items as they happen; the time budget."""

    def __init__(self, budget: float, out: Path):
        self.start, self.budget, self.out = time.perf_counter(), budget, out
        self.checks: list[dict] = []
        self.env: dict = {}
        self.train: dict = {}
        self.bench: dict = {}

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def left(self) -> float:
        return self.budget - self.elapsed()

    def late(self, phase: str) -> bool:
        """Past the time after which `phase` starts nothing new (SHARES)?"""
        return self.elapsed() > SHARES[phase] * self.budget

    def record(self, group: str, name: str, ok: bool | None, value: str) -> None:
        """ok: True/False for a check, None for a finding (reported, never a failure), "skipped"."""
        status = {True: "PASS", False: "FAIL", None: "INFO", "skipped": "SKIP"}[ok]
        self.checks.append({"group": group, "name": name, "status": status, "value": value, "at_s": round(self.elapsed(), 1)})
        print(f"[{self.elapsed():6.1f} s] {status} {group}/{name}: {value}", flush=True)

    @contextlib.contextmanager
    def guard(self, group: str, name: str):
        """Run a check's body; an exception is that check's failure, and the others go on."""
        try:
            yield
        except Exception as err:  # a check that breaks is a failed check, not the end of the run
            text = str(err).strip().splitlines()
            self.record(group, name, False, f"{type(err).__name__}: {text[0][:300] if text else ''}")
        finally:
            gc.collect()

    def failed(self) -> list[dict]:
        return [c for c in self.checks if c["status"] == "FAIL"]

    def save(self) -> None:
        write_json(self.out / "summary.json", {
            "env": self.env, "checks": self.checks, "train": self.train, "bench": self.bench,
            "elapsed_s": round(self.elapsed(), 1), "budget_s": self.budget, "failed": len(self.failed()),
        })


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_ms(fn, device: torch.device, reps: int = 10, warmup: int = 3) -> float:
    """Median time of `fn` in ms (`streamback.bench.step_seconds`: CUDA events on a GPU)."""
    for _ in range(warmup):
        fn()
    _sync(device)
    times = [1e3 * s for s in step_seconds(fn, reps, device)]
    return statistics.median(times)


# ---- 1. environment ------------------------------------------------------------------------------


def environment(report: Report, device: torch.device, sizes: Sizes) -> None:
    env = {"torch": torch.__version__, "python": sys.version.split()[0], "device": device.type}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(name=props.name, capability=f"{props.major}.{props.minor}", sms=props.multi_processor_count,
                   memory_gib=round(props.total_memory / 2**30, 1), cuda=torch.version.cuda)
    else:
        env.update(name="cpu", threads=torch.get_num_threads())
    report.env.update(env)
    with report.guard("env", "matmul_bf16"):
        n = sizes.matmul_n
        g = torch.Generator(device=device).manual_seed(0)
        a = torch.randn(n, n, device=device, dtype=torch.bfloat16, generator=g)
        b = torch.randn(n, n, device=device, dtype=torch.bfloat16, generator=g)
        out = torch.full((n, n), math.nan, device=device, dtype=torch.bfloat16)
        ms = median_ms(lambda: torch.matmul(a, b, out=out), device)
        rows = slice(0, min(n, 256))  # checked against fp32 on a slice: bf16 operands land within 1e-2
        ref = a[rows].float() @ b.float()
        error = ((out[rows].float() - ref).norm() / ref.norm()).item()
        report.env["matmul_bf16_tflops"] = 2 * n**3 / (ms / 1e3) / 1e12
        report.record("env", "matmul_bf16", error < 1e-2 and not out.isnan().any().item(),
                      f"{report.env['matmul_bf16_tflops']:.1f} TFLOP/s ({n}^3, median {ms:.3f} ms), rel. error {error:.1e}")
    with report.guard("env", "copy"):
        src = torch.randn(sizes.copy_mib * 2**18, device=device)
        dst = torch.full_like(src, math.nan)
        ms = median_ms(lambda: dst.copy_(src), device)
        report.env["copy_tb_s"] = 2 * src.nbytes / (ms / 1e3) / 1e12
        report.record("env", "copy", torch.equal(dst, src),
                      f"{report.env['copy_tb_s']:.2f} TB/s read + write ({2 * src.nbytes / 2**30:.2f} GiB, median {ms:.3f} ms)")


# ---- 2. correctness on the device ------------------------------------------------------------


def build(shape: str, stream: str, device: torch.device, compute=torch.bfloat16, reversible=False, n_layers=None) -> Transformer:
    """A tiny model (stream "baseline" = the baseline block) on `device`, seeded weights."""
    block = "baseline" if stream == "baseline" else "streamback"
    dims = {**SHAPES[shape], **({"n_layers": n_layers} if n_layers else {})}
    args = ModelArgs(**dims, vocab_size=VOCAB, multiple_of=32, max_seq_len=256, block=block,
                     stream="fp32" if block == "baseline" else stream, reversible=reversible)
    with torch.device(device):
        model = Transformer(args, compute)
    model.init_weights(0)
    return model


def tokens(device: torch.device, sizes: Sizes, extra: int = 0) -> torch.Tensor:
    """[batch, seq + extra] random tokens (extra = 1: inputs and next-token targets)."""
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, VOCAB, (sizes.batch, sizes.seq + extra), generator=g).to(device)


def stream_verdict(seen: list, fmt: StreamFormat, n_layers: int) -> tuple[bool, str]:
    off = [k for k, h in enumerate(seen) if h.dtype != fmt.container_dtype or not fmt.is_representable(h.detach())]
    dtypes = sorted({str(h.dtype).removeprefix("torch.") for h in seen})
    ok = len(seen) == n_layers + 1 and not off
    return ok, f"{len(seen)} boundaries, dtype {'/'.join(dtypes)} (expected {str(fmt.container_dtype).removeprefix('torch.')}), {len(off)} off dtype or grid"


def check_stream_eager(report: Report, device, sizes: Sizes) -> None:
    for stream in ["baseline", *STREAMS]:
        with report.guard("stream_dtype_eager", stream):
            model = build("medium", stream, device)
            with model.capture(("residual",)) as seen:
                model(tokens(device, sizes)).float().sum().backward()
            ok, text = stream_verdict(seen["residual"], model.stream_format, model.args.n_layers)
            grad = model.layers[0].attention.wq.weight.grad
            ok = ok and grad.dtype == torch.float32 and bool(grad.isfinite().all()) and grad.abs().sum().item() > 0
            report.record("stream_dtype_eager", stream, ok, text + ", fp32 grads finite")


def check_stream_compiled(report: Report, device, sizes: Sizes) -> None:
    """Per-block compile: the stream's dtype and grid, and nearest logits equal to eager bit for bit."""
    for shape, stream in sizes.compiled_models:
        name = f"{shape}/{stream}"
        if report.late("checks"):
            report.record("compiled", name, "skipped", "time budget")
            continue
        with report.guard("compiled", name):
            model = build(shape, stream, device)
            began = time.perf_counter()
            differ, text, seen = eager_vs_compiled(model, tokens(device, sizes), apply_compile)
            ok, dtype_text = stream_verdict(seen, model.stream_format, model.args.n_layers)
            report.record("compiled_stream_dtype", name, ok, f"{dtype_text} (compile + run {time.perf_counter() - began:.1f} s)")
            if model.stream_format.rounding == "nearest":
                report.record("compiled_eq_eager", name, differ <= EQ_EAGER_FRACTION, text)
        torch._dynamo.reset()


def eager_vs_compiled(model, tok, compile_model) -> tuple[float, str, list]:
    """Logits of `model` eagerly, then after `compile_model(model)`: the fraction differing, a line
    saying how far and at which layer boundary the streams first part, and the compiled stream."""
    with torch.no_grad(), model.capture(("residual",)) as stream:
        eager = model(tok)
    eager_seen = stream["residual"]
    compile_model(model)
    with torch.no_grad(), model.capture(("residual",)) as stream:
        compiled = model(tok)
    seen = stream["residual"]
    differ = int((eager != compiled).sum())
    text = f"{differ:,} of {eager.numel():,} logits differ (max |diff| {(compiled - eager).abs().max().item():.3g})"
    parted = [k for k, (a, b) in enumerate(zip(eager_seen, seen)) if not torch.equal(a, b)]
    if parted:
        k = parted[0]
        text += f"; streams part at boundary {k} of {len(seen)} ({int((eager_seen[k] != seen[k]).sum())} elements)"
    return differ / eager.numel(), text, seen


def finding_without_emulate(report: Report, device, sizes: Sizes) -> None:
    """The control for apply_compile's emulate_precision_casts: Inductor without it."""
    if report.late("checks"):
        report.record("finding", "inductor_without_emulate_precision_casts", "skipped", "time budget")
        return
    with report.guard("finding", "inductor_without_emulate_precision_casts"):
        def compile_without_emulate(model):  # apply_compile less its emulate_precision_casts option
            for layer in model.layers:
                layer.compile(backend="inductor")

        _, text, _ = eager_vs_compiled(build("medium", "baseline", device), tokens(device, sizes), compile_without_emulate)
        report.record("finding", "inductor_without_emulate_precision_casts", None,
                      f"medium baseline: {text} (with it: compiled_eq_eager/medium/baseline)")
    torch._dynamo.reset()


def _values(spec, n: int, seed: int) -> torch.Tensor:
    """Random fp32 of both signs, log-uniform over `spec`'s range, subnormals included (tests/test_rounding.py)."""
    g = torch.Generator().manual_seed(seed)
    low, high = spec.min_exponent - spec.mantissa_bits - 2, math.log2(spec.max_value)
    exponent = low + (high - low) * torch.rand(n, generator=g, dtype=torch.float64)
    sign = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0).double()
    x = (sign * torch.exp2(exponent)).float()
    return x[x.abs() <= spec.max_value]


def check_rounding(report: Report, device, sizes: Sizes) -> None:
    for spec in NATIVE_SPECS:
        with report.guard("round_to_nearest_eq_cast", spec.name):
            x = _values(spec, sizes.round_values, 0).to(device)
            if spec is BF16:  # and every kind of bit pattern: fp32 subnormals, overflow to inf (NaN compared apart)
                bits = torch.randint(-(2**31), 2**31 - 1, (sizes.round_values,), generator=torch.Generator().manual_seed(1))
                x = torch.cat([x, bits.to(torch.int32).view(torch.float32).to(device)])
            ours, theirs = round_to(x, spec), x.to(spec.dtype).float()
            nan = torch.isnan(x)
            wrong = int((ours[~nan] != theirs[~nan]).sum()) + int((~torch.isnan(ours[nan])).sum())
            report.record("round_to_nearest_eq_cast", spec.name, wrong == 0, f"{wrong} of {x.numel():,} differ")
    for spec in SR_SPECS:
        with report.guard("round_to_sr_unbiased", spec.name):
            g = torch.Generator(device=device).manual_seed(2)
            grid = round_to(_values(spec, 4000, 3), spec)
            grid = grid[(grid != 0) & (grid.abs() < spec.max_value / 2)][:64].to(device)
            fraction = 0.05 + 0.9 * torch.rand(grid.shape, generator=g, dtype=torch.float64, device=device)
            gap = ulp(grid, spec)
            values = (grid.double().sign() * (grid.double().abs() + fraction * gap)).float()
            x = values.repeat(sizes.sr_draws, 1)
            out = round_to(x, spec, "stochastic", generator=g)
            error = (out - x).double()
            z = (error.mean(0) / (error.std(0) / math.sqrt(sizes.sr_draws))).abs().max().item()
            on_grid = torch.equal(round_to(out, spec), out) and bool(((out - x).abs() < gap.float()).all())
            report.record("round_to_sr_unbiased", spec.name, on_grid and z < 5,
                          f"max |z| of the mean error {z:.2f} (< 5) over {sizes.sr_draws:,} draws x 64 values; on grid, within a gap: {on_grid}")


def _sr_rows(fmt: StreamFormat) -> list[float]:
    """A row whose exact values lie between grid points; the first element fixes the block scales (tests/test_formats.py)."""
    if fmt.name == "mxfp8":
        return [256.0, 1.3, -7.77, 0.0123, 100.5, -300.0, 0.6]
    if fmt.name == "nvfp4":
        return [10.5, 1.3, -0.7, 2.6, 5.1, 0.2, -4.4] + [0] * 9 + [6.0, 3.3, -0.3, 0.2]
    return [1.3, -7.77, 0.0123, 100.5, -300.0, 0.6, 1.0 + 2.0**-10]


def _sr_inputs(fmt: StreamFormat, device, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    exact = torch.zeros(32)
    values = _sr_rows(fmt)
    exact[: len(values)] = torch.tensor(values)
    exact = exact.to(device).expand(rows, 32)
    return fmt.enter(torch.zeros(rows, 32, device=device)), exact


def sr_verdict(fmt: StreamFormat, draws: torch.Tensor, exact: torch.Tensor) -> tuple[bool, str]:
    draws = draws.double()
    low, high, mean, target = draws.min(0).values, draws.max(0).values, draws.mean(0), exact[0].double()
    nearest = StreamFormat(fmt.name).add(*_sr_inputs(fmt, exact.device, 1))[0].double()
    off_grid = nearest != target
    tolerance = 5 * (high - low) / 2 / math.sqrt(draws.shape[0])
    bracketed = bool(((low <= target) & (target <= high)).all()) and bool((high > low)[off_grid].all())
    worst = ((mean - target).abs() / tolerance.clamp_min(1e-300))[off_grid].max().item()
    ok = bracketed and worst <= 1 and bool(((mean - target).abs() <= tolerance).all())
    return ok, f"worst |mean - exact| {worst:.2f} x its 5-sigma bound, over {draws.shape[0]:,} draws; both neighbours drawn: {bracketed}"


def check_stream_sr(report: Report, device, sizes: Sizes) -> None:
    torch.manual_seed(3)
    for fmt in SR_FORMATS:
        with report.guard("stream_sr_unbiased", fmt.label):
            h, exact = _sr_inputs(fmt, device, sizes.stream_sr_rows)
            report.record("stream_sr_unbiased", fmt.label, *sr_verdict(fmt, fmt.add(h, exact), exact))


def _two_steps(fmt: StreamFormat, x, d, d16):
    # d16 is a graph input: Inductor would fold an in-graph d.bfloat16() into the fused add
    return fmt.add(fmt.add(fmt.enter(x), d), d16)


def _elementwise(formats, round_inputs, x, d, d16, sr_h, sr_exact):
    """Everything elementwise the formats do, for one Inductor graph: nearest roundings, two stream
    adds per format (width 40: MX and NVFP4 end in short blocks), stochastic stream adds."""
    return (
        [round_to(v, spec) for v, spec in zip(round_inputs, NATIVE_SPECS)],
        [_two_steps(fmt, x, d, d16) for fmt in formats],
        [fmt.add(h, e) for fmt, h, e in zip([f for f in formats if f.rounding == "stochastic"], sr_h, sr_exact)],
    )


def check_elementwise_compiled(report: Report, device, sizes: Sizes) -> None:
    if report.late("checks"):
        report.record("elementwise_compiled", "all", "skipped", "time budget")
        return
    torch._dynamo.reset()
    formats = [StreamFormat.parse(s) for s in sizes.elementwise_streams]
    stochastic = [f for f in formats if f.rounding == "stochastic"]
    with report.guard("elementwise_compiled", "compile"):
        round_inputs = [_values(spec, sizes.round_values, 0).to(device) for spec in NATIVE_SPECS]
        g = torch.Generator().manual_seed(5)
        x, d = (torch.randn(2, 3, 40, generator=g) * 4).to(device), torch.randn(2, 3, 40, generator=g).to(device)
        d16 = torch.randn(2, 3, 40, generator=g).bfloat16().to(device)
        sr = [_sr_inputs(fmt, device, sizes.stream_sr_rows) for fmt in stochastic]
        args = (formats, round_inputs, x, d, d16, [h for h, _ in sr], [e for _, e in sr])
        began = time.perf_counter()
        rounded, stream, sr_draws = torch.compile(_elementwise, fullgraph=True)(*args)
        _sync(device)
        report.record("elementwise_compiled", "compile", True, f"one graph, fullgraph, {time.perf_counter() - began:.1f} s")
        eager_stream = [_two_steps(fmt, x, d, d16) for fmt in formats]
        for spec, v, out in zip(NATIVE_SPECS, round_inputs, rounded):
            wrong = int((out != v.to(spec.dtype).float()).sum())
            report.record("round_to_nearest_compiled_eq_cast", spec.name, wrong == 0, f"{wrong} of {v.numel():,} differ")
        for fmt, out, ref in zip(formats, stream, eager_stream):
            ok = out.dtype == fmt.container_dtype and fmt.is_representable(out)
            text = f"dtype {str(out.dtype).removeprefix('torch.')}, on grid: {ok}"
            if fmt.rounding == "nearest":
                ok = ok and torch.equal(out, ref)
                text += f", equal to eager: {torch.equal(out, ref)}"
            report.record("stream_add_compiled", fmt.label, ok, text)
        for fmt, (_, exact), draws in zip(stochastic, sr, sr_draws):
            report.record("stream_sr_unbiased_compiled", fmt.label, *sr_verdict(fmt, draws, exact))
    torch._dynamo.reset()


def reversible_pair(device, compute, n_layers=None):
    """A plain fp32-stream StreamBack model and its reversible twin, same weights, stream values ~30x the init's."""
    plain = build("medium", "fp32", device, compute, n_layers=n_layers)
    with torch.no_grad():
        plain.tok_embeddings.weight.mul_(30)
    twin = build("medium", "fp32", device, compute, reversible=True, n_layers=n_layers)
    twin.load_state_dict(plain.state_dict())
    return plain, twin


def _loss(model, tok):
    return F.cross_entropy(model(tok[:, :-1]).flatten(0, 1), tok[:, 1:].flatten())


def grad_error(plain, twin) -> float:
    """max over parameters of max|g_plain - g_twin| / max|g_plain|."""
    return max(((p.grad - q.grad).abs().max() / p.grad.abs().max()).item() for p, q in zip(plain.parameters(), twin.parameters()))


def check_reversible(report: Report, device, sizes: Sizes) -> None:
    layers = SHAPES["medium"]["n_layers"]
    residual = sizes.batch * sizes.seq * SHAPES["medium"]["dim"]  # elements of one residual
    tok = tokens(device, sizes, extra=1)
    cases = [  # name, compute, checkpointing, compiled, gradient tolerance, residual bytes dropped
        ("fp32_compute", torch.float32, False, False, 1e-5, 2 * layers * residual * 4),
        ("bf16_compute", torch.bfloat16, False, False, 1e-2, 2 * layers * residual * 4),
        ("activation_checkpointing", torch.float32, True, False, 1e-5, layers * residual * 4),
        ("compiled_per_block", torch.bfloat16, False, True, 1e-2, 2 * layers * residual * 4),
    ]
    for name, compute, checkpointing, compiled, tol, dropped in cases:
        if compiled and report.late("checks"):
            report.record("reversible", name, "skipped", "time budget")
            continue
        with report.guard("reversible", name):
            plain, twin = reversible_pair(device, compute)
            if checkpointing:
                for model in (plain, twin):
                    apply_activation_checkpointing(model)
            if compiled:
                apply_compile(twin)
            plain_loss, twin_loss = _loss(plain, tok), _loss(twin, tok)
            same = torch.equal(plain_loss, twin_loss)
            plain_loss.backward()
            twin_loss.backward()
            error, got = grad_error(plain, twin), twin.reversible_stats["dropped_bytes"]
            ok = error <= tol and got == dropped and (same or compute == torch.float32)
            report.record("reversible", name, ok,
                          f"grad error {error:.2e} (<= {tol:g}), loss equal to plain: {same}, dropped {got:,} B (expected {dropped:,})")
        torch._dynamo.reset()
    with report.guard("reversible", "rebuild_error"):
        plain, _ = reversible_pair(device, torch.float32, n_layers=8)
        slots, deltas = forward_residuals(plain, tok[:, :-1])
        value, worst, inexact = slots[-1], 0.0, 0
        for k in range(len(deltas) - 1, -1, -1):
            value = step_back(value, deltas[k])
            spacing = ulp(slots[k].abs().max().reshape(1), FP32).item()
            worst = max(worst, (value - slots[k]).abs().max().item() / (spacing * (len(deltas) - k)))
            inexact += int(not torch.equal(value, slots[k]))
        report.record("reversible", "rebuild_error", worst <= 2,
                      f"worst rebuild error {worst:.2f} fp32 ulps of max|h| per step down (<= 2); {inexact} of {len(deltas)} slots inexact")


def run_checks(report: Report, device, sizes: Sizes) -> None:
    check_stream_eager(report, device, sizes)
    check_rounding(report, device, sizes)
    check_stream_sr(report, device, sizes)
    check_reversible(report, device, sizes)
    check_stream_compiled(report, device, sizes)
    finding_without_emulate(report, device, sizes)
    check_elementwise_compiled(report, device, sizes)


# ---- 3. FSDP2 ------------------------------------------------------------------------------------


def run_fsdp(report: Report, device, sizes: Sizes, work: Path) -> None:
    """FSDP2 on a one-process group: NCCL on a GPU (the trainer's backend), gloo on the CPU."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from streamback.train.parallel import (
        StreamDtypeWatch,  # the trainer's own check of the stream's dtype
        apply_fsdp,
    )

    backend = "nccl" if device.type == "cuda" else "gloo"
    with report.guard("fsdp", "process_group"):
        store = work / "pg-store"
        store.unlink(missing_ok=True)
        dist.init_process_group(backend, init_method=f"file://{store}", rank=0, world_size=1, timeout=datetime.timedelta(seconds=120),
                                **({"device_id": device} if device.type == "cuda" else {}))
        report.record("fsdp", "process_group", True, f"{backend}, world size 1")
    if not dist.is_initialized():
        return
    try:
        mesh = init_device_mesh(device.type, (1,))
        tok = tokens(device, sizes)
        cases = [(s, False) for s in ["baseline", *STREAMS]] + [(s, True) for s in sizes.fsdp_compiled]
        for stream, compiled in cases:
            name = f"{stream}{' compiled' if compiled else ''}"
            if compiled and report.late("fsdp"):
                report.record("fsdp_stream_dtype", name, "skipped", "time budget")
                continue
            with report.guard("fsdp_stream_dtype", name):
                model = build("medium", stream, device)
                if compiled:
                    apply_compile(model)
                apply_fsdp(model, mesh=mesh)
                watch = StreamDtypeWatch(model)
                with model.capture(("residual",)) as seen:
                    loss = model(tok).float().sum()
                watch.check_and_remove()
                loss.backward()
                ok, text = stream_verdict(seen["residual"], model.stream_format, model.args.n_layers)
                grad = model.layers[0].attention.wq.weight.grad
                ok = ok and grad.dtype == torch.float32 and grad.to_local().abs().sum().item() > 0
                report.record("fsdp_stream_dtype", name, ok, text + f"; trainer's check passed; fp32 sharded grads: {ok}")
            torch._dynamo.reset()
        with report.guard("fsdp", "reversible"):
            plain, twin = (build("fat", "fp32", device, reversible=r) for r in (False, True))
            twin.load_state_dict(plain.state_dict())
            losses = []
            for model in (plain, twin):
                apply_fsdp(model, mesh=mesh)
                losses.append(model(tok).logsumexp(-1).mean())
                losses[-1].backward()
            error = max(((p.grad.full_tensor() - q.grad.full_tensor()).abs().max() / p.grad.full_tensor().abs().max()).item()
                        for p, q in zip(plain.parameters(), twin.parameters()))
            dropped = twin.reversible_stats["dropped_bytes"]
            expected = 2 * twin.args.n_layers * tok.numel() * twin.args.dim * 4
            report.record("fsdp", "reversible", torch.equal(*losses) and error <= 1e-2 and dropped == expected,
                          f"loss equal: {torch.equal(*losses)}, grad error {error:.2e} (<= 1e-2), dropped {dropped:,} B (expected {expected:,})")
        with report.guard("fsdp", "default_policy_caught"):
            model = build("medium", "fp32", device)
            policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)  # casts forward inputs
            for layer in model.layers:
                fully_shard(layer, mesh=mesh, mp_policy=policy)
            fully_shard(model, mesh=mesh, mp_policy=policy)
            watch = StreamDtypeWatch(model)
            model(tok)
            try:
                watch.check_and_remove()
                caught = "not caught: the trainer's check passed a bf16 stream"
            except RuntimeError as err:
                caught = f"caught ({str(err)[:90]}...)"
            report.record("fsdp", "default_policy_caught", caught.startswith("caught"), f"FSDP2's default input cast {caught}")
    finally:
        dist.destroy_process_group()


# ---- 4. training smoke -----------------------------------------------------------------------


def checks_config(sizes: Sizes) -> dict:
    """The default config plus TRAIN_SHAPE (the checks' "medium") and a short compiled StreamBack run of it,
    whose micro-batch is the checks' (batch x seq): its compiled block is the reversible check's, from Inductor's cache."""
    cfg = load_config(DEFAULT_CONFIG)
    cfg["model"]["shapes"][TRAIN_SHAPE] = {**SHAPES["medium"], "multiple_of": 32}
    steps, batch, seq = sizes.train_steps, sizes.train_batch, sizes.seq
    cfg["train"].update(
        runs={"shapes": [TRAIN_SHAPE], "blocks": ["streamback"], "streams": []}, seed=0, tokens=steps * batch * seq,
        seq_len=seq, batch_size=batch, micro_batch_size=sizes.batch, compile=True, activation_checkpointing=False,
        reversible=False, per_run={}, schedule={"warmup_steps": max(1, steps // 6), "decay_steps": max(1, steps // 4)},
        checkpoint={"every": steps, "keep": 1},
        log={"every": max(1, steps // 6), "stream_every": max(1, steps // 4), "val_every": steps, "val_sequences": 16},
    )
    return validate_config(cfg)


def run_train(report: Report, device, sizes: Sizes, config: Path, tokens_dir: Path, work: Path) -> None:
    from streamback.train.metrics import read_metrics

    if report.late("train"):
        report.record("train", "smoke", "skipped", "time budget")
        return
    if not (tokens_dir / "manifest.json").exists():
        report.record("train", "smoke", False, f"no token shards in {tokens_dir}: make them here with `python -m streamback corpus && "
                      "python -m streamback tokenize` and carry results/tokens/synthetic")
        return
    root = work / "train"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    outdir, ckpt, log = root / "out", root / "ckpt", report.out / "train.log"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1", "-m", "streamback", "train",
           "--config", str(config), "--run-name", TRAIN_RUN, "--data", str(tokens_dir), "--outdir", str(outdir), "--checkpoints", str(ckpt)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    if device.type == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""  # the trainer takes a GPU whenever it sees one
    timeout = max(10.0, min(sizes.train_timeout, report.left()))
    began = time.perf_counter()
    with open(log, "w") as sink:
        try:
            status = subprocess.run(cmd, cwd=root, env=env, stdout=sink, stderr=subprocess.STDOUT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            status = f"killed after {timeout:.0f} s"
    seconds = time.perf_counter() - began
    text = log.read_text(errors="replace")
    report.train.update(command=" ".join(cmd), exit_status=status, seconds=round(seconds, 1))
    errors = [line for line in text.splitlines() if "error" in line.lower() and "elastic" not in line and "error_file" not in line]
    report.record("train", "exit_status", status == 0, f"{status} after {seconds:.1f} s" + ("" if status == 0 else f"; {(errors or ['see train.log'])[0][:300]}"))
    report.record("train", "stream_dtype_watch", status == 0 and "residual stream reaches blocks" not in text,
                  "the trainer's first-step check of the stream's dtype passed" if status == 0 else "run did not finish")
    metrics = outdir / "metrics.jsonl"
    if not metrics.exists():
        report.record("train", "metrics", False, f"{metrics} missing")
        return
    shutil.copyfile(metrics, report.out / "train_metrics.jsonl")
    records = read_metrics(metrics)
    losses = [r["loss"] for r in records]
    finite = len(records) == sizes.train_steps and all(isinstance(v, float) and math.isfinite(v) for v in losses)
    report.record("train", "loss_finite", finite, f"{len(records)} of {sizes.train_steps} steps, all finite: {finite}")
    first, last = statistics.mean(losses[:3]), statistics.mean(losses[-3:])
    report.record("train", "loss_decreases", last < 0.9 * first, f"mean of first 3 steps {first:.3f} -> last 3 {last:.3f}")
    val = records[-1].get("val_loss")
    absmax = [r["stream_absmax"] for r in records if "stream_absmax" in r]
    ok = isinstance(val, float) and math.isfinite(val) and bool(absmax) and all(math.isfinite(v) for a in absmax for v in a)
    report.record("train", "validation_and_stream", ok, f"val loss {_num(val, '.4f')}, stream max|h| recorded at {len(absmax)} steps")
    summary = json.loads((outdir / "summary.json").read_text()) if (outdir / "summary.json").exists() else {}
    report.record("train", "summary", summary.get("device") == device.type and summary.get("processes") == 1,
                  f"device {summary.get('device')}, {summary.get('processes')} process, "
                  f"{statistics.median(r['tokens_per_s'] for r in records):,.0f} tok/s median")
    report.record("train", "fsdp2", None, "one process: the trainer skips the process group and FSDP2 (WORLD_SIZE 1); see fsdp/")
    report.train.update(first_loss=first, last_loss=last, val_loss=val, steps=len(records))


# ---- evaluation: the `streamback` lm-eval backend's scoring ---------------------------------------


def run_eval(report: Report, device, sizes: Sizes) -> None:
    """Batched log-likelihood scoring (streamback.eval.scoring.Scorer, the core of the `streamback`
    lm-eval model; no lm-eval needed) on random 4-choice items (contexts of 32-160 tokens,
    continuations of 2-16): fp32-compute batches equal to one request at a time (padding and
    positions), then items/s of each paper block in bf16 compute (GPU: fat-short, vocabulary 128,256)."""
    from streamback.eval.scoring import Scorer

    quick = sizes is QUICK
    if report.left() < (30 if quick else 90):
        report.record("eval", "phase", "skipped", f"{report.left():.0f} s left")
        return
    if quick:
        args, items, batch = ModelArgs(**SHAPES["medium"], vocab_size=VOCAB, multiple_of=32, max_seq_len=256), 12, 8
    else:
        args, items, batch = ModelArgs.from_config(load_config(ROOT / "config" / "paper.yaml")["model"], "fat-short", 128256), 512, 32
    g = torch.Generator().manual_seed(0)

    def draw(low, high, count=None):
        return torch.randint(low, high + 1, (count or 1,), generator=g).tolist()

    requests = []
    for _ in range(items):
        context = draw(1, args.vocab_size - 1, draw(32, 160)[0])
        requests += [(context, draw(1, args.vocab_size - 1, draw(2, 16)[0])) for _ in range(4)]
    for block, compute in (("baseline", torch.float32), ("baseline", torch.bfloat16), ("streamback", torch.bfloat16)):
        with report.guard("eval", f"{block} {compute}"):
            with torch.device(device):
                model = Transformer(dataclasses.replace(args, block=block), compute)
            model.init_weights(0)
            scorer = Scorer(model.eval(), None, eos_id=0, batch_size=batch)
            if compute == torch.float32:
                batched = scorer.loglikelihood(requests[:4 * batch])
                single = Scorer(model, None, eos_id=0, batch_size=1).loglikelihood(requests[:4 * batch])
                err = max(abs(a[0] - b[0]) for a, b in zip(batched, single))
                same = all(a[1] == b[1] for a, b in zip(batched, single))
                report.record("eval", "batched_eq_single_fp32", err <= 1e-3 and same,
                              f"max |diff| {err:.1e} nats over {4 * batch} requests in batches of {batch}, is_greedy {'equal' if same else 'differs'}")
                continue
            scorer.loglikelihood(requests[:batch])  # warm-up
            _sync(device)
            began = time.perf_counter()
            scorer.loglikelihood(requests)
            _sync(device)
            seconds = time.perf_counter() - began
            report.record("eval", f"items_per_s_{block}", None,
                          f"{items / seconds:,.1f} items/s ({len(requests) / seconds:,.0f} requests/s, batch {batch}, {args.n_layers} x {args.dim}, bf16 compute)")
            del model, scorer
            if device.type == "cuda":
                torch.cuda.empty_cache()


# ---- analyses: `streamback analyze` on the paper's shapes --------------------------------------


def run_analysis(report: Report, device, sizes: Sizes) -> None:
    """Per paper shape (a random StreamBack model, fp32 weights held on the CPU as read_model holds a
    model file's), the analyses of one run at config/paper.yaml's analysis section: seconds and peak
    device memory of each (reset before each, so the peak is that analysis's own), and the loss-windows
    rate of loss-difference. Quick: the checks' "medium" shape, three variants, 2 x 16 tokens."""
    from streamback.analysis.envelope import envelope
    from streamback.analysis.precision import layer_error, swallowed
    from streamback.model.weights import TrainedModel, load_model
    from streamback.train.validation import next_token_loss

    quick = sizes is QUICK
    paper = load_config(ROOT / "config" / "paper.yaml")
    cfg = paper["analysis"]
    if quick:
        shapes = {TRAIN_SHAPE: ModelArgs(**SHAPES["medium"], vocab_size=VOCAB, multiple_of=32, max_seq_len=256, block="streamback")}
        batch, seq, variants, windows = 2, 16, ["bf16", "fp32", "nvfp4_sr"], 8
    else:
        shapes = {s: ModelArgs.from_config(paper["model"], s, 128256, "streamback") for s in ("skinny-tall", "medium", "fat-short")}
        batch, seq, variants, windows = cfg["batch_size"], paper["train"]["seq_len"], cfg["variants"], 64
    cuda = device.type == "cuda"
    estimate = 20.0 if quick else 150.0  # seconds for a shape, until one has run
    for shape, args in shapes.items():
        if report.left() < 0.4 * report.budget + estimate:
            report.record("analysis", shape, "skipped", f"{report.left():.0f} s left, about {estimate:.0f} s needed beyond the bench's 40%")
            continue
        began = time.perf_counter()
        with report.guard("analysis", shape):
            with torch.device(device):
                model = Transformer(args)
            model.init_weights(0)
            trained = TrainedModel(args, {k: v.detach().cpu() for k, v in model.state_dict().items()}, "fp32", torch.bfloat16)
            del model
            tokens = torch.randint(0, args.vocab_size, (batch, seq + 1), generator=torch.Generator().manual_seed(0))
            where = f"{args.n_layers} x {args.dim}, {batch} x {seq} tokens"
            for name, compute in (("layer_error", lambda: layer_error(trained, tokens, cfg["reference"], variants, device, cfg["seed"])),
                                  ("swallowed", lambda: swallowed(trained, tokens, variants, device, cfg["seed"])),
                                  ("envelope", lambda: envelope(trained, tokens, device))):
                gc.collect()
                if cuda:
                    torch.cuda.empty_cache()
                    torch.cuda.reset_peak_memory_stats(device)
                _sync(device)
                start = time.perf_counter()
                table = compute()
                _sync(device)
                seconds = time.perf_counter() - start
                peak = f"peak {torch.cuda.max_memory_allocated(device) / 2**30:.1f} GiB" if cuda else "peak n/a (CPU)"
                value = f"{seconds:.1f} s, {peak}; {len(variants) if name != 'envelope' else 1} variant(s), {where}"
                if name == "layer_error":  # the check: on the same weights, the fp32 stream ends closer to the truth
                    last = table[(table.kind == "activations") & (table.layer == args.n_layers)].set_index("variant").max_abs_error
                    report.record("analysis", f"{shape}_{name}", bool(last["fp32"] < last["bf16"]),
                                  f"{value}; last-layer max |error| fp32 {last['fp32']:.3g} < bf16 {last['bf16']:.3g}")
                else:
                    report.record("analysis", f"{shape}_{name}", None, value)
            model = load_model(trained, device=device)
            micro = cfg["micro_batch_size"]
            data = torch.randint(0, args.vocab_size, (micro, seq + 1), generator=torch.Generator().manual_seed(1)).to(device)
            with torch.no_grad():
                next_token_loss(model(data[:, :-1]), data[:, 1:])  # warm-up
                _sync(device)
                start = time.perf_counter()
                for _ in range(max(1, windows // micro)):
                    next_token_loss(model(data[:, :-1]), data[:, 1:], reduction="none")
                _sync(device)
            rate = max(1, windows // micro) * micro / (time.perf_counter() - start)
            count = cfg["loss_windows"] or paper["train"]["log"]["val_sequences"]
            report.record("analysis", f"{shape}_loss_windows", None,
                          f"{rate:,.1f} windows/s of {seq} tokens (micro-batch {micro}): loss-difference's 2 splits x {count} windows "
                          f"take {2 * count / rate:.0f} s per run")
            del model, trained
        estimate = 1.2 * (time.perf_counter() - began)


# ---- 5. benchmark ------------------------------------------------------------------------------


def run_bench(report: Report, device, sizes: Sizes, config: Path, work: Path, groups) -> None:
    """`streamback bench` per shape x mode x variant, in priority order, while the budget lasts."""
    from streamback.cli import main as cli_main

    rows, calls, results, took = [], [], [], {}
    for shape, mode, variants in groups:
        for variant in variants:
            kind = [s for (sh, m), ss in took.items() if m == mode for s in ss]
            same = took.get((shape, mode), [])
            estimate = max(same) if same else max(kind) if kind else sizes.bench_first_call[mode]
            call = {"shape": shape, "mode": mode, "variant": variant}
            if report.left() < estimate:
                calls.append({**call, "status": f"skipped: {report.left():.0f} s left, about {estimate:.0f} s needed"})
                report.record("bench", f"{shape}/{mode}/{variant}", "skipped", calls[-1]["status"])
                continue
            out = work / "bench" / f"{shape}-{mode}-{variant}.json"
            argv = ["bench", "--config", str(sizes.bench_config or config), "--shapes", shape, "--variants", variant, "--modes", mode,
                    "--batch", str(sizes.bench_batch), "--seq-len", str(sizes.bench_seq), "--vocab-size", str(sizes.bench_vocab),
                    "--steps", str(sizes.bench_steps), "--warmup", str(sizes.bench_warmup), "--device", device.type, "--out", str(out)]
            if mode == "compiled":  # the memory estimate is of the eager step: made once, in the eager call
                argv.append("--no-estimate")
            began = time.perf_counter()
            with report.guard("bench", f"{shape}/{mode}/{variant}"):
                try:
                    status = cli_main(argv)
                except SystemExit as err:  # argparse exits on flags it refuses: report it, go on
                    status = f"argument error {err.code}"
                seconds = time.perf_counter() - began
                took.setdefault((shape, mode), []).append(seconds)
                result = json.loads(out.read_text()) if status == 0 else {"rows": []}
                if status == 0:
                    results.append(result)
                for row in result["rows"]:
                    rows.append({**row, "matmul_tflops": result.get("matmul_tflops"), "call_s": round(seconds, 1)})
                    ok = not row.get("error") and (row.get("tokens_per_s") or 0) > 0
                    report.record("bench", f"{shape}/{mode}/{variant}", ok,
                                  row.get("error") or f"{row['tokens_per_s']:,.0f} tok/s in a {seconds:.0f} s call")
                if status != 0:
                    report.record("bench", f"{shape}/{mode}/{variant}", False, f"streamback bench exited with {status}")
                calls.append({**call, "status": f"ran: exit {status}", "seconds": round(seconds, 1)})
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            save_bench(report, results, rows, calls)
    save_bench(report, results, rows, calls)  # also when every call was skipped


def save_bench(report: Report, results: list[dict], rows: list[dict], calls: list[dict]) -> None:
    """bench.json (the first call's header, every row, the calls, the goals), bench.md, summary.json."""
    report.bench.update(rows=rows, calls=calls, goals=bench_goals(rows))
    merged = {**(results[0] if results else {}), "rows": rows}
    write_json(report.out / "bench.json", {**merged, "calls": calls, "goals": report.bench["goals"]})
    table = bench_table(merged) if rows else "No bench row yet.\n"
    goals = [[g["goal"], g["where"], g["value"], _met(g["met"])] for g in report.bench["goals"]]
    write_text(report.out / "bench.md", table + "\n" + markdown_table(["goal", "where", "value", "met"], goals))
    report.save()


def bench_goals(rows: list[dict]) -> list[dict]:
    """Issue 3's goals on the bench rows that ran without error."""
    by = {(r.get("shape"), r.get("mode"), r.get("variant")): r for r in rows if not r.get("error") and r.get("tokens_per_s")}
    goals = []
    for shape, mode in sorted({(s, m) for s, m, _ in by}):
        base, stream, reversible = (by.get((shape, mode, v)) for v in VARIANTS)
        if base and stream:
            ratio = stream["tokens_per_s"] / base["tokens_per_s"]
            goals.append({"goal": "streamback >= 0.99x baseline tok/s", "where": f"{shape} {mode}", "value": f"{ratio:.3f}x", "met": ratio >= 0.99})
        if base and reversible and base.get("peak_mem_gib") is not None and reversible.get("peak_mem_gib") is not None:
            goals.append({"goal": "reversible peak <= baseline peak", "where": f"{shape} {mode}",
                          "value": f"{reversible['peak_mem_gib']:.1f} vs {base['peak_mem_gib']:.1f} GiB",
                          "met": reversible["peak_mem_gib"] <= base["peak_mem_gib"]})
    for key, (ref_tps, ref_peak) in REFERENCE.items():
        row = by.get(key)
        if row is None:
            continue
        mfu = row.get("mfu")
        value = f"{row['tokens_per_s']:,.0f} vs {ref_tps:,} tok/s"
        if mfu:  # same FLOPs per token, so the reference's MFU against this run's matmul rate scales with tok/s
            value += f" (MFU {100 * mfu:.1f}% vs {100 * mfu * ref_tps / row['tokens_per_s']:.1f}%)"
        if ref_peak is not None and row.get("peak_mem_gib") is not None:
            value += f"; peak {row['peak_mem_gib']:.1f} vs {ref_peak} GiB"
        goals.append({"goal": "tok/s (MFU) above the reference", "where": " ".join(key), "value": value, "met": row["tokens_per_s"] >= ref_tps})
    return goals


# ---- summary -------------------------------------------------------------------------------------


def _met(met) -> str:
    return {True: "met", False: "MISSED", None: "n/a"}[met]


def _num(value, fmt: str) -> str:
    """`value` formatted as a number; None is blank and anything else (e.g. a log's "nan") is shown as is."""
    if isinstance(value, (int, float)):
        return format(value, fmt)
    return "" if value is None else str(value)


def summary_text(report: Report, args) -> str:
    env, parts = report.env, []
    parts.append(f"# gpu_checks: {env.get('name', '?')} (capability {env.get('capability', 'n/a')}), torch {env.get('torch')}, "
                 f"{'quick' if args.quick else 'full'} sizes, parts {','.join(args.parts)}\n")
    if "matmul_bf16_tflops" in env or "copy_tb_s" in env:
        parts.append(f"bf16 matmul {_num(env.get('matmul_bf16_tflops'), '.1f')} TFLOP/s; device copy {_num(env.get('copy_tb_s'), '.2f')} TB/s (read + write)\n")
    counts: dict[str, dict[str, int]] = {}
    for c in report.checks:
        counts.setdefault(c["group"], {"PASS": 0, "FAIL": 0, "INFO": 0, "SKIP": 0})[c["status"]] += 1
    parts.append(markdown_table(["group", "pass", "fail", "info", "skipped"], [[g, *n.values()] for g, n in counts.items()]))
    for status, title in (("FAIL", "Failed"), ("INFO", "Findings"), ("SKIP", "Skipped")):
        items = [c for c in report.checks if c["status"] == status]
        if items:  # at most LISTED each, cut short: the device call returns only the output's last 12,000 characters
            lines = [f"- {c['group']}/{c['name']}: {c['value'][:160]}\n" for c in items[:LISTED]]
            more = f"- ... and {len(items) - LISTED} more in summary.json\n" if len(items) > LISTED else ""
            parts.append(f"{title}:\n" + "".join(lines) + more)
    if report.train.get("steps"):
        t = report.train
        parts.append(f"Training smoke: {t['steps']} steps, loss {t['first_loss']:.3f} -> {t['last_loss']:.3f}, "
                     f"val {_num(t['val_loss'], '.3f')}, {t['seconds']} s\n")
    rows = report.bench.get("rows", [])
    if rows:
        table = []
        for r in rows:
            ref = REFERENCE.get((r.get("shape"), r.get("mode"), r.get("variant")))
            base = next((b for b in rows if (b.get("shape"), b.get("mode"), b.get("variant")) == (r.get("shape"), r.get("mode"), "baseline")
                         and b.get("tokens_per_s")), None)
            ratio = r["tokens_per_s"] / base["tokens_per_s"] if base and r.get("tokens_per_s") else None
            table.append([r.get("shape"), r.get("mode"), r.get("variant"), r.get("error") or _num(r.get("tokens_per_s"), ",.0f"),
                          _num(ratio, ".3f"), _num(r.get("mfu") and 100 * r["mfu"], ".1f"), _num(r.get("peak_mem_gib"), ".1f"),
                          _num(r.get("est_peak_gib"), ".1f"), f"{ref[0]:,}" if ref else "", _num(ref and ref[1], ".1f"), r.get("call_s")])
        parts.append(markdown_table(["shape", "mode", "variant", "tok/s", "vs base", "MFU %", "peak GiB", "est GiB", "ref tok/s", "ref GiB", "call s"], table))
    goals = report.bench.get("goals", [])
    if goals:
        parts.append(markdown_table(["goal", "where", "value", "met"], [[g["goal"], g["where"], g["value"], _met(g["met"])] for g in goals]))
    failed = len(report.failed())
    parts.append(f"{len(report.checks)} checks, {failed} failed; {report.elapsed():.0f} s of a {report.budget:.0f} s budget; "
                 f"exit status {1 if failed else 0}; files in {report.out}\n")
    return "\n".join(parts)


# ---- main ------------------------------------------------------------------------------------------


def bench_groups(text: str | None, sizes: Sizes) -> tuple:
    """--bench-groups "SHAPE:MODE,..." as (shape, mode, VARIANTS) groups; None: the sizes' default."""
    if text is None:
        return sizes.bench_groups
    groups = []
    for item in text.split(","):
        shape, _, mode = item.partition(":")
        if not shape or mode not in ("eager", "compiled"):
            raise ValueError(f"--bench-groups: {item!r} is not SHAPE:eager or SHAPE:compiled")
        groups.append((shape, mode, VARIANTS))
    return tuple(groups)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="output folder (the device's $OUT)")
    parser.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (seconds per phase): the CPU test's mode")
    parser.add_argument("--budget", type=float, default=None, help="seconds for the whole run (default 420, quick 300)")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, from {','.join(PARTS)}")
    parser.add_argument("--bench-groups", default=None, help="SHAPE:MODE,... in order (default: the reference figures' first)")
    parser.add_argument("--tokens", type=Path, default=ROOT / layout.tokens_dir(load_config()["data"]), help="token shards for the training smoke (default: the default config's)")
    parser.add_argument("--work", type=Path, default=None, help="scratch folder (default: a new temporary one)")
    args = parser.parse_args(argv)
    args.parts = [p for p in args.parts.split(",") if p]
    if not args.parts or set(args.parts) - set(PARTS):
        parser.error(f"--parts: choose from {','.join(PARTS)}")
    try:
        groups = bench_groups(args.bench_groups, QUICK if args.quick else GPU)
    except ValueError as err:
        parser.error(str(err))
    if args.device is None and not torch.cuda.is_available():
        parser.error("no CUDA device: pass --device cpu (with --quick for the CPU's sizes)")
    device = torch.device(args.device or "cuda")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())  # NCCL's device_id needs the index
    args.out, args.tokens = args.out.resolve(), args.tokens.resolve()  # the training smoke runs elsewhere
    sizes = QUICK if args.quick else GPU
    args.out.mkdir(parents=True, exist_ok=True)
    work = args.work or Path(tempfile.mkdtemp(prefix="gpu_checks-"))
    work.mkdir(parents=True, exist_ok=True)
    report = Report(args.budget or sizes.budget, args.out)
    config = work / "config.yaml"
    with report.guard("config", "load"):  # validation needs jsonschema: on the device, from the carried wheels
        config.write_text(yaml.safe_dump(checks_config(sizes)))

    phases = {
        "env": lambda: environment(report, device, sizes),
        "checks": lambda: run_checks(report, device, sizes),
        "fsdp": lambda: run_fsdp(report, device, sizes, work),
        "train": lambda: run_train(report, device, sizes, config, args.tokens, work),
        "eval": lambda: run_eval(report, device, sizes),
        "analysis": lambda: run_analysis(report, device, sizes),
        "bench": lambda: run_bench(report, device, sizes, config, work, groups),
    }
    for part in PARTS:
        if part in args.parts:
            with report.guard(part, "phase"):  # what breaks outside a check's own guard
                phases[part]()
            if device.type == "cuda":
                torch.cuda.empty_cache()
            report.save()
    text = summary_text(report, args)
    write_text(args.out / "summary.md", text)
    print("\n" + text, flush=True)
    return 1 if report.failed() else 0


if __name__ == "__main__":
    sys.exit(main())
