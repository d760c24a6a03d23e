"""Every check and measurement of the project that needs a GPU, in one command of about 8 minutes:

    PYTHONPATH=. python benchmarks/gpu_checks.py --out DIR                 # on a CUDA machine
    PYTHONPATH=. python benchmarks/gpu_checks.py --device cpu --quick --out DIR   # CPU, tiny sizes

It prints each item as it finishes (PASS, FAIL, INFO or SKIP, with its figure) and, last, a
summary: checks by group, what failed, the bench table against plain PyTorch and the goals met
or missed; the same goes to DIR (below). Exit status 1 if a check failed.

The correctness checks are tests (tests/conftest.py): every test that takes the `device` fixture
has a CUDA case, marked `gpu`, and a test that needs CUDA alone is marked `gpu` itself; where no
CUDA device exists they are skipped, so `pytest -m gpu` is what a GPU machine adds. This script
runs them in one phase and measures the rest. Phases (`PHASES`, in order; `--parts` picks some),
each item printed PASS/FAIL/INFO/SKIP with its number as it finishes; a failing item does not stop
the others:
1. env: torch, GPU, capability; bf16 matmul rate (8192^3, random data, median of 10 timed by CUDA
   events, result checked against fp32) and device-to-device copy bandwidth (bytes read + written).
2. tests: `python -m pytest -m gpu` over `GPU_TEST_FILES` (the modules with CUDA cases; the other
   modules import what the device lacks: Snakemake, lm-eval, altair), in 4 processes where
   pytest-xdist is installed, one item per test, for at most `Sizes.tests_s`
   seconds (what finished by then is reported). Among them: rounding against
   torch's casts and `ulp` against torch.nextafter, stochastic rounding unbiased (eager and
   compiled), NVFP4 against NVIDIA's recipe, every stream format's dtype and grid (eager, FSDP2 on
   NCCL, compiled then sharded), compiled blocks rounding as eager ones (per block, against the
   control of Inductor without emulate_precision_casts), the reversible stream's gradients and
   rebuild, a compiled `torchrun ... streamback train` on the GPU, and the preflight of a compiled
   micro shape (`streamback preflight` under torchrun: every check, on CUDA). Quick: the CPU cases of a
   few fast tests (`Sizes.tests_args`).
3. eval: the `streamback` lm-eval backend's batched log-likelihood scoring (streamback.eval.scoring,
   no lm-eval on the device): fp32 batches equal one request at a time; items/s of each paper block.
4. analysis: `streamback analyze`'s computations (streamback.analysis; no altair on the device, so no
   figures) on a random model of each paper shape, deepest first, at config/paper.yaml's analysis
   batch: seconds and peak GPU memory of layer-error (fp32 ground truth + every stream variant; its
   fp32 stream closer to the truth than its bf16 stream, the check), swallowed and envelope, and the
   window-loss rate that loss-difference runs at. A shape starts only while 40% of the budget is left
   for the bench (without the bench, while its estimate fits).
5. profile (`streamback.measure.kernels`): per paper shape, a compiled training step of the baseline
   against StreamBack (skinny-tall: against the reversible stream, and against its own eager
   step: launches, and busy vs wall, say whether eager is launch-bound), micro-batch 4 x 2048: the
   kernels Inductor generated for one block (forward and backward graphs: count by kind and
   Inductor's own bytes estimate), torch.profiler's kernel time per step by kind, the kernels that
   differ most, and GPU busy against wall time (the gap is time the GPU waited); then the
   baseline's stream add rounded on its bit pattern (`round_to`, what compiled blocks run) against
   a native bf16 add under emulate_precision_casts: the same bits?, and the time of each. Written
   to profile.md; starts an item only while `Sizes.bench_reserve` seconds remain for the bench. A
   variant in two pairs (the skinny-tall baseline) is compiled and profiled once.
6. bench: `streamback bench` (its CLI, one shape x mode x variant per call, in priority order:
   compiled first, where the goals are) on config/paper.yaml at micro-batch 4 x 2048, until the
   time budget is spent; the rows left are listed as skipped. Goals: StreamBack >= 0.99x the
   baseline's tokens/s; the reversible stream >= 0.97x with peak memory <= the baseline's
   (compiled); MFU of the compiled baseline (`MFU_GOALS`); tokens/s above plain PyTorch (`REFERENCE`).

Time: `--budget` seconds (default 420 on a GPU); each bench call starts only if the time left
covers the longest call of its kind so far. Outputs under `--out` (at most 8 files, none in
subfolders, rewritten as the run goes, so a run stopped from outside keeps what it did):
summary.json (everything), summary.md (the table printed last), tests.log (pytest's output),
profile.md, bench.json/.md (all rows and goals), plus the caller's tee'd log. Exit status 1 if any
check failed (goals, findings and skipped items are reported, not failures), 0 otherwise.

Needs torch with CUDA, pytest, jsonschema and datasets (pytest-xdist optional); not Snakemake,
lm-eval or altair. The tests make their own token shards (conftest's `tokens`, whose corpus the data
stage reads through datasets, with pyarrow >= 24 beneath it).
"""

