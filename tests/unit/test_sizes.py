"""The jobs' sizes from the config (streamback/sizes.py): parameter counts against the model itself,
the analyses' peak GPU memory and time floor against what the H200 measured (read from the
measurement files, so no measured figure is copied into the code)."""

import re
from pathlib import Path

import pytest
import torch

from streamback import sizes
from streamback.config import load_config
from streamback.model.model import ModelArgs, Transformer, count_params
from streamback.runs import run_matrix

ROOT = Path(__file__).resolve().parents[2]
H200 = ROOT / "docs" / "measurements" / "h200-2026-12-04"
CONFIGS = ["config/config.yaml", "config/paper.yaml", "config/one-gpu.yaml"]


def measured_layer_error() -> dict[str, tuple[float, float]]:
    """shape -> (seconds, peak GiB) of layer-error, from the README's table of the analysis phase."""
    text = (H200 / "README.md").read_text()
    rows = re.findall(r"^\| ([a-z-]+) \(\d+ x \d+\) \| ([\d.]+) s \| \**([\d.]+)\** \|", text, re.MULTILINE)
    assert len(rows) == 3, "the README's layer-error table changed: update this reader"
    return {shape: (float(seconds), float(peak)) for shape, seconds, peak in rows}


def measured_findings() -> dict[tuple[str, str], float]:
    """(shape, kind) -> peak GiB of swallowed and envelope, from analysis_summary.md's findings."""
    text = (H200 / "analysis_summary.md").read_text()
    rows = re.findall(r"analysis/([a-z-]+)_(swallowed|envelope): [\d.]+ s, peak ([\d.]+) GiB; (\d+) variant", text)
    assert len(rows) == 6, "analysis_summary.md's findings changed: update this reader"
    return {(shape, kind): float(peak) for shape, kind, peak, _ in rows}


def paper():
    return load_config(ROOT / "config" / "paper.yaml")


def measured_batch() -> tuple[int, int, list[str]]:
    """The batch the H200 measured at: the README's "4 x 2048 tokens, 13 variants" (the paper's analysis
    section at that commit, whose variants config/paper.yaml still lists)."""
    text = (H200 / "README.md").read_text()
    batch, seq_len, count = map(int, re.search(r"\((\d+) x (\d+) tokens, (\d+) variants\)", text).groups())
    variants = paper()["analysis"]["variants"]
    assert len(variants) == count
    return batch, seq_len, variants


@pytest.mark.parametrize("path", CONFIGS)
def test_the_parameter_count_is_the_models_own(path):
    """Every shape of each config: the count from its dimensions equals the parameters of the model built
    from them (on the meta device: no memory), tied or not."""
    cfg = load_config(ROOT / path)
    for name in cfg["model"]["shapes"]:
        for tied in (False, True):
            model_cfg = {**cfg["model"], "tied_embeddings": tied}
            args = ModelArgs.from_config(model_cfg, name, 1000)
            with torch.device("meta"):
                model = Transformer(args)
            assert sizes.param_counts(model_cfg, name, 1000)["total"] == count_params(model), (name, tied)
            assert sizes.param_counts(model_cfg, name, 1000)["blocks"] == sum(
                p.numel() for p in model.layers.parameters()
            )


# The estimate against the H200's peaks (torch.cuda.max_memory_allocated), within 5% either way: the
# plan keeps a job under 90% of its GPU (the preflight's memory bound), so an estimate 5% low still
# leaves the job 0.9 x 1.05 < 1 of the GPU, and one 5% high wastes no more than that.
TOLERANCE = 0.05


@pytest.mark.parametrize("shape", ["skinny-tall", "medium", "fat-short"])
def test_the_layer_error_estimate_meets_the_h200s_peak(shape):
    """The medium shape's ground truth runs fp32 attention on head_dim 94, which no fused kernel takes:
    its B x H x T x T probabilities are the peak that an 80 GB GPU does not hold."""
    batch, seq_len, variants = measured_batch()
    cfg = paper()
    built = sizes.shape_of(cfg["model"], shape, sizes.LLAMA3_VOCAB)
    estimate = sizes.analysis_peak_bytes("layer-error", built, batch, seq_len, variants, "fp32") / sizes.GIB
    _, peak = measured_layer_error()[shape]
    assert estimate == pytest.approx(peak, rel=TOLERANCE)


@pytest.mark.parametrize("shape", ["skinny-tall", "medium", "fat-short"])
@pytest.mark.parametrize("kind", ["swallowed", "envelope"])
def test_the_forward_analyses_estimates_meet_the_h200s_peaks(shape, kind):
    batch, seq_len, variants = measured_batch()
    built = sizes.shape_of(paper()["model"], shape, sizes.LLAMA3_VOCAB)
    estimate = sizes.analysis_peak_bytes(kind, built, batch, seq_len, variants) / sizes.GIB
    assert estimate == pytest.approx(measured_findings()[shape, kind], rel=TOLERANCE)


def test_the_analyses_time_floor_is_under_the_h200s_rate_on_an_h100():
    """ANALYSIS_TFLOPS, the rate the analyses' time limits assume, is below every measured layer-error
    rate (its passes' FLOPs over its seconds) slowed by the H100's bound: a limit never too short there."""
    batch, seq_len, _ = measured_batch()
    cfg = paper()
    config = {**cfg, "analysis": {**cfg["analysis"], "batch_size": batch}}
    for shape, (seconds, _) in measured_layer_error().items():
        built = sizes.shape_of(cfg["model"], shape, sizes.LLAMA3_VOCAB)
        flops = sizes.analysis_passes(config, "layer-error") * 2 * batch * seq_len * built.params
        assert sizes.ANALYSIS_TFLOPS * 1e12 < flops / seconds / sizes.H100_SLOWDOWN, shape