from __future__ import annotations

import argparse
import dataclasses
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

from benchmarks.gpu_report import Report, met_text, pytest_outcomes, summary_text
from streamback.config import DEFAULT_CONFIG, ROOT, load_config
from streamback.io import markdown_table, write_json, write_text
from streamback.measure import kernels
from streamback.measure.bench import markdown_table as bench_table
from streamback.measure.step import model_args, random_tokens, step_seconds, training_step
from streamback.model.model import ModelArgs, Transformer

SHAPES = {"medium": dict(dim=106, n_layers=4, n_heads=4, n_kv_heads=1)}  # tiny: 106 % 32 = 10, 4 heads x 26 != 106
VOCAB = 97
TRAIN_SHAPE = "check-medium"  # SHAPES["medium"]'s name in the quick analysis
# the test modules with CUDA cases (`pytest -m gpu`); tests/workflow/test_gpu_checks.py checks this is all of them
GPU_TEST_FILES = tuple(
    f"tests/{f}.py"
    for f in (
        "unit/test_rounding",
        "unit/test_formats",
        "unit/test_model",
        "unit/test_reversible",
        "unit/test_train",
        "unit/test_eval",
        "unit/test_preflight",
        "workflow/test_formats_end_to_end",
        "workflow/test_model_end_to_end",
        "workflow/test_reversible_end_to_end",
    )
)
# A plain PyTorch Llama 3 block stack on one H200, torch 2.11, micro-batch 4 x 2048: tokens/s and peak GiB
# (docs/measurements.md; tests/unit/test_docs.py keeps the two the same).
REFERENCE = {
    ("fat-short", "compiled", "baseline"): (55_966, 28.7),
    ("fat-short", "compiled", "streamback"): (55_344, 31.6),
    ("skinny-tall", "compiled", "baseline"): (47_030, 39.7),
    ("skinny-tall", "compiled", "streamback"): (45_940, 41.0),
    ("medium", "eager", "baseline"): (35_146, None),
    ("medium", "eager", "streamback"): (33_302, None),
}
MFU_GOALS = {"fat-short": 0.72, "medium": 0.58, "skinny-tall": 0.58}  # the MFU the compiled baseline should reach
VARIANTS = ("baseline", "streamback", "streamback-reversible")
LISTED = 20  # failures, findings and skipped items listed in the summary, each


@dataclasses.dataclass(frozen=True)
class Sizes:
    """Everything that differs between a GPU run and the quick CPU run: sizes, and how many items of
    each kind (tests, profiled pairs, bench groups); the code that runs is the same."""

    budget: float
    matmul_n: int
    copy_mib: int
    tests_args: tuple  # pytest's selection
    tests_s: float  # at most this long for the tests
    tests_workers: int  # pytest-xdist processes, where it is installed (compiling is CPU-bound)
    profile_config: Path
    profile_pairs: tuple  # (shape, variant, variant) compiled and profiled, in order
    profile_batch: int
    profile_seq: int
    profile_vocab: int
    add_shape: tuple  # the stream the add-rounding comparison runs on
    bench_reserve: float  # seconds the profile leaves for the bench
    bench_config: Path
    bench_groups: tuple  # (shape, mode, variants), in priority order
    bench_batch: int
    bench_seq: int
    bench_vocab: int
    bench_steps: int
    bench_warmup: int
    bench_first_call: dict  # mode -> seconds assumed for a call before one of its kind has run
    quick: bool = False  # the CPU test's sizes


GPU = Sizes(
    budget=420,
    matmul_n=8192,
    copy_mib=1024,
    tests_args=("-m", "gpu"),
    tests_s=130,
    tests_workers=4,
    profile_config=ROOT / "config" / "paper.yaml",
    profile_pairs=(
        ("medium", "baseline", "streamback"),
        ("skinny-tall", "baseline", "streamback-reversible"),
        ("fat-short", "baseline", "streamback"),
        ("skinny-tall", "baseline", "baseline eager"),
    ),
    profile_batch=4,
    profile_seq=2048,
    profile_vocab=128256,
    add_shape=(4, 2048, 1512),
    bench_reserve=150,
    bench_config=ROOT / "config" / "paper.yaml",
    bench_groups=(
        ("fat-short", "compiled", VARIANTS),
        ("skinny-tall", "compiled", VARIANTS),
        ("medium", "compiled", VARIANTS),
        ("skinny-tall", "eager", VARIANTS),
        ("medium", "eager", VARIANTS),
        ("fat-short", "eager", VARIANTS),
    ),
    bench_batch=4,
    bench_seq=2048,
    bench_vocab=128256,
    bench_steps=10,
    bench_warmup=3,
    bench_first_call={"eager": 15, "compiled": 60},
)
QUICK = Sizes(
    budget=300,
    matmul_n=256,
    copy_mib=16,
    tests_args=("-m", "not gpu and not slow", "-k", "nextafter or infinity or nvidias_recipe or full_disk_fails"),
    tests_s=240,
    tests_workers=1,
    profile_config=DEFAULT_CONFIG,
    profile_pairs=(("tiny-medium", "streamback", "baseline eager"),),  # one compile: a compiled and an eager variant
    profile_batch=2,
    profile_seq=16,
    profile_vocab=64,
    add_shape=(2, 16, 106),
    bench_reserve=30,
    bench_config=DEFAULT_CONFIG,
    bench_groups=(("tiny-medium", "eager", VARIANTS), ("tiny-medium", "compiled", ("streamback",))),
    bench_batch=2,
    bench_seq=16,
    bench_vocab=64,
    bench_steps=1,
    bench_warmup=1,
    bench_first_call={"eager": 5, "compiled": 30},
    quick=True,
)


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


def machine(device: torch.device) -> dict:
    """torch, Python and the device, named in the summary whichever phases run."""
    env = {"torch": torch.__version__, "python": sys.version.split()[0], "device": device.type}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(
            name=props.name,
            capability=f"{props.major}.{props.minor}",
            sms=props.multi_processor_count,
            memory_gib=round(props.total_memory / 2**30, 1),
            cuda=torch.version.cuda,
        )
    else:
        env.update(name="cpu", threads=torch.get_num_threads())
    return env


def environment(report: Report, device: torch.device, sizes: Sizes) -> None:
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
        report.record(
            "env",
            "matmul_bf16",
            error < 1e-2 and not out.isnan().any().item(),
            f"{report.env['matmul_bf16_tflops']:.1f} TFLOP/s ({n}^3, median {ms:.3f} ms), rel. error {error:.1e}",
        )
    with report.guard("env", "copy"):
        src = torch.randn(sizes.copy_mib * 2**18, device=device)
        dst = torch.full_like(src, math.nan)
        ms = median_ms(lambda: dst.copy_(src), device)
        report.env["copy_tb_s"] = 2 * src.nbytes / (ms / 1e3) / 1e12
        report.record(
            "env",
            "copy",
            torch.equal(dst, src),
            f"{report.env['copy_tb_s']:.2f} TB/s read + write ({2 * src.nbytes / 2**30:.2f} GiB, median {ms:.3f} ms)",
        )


# ---- 2. tests: the CUDA cases of the test suite ---------------------------------------------