def test_the_paper_tiers_analyses_fit_an_80_gb_gpu():
    """config/paper.yaml's analysis batch: every analysis of every shape under 90% of 80 GB."""
    cfg = paper()
    runs = run_matrix(cfg["train"])
    for kind in ("layer-error", "swallowed", "envelope", "loss-difference", "public"):
        job = sizes.analysis_job(cfg, kind, runs, sizes.LLAMA3_VOCAB)
        assert job["gpu_bytes"] <= 0.9 * 80e9, kind


def test_export_hf_asks_for_three_models_and_the_interpreter():
    """The export's memory: the fp32 model three times over and 4 GB, with the margin; a key overrides it."""
    cfg = paper()
    built = sizes.shape_of(cfg["model"], "skinny-tall", sizes.LLAMA3_VOCAB)
    job = sizes.export_job(cfg, "skinny-tall", sizes.LLAMA3_VOCAB)
    assert job["mem_mb"] == job["need_mb"] >= 3 * 4 * built.params / 1e6 + sizes.HOST_BASE_MB
    cfg["analysis"]["export_resources"]["mem_mb"] = 1000
    assert sizes.export_job(cfg, "skinny-tall", sizes.LLAMA3_VOCAB)["mem_mb"] == 1000


def test_costs_md_states_the_tiers_h100_bound_from_the_h200s_hours():
    """docs/costs.md's H100 table: each tier's H200-hours (its config's train.stated_gpu_hours) times
    H100_SLOWDOWN, the bound the plan counts with."""
    text = (ROOT / "docs" / "costs.md").read_text()
    for name, path in (("one GPU", "one-gpu.yaml"), ("paper", "paper.yaml")):
        stated = load_config(ROOT / "config" / path)["train"]["stated_gpu_hours"]
        row = re.search(
            rf"^\| {name} \(`config/{path}`\) \| ([\d,.]+) \| about [\d,]+ \| ([\d,.]+) \|$", text, re.MULTILINE
        )
        assert row, name
        assert float(row.group(1).replace(",", "")) == stated
        assert float(row.group(2).replace(",", "")) == round(stated * sizes.H100_SLOWDOWN, 1)


def test_an_analysis_over_its_gpu_stops_before_it_starts_naming_the_batch_that_fits():
    """`streamback analyze` on a GPU checks each model against the device's memory before its passes: medium's
    layer-error at 4 x 2048 on an 80 GB GPU (the H200's measured 96.9 GiB) names batch 2; on a 141 GB one it runs."""
    from streamback.analysis.stage import check_fits, device_memory
    from streamback.errors import StreambackError

    cfg = paper()
    args = ModelArgs.from_config(cfg["model"], "medium", sizes.LLAMA3_VOCAB, "streamback")
    with pytest.raises(
        StreambackError,
        match=r"analyze layer-error: medium-streamback needs an estimated .* GiB .* "
        r"set analysis.batch_size to 2 or less",
    ):
        check_fits("layer-error", args, 4, 2048, cfg["analysis"], 80 * 10**9, "medium-streamback")
    check_fits("layer-error", args, 4, 2048, cfg["analysis"], 141 * 10**9, "medium-streamback")
    check_fits("layer-error", args, 4, 2048, cfg["analysis"], None, "medium-streamback")  # the CPU: mem_mb's
    assert device_memory("cpu") is None
    assert sizes.shape_of_args(args) == sizes.shape_of(cfg["model"], "medium", sizes.LLAMA3_VOCAB)


def _allocator_peak(fn) -> int:
    """Peak bytes the CPU allocator reports (profiler memory events) over `fn()`, above what existed before."""
    import gc

    from torch.profiler import ProfilerActivity, profile

    from streamback.model import compute

    gc.collect()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof, compute.use("native"):
        fn()
    events = sorted(
        (e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"), key=lambda e: e.start_ns()
    )
    current = peak = 0
    for event in events:
        current += event.nbytes()
        peak = max(peak, current)
    return peak


# Within 10% on the CPU: the jobs ask for MARGIN (1.25) times the estimate, so one 10% low still fits its job.
# These tiny shapes make the small tensors the estimate leaves out (norm statistics, the comparisons' fp64
# temporaries) a larger share than at the paper's sizes, where the H200's peaks are within 5%.
CPU_TOLERANCE = 0.10


@pytest.mark.slow
def test_the_cpu_estimate_meets_the_allocators_peak_of_the_real_analyses():
    """The analysis code itself (streamback.analysis.precision) on a tiny model with the tiny shapes' fp64 ground
    truth, on native bf16 kernels (those whose tensors the estimate counts), against the CPU allocator's own
    accounting."""
    reference = "fp64"
    from streamback.analysis.precision import layer_error
    from streamback.model.weights import TrainedModel

    args = ModelArgs(dim=128, n_layers=4, n_heads=4, n_kv_heads=1, vocab_size=512, multiple_of=32, block="streamback")
    model = Transformer(args)
    model.init_weights(0)
    trained = TrainedModel(args, {k: v.detach().clone() for k, v in model.state_dict().items()}, "fp32", torch.bfloat16)
    del model
    batch, seq_len, variants = 4, 64, ["bf16", "fp32", "nvfp4"]
    tokens = torch.randint(0, args.vocab_size, (batch, seq_len + 1), generator=torch.Generator().manual_seed(0))
    shape = sizes.shape_of_args(args)
    estimate = sizes.analysis_peak_bytes("layer-error", shape, batch, seq_len, variants, reference, cuda=False)
    peak = _allocator_peak(lambda: layer_error(trained, tokens, reference, variants, "cpu", 0))
    assert estimate == pytest.approx(peak, rel=CPU_TOLERANCE)