def run_tests(report: Report, device, sizes: Sizes, work: Path) -> None:
    """`python -m pytest` (the sizes' selection) over GPU_TEST_FILES in a subprocess (its own CUDA
    context and compile caches), cut off after `sizes.tests_s` seconds; one item per test, read off
    pytest's verbose lines as they are written, so a cut-off run still reports what finished."""
    import importlib.util

    if importlib.util.find_spec("pytest") is None:
        report.record("tests", "pytest", False, "pytest is not installed: the CUDA cases of the tests did not run")
        return
    log = work / "pytest.log"
    workers = ["-n", str(sizes.tests_workers)] if sizes.tests_workers > 1 and importlib.util.find_spec("xdist") else []
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "-o",
        "addopts=",  # the repository's addopts ask for pytest-xdist, which this machine may lack
        "-v",
        "-rfE",
        "--color=no",
        *workers,
        *sizes.tests_args,
        *GPU_TEST_FILES,
    ]
    timeout = max(10.0, min(sizes.tests_s, report.left()))
    env = dict(os.environ)
    if device.type == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""  # the trainer and the tests take a GPU whenever they see one
    began = time.perf_counter()
    with open(log, "w") as sink:
        try:
            status = subprocess.run(
                cmd, cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT, timeout=timeout
            ).returncode
        except subprocess.TimeoutExpired:
            status = f"cut off after {timeout:.0f} s"
    seconds = time.perf_counter() - began
    shutil.copyfile(log, report.out / "tests.log")
    outcomes, reasons = pytest_outcomes(log.read_text(errors="replace").splitlines())
    for test, outcome in outcomes.items():
        ok = {"PASSED": True, "XFAIL": True, "SKIPPED": "skipped"}.get(outcome, False)
        report.record(
            "tests",
            test.removeprefix("tests/"),
            ok,
            outcome.lower() + (f": {reasons[test]}" if test in reasons else ""),
        )
    counts = {o: list(outcomes.values()).count(o) for o in sorted(set(outcomes.values()))}
    report.tests.update(
        command=" ".join(cmd),
        selection=" ".join(sizes.tests_args),
        exit_status=status,
        seconds=round(seconds, 1),
        counts=counts,
    )
    report.record(
        "tests",
        "pytest",
        status in (0, 1) and bool(outcomes),  # 1: some failed, each recorded above
        f"exit {status} after {seconds:.0f} s: "
        + (", ".join(f"{n} {o.lower()}" for o, n in counts.items()) or "no test ran"),
    )


# ---- 3. evaluation: the `streamback` lm-eval backend's scoring ---------------------------------------


def run_eval(report: Report, device, sizes: Sizes) -> None:
    """Batched log-likelihood scoring (streamback.eval.scoring.Scorer, the core of the `streamback`
    lm-eval model; no lm-eval needed) on random 4-choice items (contexts of 32-160 tokens,
    continuations of 2-16): fp32-compute batches equal to one request at a time (padding and
    positions), then items/s of each paper block in bf16 compute (GPU: fat-short, vocabulary 128,256)."""
    from streamback.eval.scoring import Scorer

    quick = sizes.quick
    if report.left() < (30 if quick else 90):
        report.record("eval", "phase", "skipped", f"{report.left():.0f} s left")
        return
    if quick:
        args, items, batch = ModelArgs(**SHAPES["medium"], vocab_size=VOCAB, multiple_of=32, max_seq_len=256), 12, 8
    else:
        args, items, batch = (
            ModelArgs.from_config(load_config(ROOT / "config" / "paper.yaml")["model"], "fat-short", 128256),
            512,
            32,
        )
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
                batched = scorer.loglikelihood(requests[: 4 * batch])
                single = Scorer(model, None, eos_id=0, batch_size=1).loglikelihood(requests[: 4 * batch])
                err = max(abs(a[0] - b[0]) for a, b in zip(batched, single))
                same = all(a[1] == b[1] for a, b in zip(batched, single))
                report.record(
                    "eval",
                    "batched_eq_single_fp32",
                    err <= 1e-3 and same,
                    f"max |diff| {err:.1e} nats over {4 * batch} requests in batches of {batch}, is_greedy "
                    f"{'equal' if same else 'differs'}",
                )
                continue
            scorer.loglikelihood(requests[:batch])  # warm-up
            _sync(device)
            began = time.perf_counter()
            scorer.loglikelihood(requests)
            _sync(device)
            seconds = time.perf_counter() - began
            report.record(
                "eval",
                f"items_per_s_{block}",
                None,
                f"{items / seconds:,.1f} items/s ({len(requests) / seconds:,.0f} requests/s, batch {batch}, "
                f"{args.n_layers} x {args.dim}, bf16 compute)",
            )
            del model, scorer
            if device.type == "cuda":
                torch.cuda.empty_cache()


# ---- 4. analyses: `streamback analyze` on the paper's shapes --------------------------------------


def run_analysis(report: Report, device, sizes: Sizes) -> None:
    """Per paper shape (a random StreamBack model, fp32 weights held on the CPU as read_model holds a
    model file's), the analyses of one run at config/paper.yaml's analysis section: seconds and peak
    device memory of each (reset before each, so the peak is that analysis's own), and the loss-windows
    rate of loss-difference. Quick: the checks' "medium" shape, three variants, 2 x 16 tokens."""
    from streamback.analysis.envelope import envelope
    from streamback.analysis.precision import layer_error, swallowed
    from streamback.model.weights import TrainedModel, load_model
    from streamback.train.validation import next_token_loss

    quick = sizes.quick
    paper = load_config(ROOT / "config" / "paper.yaml")
    cfg = paper["analysis"]
    if quick:
        shapes = {
            TRAIN_SHAPE: ModelArgs(
                **SHAPES["medium"], vocab_size=VOCAB, multiple_of=32, max_seq_len=256, block="streamback"
            )
        }
        batch, seq, variants, windows = 2, 16, ["bf16", "fp32", "nvfp4_sr"], 8
    else:
        shapes = {
            s: ModelArgs.from_config(paper["model"], s, 128256, "streamback")
            for s in ("skinny-tall", "medium", "fat-short")
        }
        batch, seq, variants, windows = cfg["batch_size"], paper["train"]["seq_len"], cfg["variants"], 64
    cuda = device.type == "cuda"
    estimate = 20.0 if quick else 150.0  # seconds for a shape, until one has run
    reserve = 0.4 * report.budget if sizes.bench_reserve else 0.0  # for the bench, when it runs
    for shape, args in shapes.items():
        if report.left() < reserve + estimate:
            report.record(
                "analysis",
                shape,
                "skipped",
                f"{report.left():.0f} s left, about {estimate:.0f} s needed"
                + (" beyond the bench's 40%" if reserve else ""),
            )
            continue
        began = time.perf_counter()
        with report.guard("analysis", shape):
            with torch.device(device):
                model = Transformer(args)
            model.init_weights(0)
            trained = TrainedModel(
                args, {k: v.detach().cpu() for k, v in model.state_dict().items()}, "fp32", torch.bfloat16
            )
            del model
            tokens = torch.randint(0, args.vocab_size, (batch, seq + 1), generator=torch.Generator().manual_seed(0))
            where = f"{args.n_layers} x {args.dim}, {batch} x {seq} tokens"
            for name, compute in (
                ("layer_error", lambda: layer_error(trained, tokens, cfg["reference"], variants, device, cfg["seed"])),
                ("swallowed", lambda: swallowed(trained, tokens, variants, device, cfg["seed"])),
                ("envelope", lambda: envelope(trained, tokens, device)),
            ):
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
                    last = (
                        table[(table.kind == "activations") & (table.layer == args.n_layers)]
                        .set_index("variant")
                        .max_abs_error
                    )
                    report.record(
                        "analysis",
                        f"{shape}_{name}",
                        bool(last["fp32"] < last["bf16"]),
                        f"{value}; last-layer max |error| fp32 {last['fp32']:.3g} < bf16 {last['bf16']:.3g}",
                    )
                else:
                    report.record("analysis", f"{shape}_{name}", None, value)
            model = load_model(trained, device=device)
            micro = cfg["micro_batch_size"]
            data = torch.randint(0, args.vocab_size, (micro, seq + 1), generator=torch.Generator().manual_seed(1)).to(
                device
            )
            with torch.no_grad():
                next_token_loss(model(data[:, :-1]), data[:, 1:])  # warm-up
                _sync(device)
                start = time.perf_counter()
                for _ in range(max(1, windows // micro)):
                    next_token_loss(model(data[:, :-1]), data[:, 1:], reduction="none")
                _sync(device)
            rate = max(1, windows // micro) * micro / (time.perf_counter() - start)
            count = cfg["loss_windows"] or paper["train"]["log"]["val_sequences"]
            report.record(
                "analysis",
                f"{shape}_loss_windows",
                None,
                f"{rate:,.1f} windows/s of {seq} tokens (micro-batch {micro}): loss-difference's 2 splits x {count} "
                f"windows "
                f"take {2 * count / rate:.0f} s per run",
            )
            del model, trained
        estimate = 1.2 * (time.perf_counter() - began)


# ---- 5. profile: where the compiled step's time goes ------------------------------------------


def profile_variant(model_cfg, shape: str, variant: str, device, sizes: Sizes) -> dict:
    """One compiled training step of `shape` as `variant` ("VARIANT eager": not compiled): the
    kernels Inductor generated (its first call compiles, with the code captured), then
    torch.profiler over 3 steps after 2 warm-ups."""
    from streamback.train.parallel import apply_compile

    variant, _, eager = variant.partition(" ")
    tokens = random_tokens(sizes.profile_vocab, sizes.profile_batch, sizes.profile_seq, device)
    with torch.device(device):
        model = Transformer(model_args(model_cfg, shape, variant, sizes.profile_vocab))
    model.init_weights(0)
    if not eager:
        apply_compile(model)
    try:
        _, graphs = kernels.generated_kernels(lambda: training_step(model, tokens))
        for _ in range(2):
            training_step(model, tokens)
        _sync(device)
        times = kernels.kernel_times(lambda: training_step(model, tokens), 3, device)
        return {"graphs": graphs, **times}
    finally:
        del model
        torch._dynamo.reset()
        if device.type == "cuda":
            torch.cuda.empty_cache()


def _stream_adds(h, delta0, delta1, weight, add):
    """A block's two stream adds and the norm between them (the compiled forward's add kernels)."""
    mid = add(h, delta0)
    x = mid.float()
    normed = (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * weight).to(h.dtype)
    return add(mid, delta1), normed


def compare_add_rounding(report: Report, device, sizes: Sizes) -> None:
    """The baseline's compiled stream add rounds the fp32 sum on its bit pattern (`round_to`, which
    no fusion can elide); a native bf16 add is rounded by Inductor too when emulate_precision_casts
    is on (apply_compile's option). Same bits? And the time of each, compiled the same way."""
    from streamback.model.formats import StreamFormat

    g = torch.Generator(device=device).manual_seed(0)
    h, d0, d1 = (torch.randn(sizes.add_shape, generator=g, device=device).bfloat16() for _ in range(3))
    weight = torch.rand(sizes.add_shape[-1], generator=g, device=device) + 0.5
    results, ms = {}, {}
    for name, add in (("bit pattern", StreamFormat("bf16").add), ("native", torch.add)):
        torch._dynamo.reset()
        fn = torch.compile(lambda *a, add=add: _stream_adds(*a, add), options={"emulate_precision_casts": True})
        results[name] = fn(h, d0, d1, weight)
        ms[name] = median_ms(lambda fn=fn: fn(h, d0, d1, weight), device)
    torch._dynamo.reset()
    same = all(torch.equal(a, b) for a, b in zip(results["bit pattern"], results["native"]))
    as_eager = torch.equal(
        results["bit pattern"][0], _stream_adds(h, d0, d1, weight, torch.add)[0]
    )  # the stream (the norm's reduction order may differ)
    report.record(
        "profile",
        "add_rounding",
        same and as_eager,
        f"{'x'.join(map(str, sizes.add_shape))} bf16 stream: bit-pattern rounding {ms['bit pattern']:.3f} ms, native "
        f"add "
        f"{ms['native']:.3f} ms; same bits: {same}, as eager: {as_eager}",
    )


def run_profile(report: Report, device, sizes: Sizes) -> None:
    """Each pair of `sizes.profile_pairs` profiled while the bench keeps its reserve; profile.md."""
    model_cfg = load_config(sizes.profile_config)["model"]
    lines = [
        (
            f"# Compiled training step, micro-batch {sizes.profile_batch} x {sizes.profile_seq}, vocabulary "
            f"{sizes.profile_vocab:,}, on {report.env.get('name', device.type)} (torch {torch.__version__})\n"
        )
    ]
    estimate = 0.0
    profiled = {}  # (shape, variant) -> its profile: a variant in two pairs is compiled and profiled once
    for shape, a, b in sizes.profile_pairs:
        name = f"{shape} {a} vs {b}"
        if report.left() < sizes.bench_reserve + estimate:
            report.record(
                "profile", name, "skipped", f"{report.left():.0f} s left, the bench keeps {sizes.bench_reserve:.0f} s"
            )
            continue
        began = time.perf_counter()
        with report.guard("profile", name):
            for v in (a, b):
                if (shape, v) not in profiled:
                    profiled[shape, v] = profile_variant(model_cfg, shape, v, device, sizes)
            prof = {v: profiled[shape, v] for v in (a, b)}
            lines.append(f"\n## {name}: kernels Inductor generated for a block (forward; backward; further graphs)\n")
            for v in (a, b):
                lines += [
                    f"- {v}, graph {i}: {kernels.graph_summary(graph)}\n" for i, graph in enumerate(prof[v]["graphs"])
                ]
            lines.append(f"\n## {name}: ms per step by kernel kind\n\n")
            lines.append(
                markdown_table(
                    ["kind", f"ms {a}", f"ms {b}", "diff ms", f"launches {a}", f"launches {b}"],
                    kernels.kind_table(prof[a], prof[b]),
                )
            )
            lines.append(
                "\ntop kernel differences (ms per step, launches per step):\n\n```\n"
                + "\n".join(kernels.top_differences(prof[a], prof[b]))
                + "\n```\n"
            )
            lines.append(
                f"\n{a}'s most expensive kernels (ms per step, launches per step):\n\n```\n"
                + "\n".join(kernels.top_kernels(prof[a]))
                + "\n```\n"
            )
            busy = {v: prof[v]["busy_ms"] for v in (a, b)}
            wall = {v: prof[v]["wall_ms"] for v in (a, b)}
            blocks = "; ".join(
                f"{v} block {' + '.join(str(len(g['kernels'])) for g in prof[v]['graphs'][:2])} kernels"
                if prof[v]["graphs"]
                else f"{v} {sum(n for _, n in prof[v]['kernels'].values()):,.0f} launches per step"
                for v in (a, b)
            )
            report.record(
                "profile",
                name,
                None,
                f"busy {busy[a]:.1f} -> {busy[b]:.1f} ms, wall {wall[a]:.1f} -> {wall[b]:.1f} ms per step; {blocks}",
            )
        estimate = time.perf_counter() - began
        report.profile = lines
        write_text(report.out / "profile.md", "".join(lines))
    if report.left() >= sizes.bench_reserve:
        with report.guard("profile", "add_rounding"):
            compare_add_rounding(report, device, sizes)
    else:
        report.record("profile", "add_rounding", "skipped", f"{report.left():.0f} s left")


# ---- 6. benchmark ------------------------------------------------------------------------------


def run_bench(report: Report, device, sizes: Sizes, work: Path, groups) -> None:
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
            argv = [
                "bench",
                "--config",
                str(sizes.bench_config),
                "--shapes",
                shape,
                "--variants",
                variant,
                "--modes",
                mode,
                "--batch",
                str(sizes.bench_batch),
                "--seq-len",
                str(sizes.bench_seq),
                "--vocab-size",
                str(sizes.bench_vocab),
                "--steps",
                str(sizes.bench_steps),
                "--warmup",
                str(sizes.bench_warmup),
                "--device",
                device.type,
                "--out",
                str(out),
            ]
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
                    report.record(
                        "bench",
                        f"{shape}/{mode}/{variant}",
                        ok,
                        row.get("error") or f"{row['tokens_per_s']:,.0f} tok/s in a {seconds:.0f} s call",
                    )
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
    goals = [[g["goal"], g["where"], g["value"], met_text(g["met"])] for g in report.bench["goals"]]
    write_text(report.out / "bench.md", table + "\n" + markdown_table(["goal", "where", "value", "met"], goals))
    report.save()


def bench_goals(rows: list[dict]) -> list[dict]:
    """Issues 3 and 15's goals on the bench rows that ran without error."""
    by = {
        (r.get("shape"), r.get("mode"), r.get("variant")): r
        for r in rows
        if not r.get("error") and r.get("tokens_per_s")
    }
    goals = []
    for shape, mode in sorted({(s, m) for s, m, _ in by}):
        base, stream, reversible = (by.get((shape, mode, v)) for v in VARIANTS)
        if base and stream:
            ratio = stream["tokens_per_s"] / base["tokens_per_s"]
            goals.append(
                {
                    "goal": "streamback >= 0.99x baseline tok/s",
                    "where": f"{shape} {mode}",
                    "value": f"{ratio:.3f}x",
                    "met": ratio >= 0.99,
                }
            )
        if base and reversible and mode == "compiled":
            ratio = reversible["tokens_per_s"] / base["tokens_per_s"]
            goals.append(
                {
                    "goal": "reversible >= 0.97x baseline tok/s",
                    "where": f"{shape} {mode}",
                    "value": f"{ratio:.3f}x",
                    "met": ratio >= 0.97,
                }
            )
        if base and reversible and base.get("peak_mem_gib") is not None and reversible.get("peak_mem_gib") is not None:
            goals.append(
                {
                    "goal": "reversible peak <= baseline peak",
                    "where": f"{shape} {mode}",
                    "value": f"{reversible['peak_mem_gib']:.2f} vs {base['peak_mem_gib']:.2f} GiB",
                    "met": reversible["peak_mem_gib"] <= base["peak_mem_gib"],
                }
            )
        if base and mode == "compiled" and shape in MFU_GOALS and base.get("mfu"):
            goals.append(
                {
                    "goal": f"baseline MFU >= {100 * MFU_GOALS[shape]:.0f}%",
                    "where": f"{shape} {mode}",
                    "value": f"{100 * base['mfu']:.1f}%",
                    "met": base["mfu"] >= MFU_GOALS[shape],
                }
            )
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
        goals.append(
            {
                "goal": "tok/s (MFU) above the reference",
                "where": " ".join(key),
                "value": value,
                "met": row["tokens_per_s"] >= ref_tps,
            }
        )
    return goals


# ---- main ------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Run:
    """What a phase runs with."""

    report: Report
    device: torch.device
    sizes: Sizes
    work: Path
    bench_groups: tuple


# Every phase, in the order they run: name -> function of a Run. A new phase adds itself here.
PHASES = {
    "env": lambda run: environment(run.report, run.device, run.sizes),
    "tests": lambda run: run_tests(run.report, run.device, run.sizes, run.work),
    "eval": lambda run: run_eval(run.report, run.device, run.sizes),
    "analysis": lambda run: run_analysis(run.report, run.device, run.sizes),
    "profile": lambda run: run_profile(run.report, run.device, run.sizes),
    "bench": lambda run: run_bench(run.report, run.device, run.sizes, run.work, run.bench_groups),
}
PARTS = tuple(PHASES)


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
    parser.add_argument("--bench-groups", default=None, help="SHAPE:MODE,... in order (default: compiled first)")
    parser.add_argument("--work", type=Path, default=None, help="scratch folder (default: a new temporary one)")
    args = parser.parse_args(argv)
    args.parts = [p for p in args.parts.split(",") if p]
    if not args.parts or set(args.parts) - set(PARTS):
        parser.error(f"--parts: choose from {','.join(PARTS)}")
    sizes = QUICK if args.quick else GPU
    if "bench" not in args.parts:  # no time is kept back for a bench that does not run
        sizes = dataclasses.replace(sizes, bench_reserve=0.0)
    try:
        groups = bench_groups(args.bench_groups, sizes)
    except ValueError as err:
        parser.error(str(err))
    if args.device is None and not torch.cuda.is_available():
        parser.error("no CUDA device: pass --device cpu (with --quick for the CPU's sizes)")
    device = torch.device(args.device or "cuda")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    work = args.work or Path(tempfile.mkdtemp(prefix="gpu_checks-"))
    work.mkdir(parents=True, exist_ok=True)
    run = Run(Report(args.budget or sizes.budget, args.out), device, sizes, work, groups)
    run.report.env.update(machine(device))
    for part, phase in PHASES.items():
        if part in args.parts:
            with run.report.guard(part, "phase"):  # what breaks outside a check's own guard
                phase(run)
            if device.type == "cuda":
                torch.cuda.empty_cache()
            run.report.save()
    text = summary_text(run.report, args, GPU_TEST_FILES, REFERENCE, LISTED)
    write_text(args.out / "summary.md", text)
    print("\n" + text, flush=True)
    return 1 if run.report.failed() else 0


if __name__ == "__main__":
    sys.exit(main())
