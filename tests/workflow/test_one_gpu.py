"""config/one-gpu.yaml, the middle tier: its runs can be trained, it dry-runs (also through the
Slurm profile), its cost arithmetic (docs/costs.md and the README's tiers table) follows from the
measured H200 figures shipped in docs/measurements/, and its micro-batch fits an 80 GB GPU by
`streamback memory`'s estimate."""

import re

import pytest
import torch

from streamback.config import load_config
from streamback.model.model import ModelArgs, Transformer, count_params
from streamback.runs import check_runs, run_matrix, train_steps

from conftest import ROOT

CONFIG = ROOT / "config" / "one-gpu.yaml"
README = (ROOT / "README.md").read_text()
COSTS = (ROOT / "docs" / "costs.md").read_text()
MEASURED = ROOT / "docs" / "measurements" / "h200-2026-12-01"
VOCAB = 128256  # the Llama 3 tokenizer's, as in the measured step
GB80 = 80e9
BLOCKS = ("baseline", "streamback")


def _number(text):
    return float(text.replace(",", ""))


def _h200():
    """The measured H200 figures the costs rest on: from gpu_checks_summary.md the bf16 matmul rate
    and, per paper shape, the compiled step's tokens/s and MFU column (baseline, streamback) at
    micro-batch 4 x 2048; from kernel_profile.md the matmul kernels' ms of the same step.
    skinny-tall's StreamBack step was not profiled; the stream changes no matmul (medium +0.50 ms,
    fat-short -0.53 ms), so its baseline's stands in."""
    summary = (MEASURED / "gpu_checks_summary.md").read_text()
    (rate,) = re.findall(r"^bf16 matmul ([\d.]+) TFLOP/s", summary, re.MULTILINE)
    tokens, mfu = {}, {}
    for shape, block, tps, share in re.findall(
        r"^\| ([\w-]+) \| compiled \| (baseline|streamback) \| ([\d,]+) \| [\d.]+ \| ([\d.]+) \|", summary, re.MULTILINE
    ):
        tokens.setdefault(shape, [None, None])[BLOCKS.index(block)] = int(_number(tps))
        mfu.setdefault(shape, [None, None])[BLOCKS.index(block)] = _number(share)
    profile = (MEASURED / "kernel_profile.md").read_text()
    matmul = {}
    for section in profile.split("\n## ")[1:]:
        head = re.match(r"([\w-]+) compiled: .*\(baseline vs ([\w-]+)\)", section)
        if head is None:
            continue
        (row,) = re.findall(r"^\| matmul \| ([\d.]+) \| ([\d.]+) \|", section, re.MULTILINE)
        base, other = map(_number, row)
        matmul[head[1]] = (base, other if head[2] == "streamback" else base)
    assert set(tokens) == set(mfu) == set(matmul) == {"skinny-tall", "medium", "fat-short"}, (tokens, matmul)
    return {
        "matmul_tflops": _number(rate),
        "micro_batch": 4,
        "seq_len": 2048,
        "tokens_per_s": {k: tuple(v) for k, v in tokens.items()},
        "mfu_percent": {k: tuple(v) for k, v in mfu.items()},
        "matmul_ms": matmul,
    }


H200 = _h200()
TRAIN_SHARE = 0.9  # of the measured step's speed, as docs/costs.md assumes for both GPU tiers


@pytest.fixture(scope="module")
def tier():
    return load_config(CONFIG)


def _model(model_cfg, shape, block="baseline"):
    with torch.device("meta"):
        return Transformer(ModelArgs.from_config(model_cfg, shape, VOCAB, block=block))


def _flops(model, seq_len):
    from streamback.measure.step import flops_per_token

    return flops_per_token(model, seq_len)


def _paper_shape(tier_shape):
    return tier_shape.removeprefix("small-")


@pytest.fixture(scope="module")
def cost(tier):
    """Per tier shape: FLOPs/token of paper and tier shapes, and per block the MFU, tier tokens/s and
    H200-hours a run (MFU carried over), and the hours by the kernel-profile cross-check."""
    paper_model = load_config(ROOT / "config" / "paper.yaml")["model"]
    train = tier["train"]
    seq_len, peak = train["seq_len"], H200["matmul_tflops"] * 1e12
    tokens = train_steps(train) * train["batch_size"] * seq_len
    measured_tokens = H200["micro_batch"] * H200["seq_len"]
    out = {}
    for shape in train["runs"]["shapes"]:
        paper = _paper_shape(shape)
        mp, mt = _model(paper_model, paper), _model(tier["model"], shape)
        fp, ft = _flops(mp, H200["seq_len"]), _flops(mt, seq_len)
        row = {"flops": (fp, ft)}
        for i, block in enumerate(BLOCKS):
            measured = H200["tokens_per_s"][paper][i]
            mfu = measured * fp / peak
            speed = mfu * peak / ft
            # kernel profile: matmul time scales with the matmul FLOPs of a micro-batch, the rest stays
            step_s, matmul_s = measured_tokens / measured, H200["matmul_ms"][paper][i] / 1e3
            micro_tokens = train["micro_batch_size"] * seq_len
            matmul_ratio = (
                micro_tokens
                * count_params(mt, exclude_embeddings=True)
                / (measured_tokens * count_params(mp, exclude_embeddings=True))
            )
            kernel_speed = micro_tokens / (matmul_s * matmul_ratio + step_s - matmul_s)
            row[block] = {
                "measured": measured,
                "mfu": mfu,
                "speed": speed,
                "hours": tokens / (TRAIN_SHARE * speed) / 3600,
                "kernel_hours": tokens / (TRAIN_SHARE * kernel_speed) / 3600,
            }
        out[shape] = row
    return out


def test_the_tier_keeps_the_paper_s_depths_and_parameter_ratios(tier):
    paper = load_config(ROOT / "config" / "paper.yaml")["model"]
    for shape in tier["train"]["runs"]["shapes"]:
        s, p = tier["model"]["shapes"][shape], paper["shapes"][_paper_shape(shape)]
        assert (
            s["n_layers"] == p["n_layers"]
            and 2 * s["dim"] == p["dim"]
            and s["dim"] // s["n_heads"] == p["dim"] // p["n_heads"]
        )
        blocks = lambda cfg, name: (
            count_params(_model(cfg, name), exclude_embeddings=True) - VOCAB * cfg["shapes"][name]["dim"]
        )
        # derived: half the dim quarters the blocks' matrices (as multiple_of's rounding of the ffn allows) and halves
        # the norm gains, whose share is ~1/dim: within 1%
        assert blocks(tier["model"], shape) / blocks(paper, _paper_shape(shape)) == pytest.approx(0.25, rel=0.01)


def test_every_run_can_be_trained(tier):
    check_runs(tier["train"], tier["model"], tier["data"])
    assert {spec.shape for spec in run_matrix(tier["train"]).values()} == set(tier["model"]["shapes"])


def _costs_row(shape):
    (line,) = [line for line in COSTS.splitlines() if line.startswith(f"| {shape}, ")]
    return re.findall(r"\d[\d,]*\.?\d*G?", line.split(" | ", 1)[1])


def test_the_measured_figures_are_read_whole():
    """The parse of the shipped summaries, against a few of their numbers read by eye."""
    assert H200["matmul_tflops"] == 787.2
    assert H200["tokens_per_s"]["medium"] == (48763, 47054) and H200["mfu_percent"]["fat-short"] == (68.7, 64.8)
    assert H200["matmul_ms"] == {
        "medium": (117.95, 118.45),
        "skinny-tall": (104.32, 104.32),
        "fat-short": (90.63, 90.10),
    }


def test_the_cost_arithmetic_follows_from_the_measured_h200_figures(tier, cost):
    """docs/costs.md's table, number by number, its totals, and the README's tier cell."""
    text = " ".join(COSTS.split())
    train = tier["train"]
    assert (
        f"{train_steps(train):,} steps x {train['batch_size'] * train['seq_len']:,} tokens / (0.9 x tokens/s)" in text
    )
    per_seed = kernel_per_seed = 0.0
    for shape, row in cost.items():
        b, s = row["baseline"], row["streamback"]
        expected = [
            f"{row['flops'][0] / 1e9:.3f}G",
            f"{row['flops'][1] / 1e9:.3f}G",
            f"{b['measured']:,}",
            f"{s['measured']:,}",
            f"{100 * b['mfu']:.1f}",
            f"{100 * s['mfu']:.1f}",
            f"{b['speed']:,.0f}",
            f"{s['speed']:,.0f}",
            f"{b['hours']:.2f}",
            f"{s['hours']:.2f}",
        ]
        assert _costs_row(_paper_shape(shape)) == expected, shape
        for i, block in enumerate(BLOCKS):
            # the FLOP count is the one the measurement's MFU column used (each row divides by its own matmul rate)
            assert 0 <= H200["mfu_percent"][_paper_shape(shape)][i] - 100 * row[block]["mfu"] < 3.5
    for spec in run_matrix(train).values():  # with train.runs.seeds the matrix holds every seed's runs
        per_seed += cost[spec.shape][spec.block]["hours"]
        kernel_per_seed += cost[spec.shape][spec.block]["kernel_hours"]
    seeds = len(train["runs"].get("seeds") or [train["seed"]])
    assert seeds == 3
    per_seed, kernel_per_seed = per_seed / seeds, kernel_per_seed / seeds
    assert (
        f"{per_seed:.1f} H200-hours a seed for the six runs; three seeds (18 runs): {3 * per_seed:.1f} H200-hours"
        in text
    )
    assert f"{kernel_per_seed:.1f} H200-hours a seed ({3 * kernel_per_seed:.1f} for three seeds)" in text
    (cell,) = [line for line in README.splitlines() if line.startswith("| one-gpu, ")]
    (about,) = re.findall(r"about ([\d,]+) H200-hours", cell)
    assert _number(about) == round(3 * per_seed, -1), (about, 3 * per_seed)


def test_the_paper_tier_s_cost_follows_from_the_measured_h200_figures():
    """docs/costs.md's GPU-hours of each paper run (tokens / (0.9 x measured tokens/s)) and the
    total in the README's tiers table."""
    train = load_config(ROOT / "config" / "paper.yaml")["train"]
    text = " ".join(COSTS.split())
    hours = {
        shape: [train["tokens"] / (TRAIN_SHARE * speed) / 3600 for speed in H200["tokens_per_s"][shape]]
        for shape in train["runs"]["shapes"]
    }
    for shape, (base, other) in hours.items():
        assert f"{shape} {base:.0f} / {other:.0f}" in text, shape
    total = sum(sum(pair) for pair in hours.values())
    assert f"About {round(total, -2):,.0f} GPU-hours for the six runs of one seed" in text
    (cell,) = [line for line in README.splitlines() if line.startswith("| paper, ")]
    assert f"about {round(total, -2):,.0f} H200-hours" in cell


def test_the_recipe_follows_the_paper_s_rules(tier):
    """lr x width, batch in tokens and the warmup and decay shares of the run are the paper's."""
    paper, train = load_config(ROOT / "config" / "paper.yaml")["train"], tier["train"]
    paper_model = load_config(ROOT / "config" / "paper.yaml")["model"]
    widths = [
        tier["model"]["shapes"][s]["dim"] / paper_model["shapes"][_paper_shape(s)]["dim"]
        for s in train["runs"]["shapes"]
    ]
    assert set(widths) == {0.5} and train["optimizer"]["lr"] == paper["optimizer"]["lr"] / 0.5
    assert train["batch_size"] * train["seq_len"] == paper["batch_size"] * paper["seq_len"]
    for key in ("warmup_steps", "decay_steps"):
        share = paper["schedule"][key] / train_steps(paper)
        assert train["schedule"][key] == round(share * train_steps(train))
    assert train["schedule"]["warmup_steps"] >= 2 / (1 - train["optimizer"]["betas"][1])
    assert (
        tier["data"]["hub"]["dataset"] == "HuggingFaceFW/fineweb"
        and tier["data"]["tokenizer"]["name"] == "meta-llama/Meta-Llama-3-8B"
    )


@pytest.mark.parametrize("profile", [[], ["--profile", "slurm"]], ids=["local", "slurm"])
def test_the_tier_dry_runs(run_snakemake, tmp_path, profile):
    result = run_snakemake("-n", "-p", *profile, "--configfile", CONFIG, "--directory", tmp_path, cwd=ROOT)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-3000:]
    runs = len(run_matrix(load_config(CONFIG)["train"]))  # 6 a seed
    assert re.search(rf"^train\s+{runs}$", out, re.MULTILINE) and re.search(rf"^evaluate\s+{runs}$", out, re.MULTILINE)
    assert "--nproc-per-node 1 --standalone -m streamback' " in out and "streamback train-attempt --launch" in out
    assert re.search(r"resources: .*runtime=600, nodes=1, gpu=1, cpus_per_gpu=8", out) and re.search(
        r"resources: .*mem_mb=64000", out
    )


@pytest.mark.slow
def test_the_micro_batch_fits_an_80gb_gpu(tier):
    """`streamback memory`'s estimate of a step's peak (the StreamBack block, the larger) plus the
    AdamW moments (two fp32 copies of the parameters) stays under 80 GB, as docs/costs.md says."""
    from streamback.measure.memory import GIB, estimate_step_memory
    from streamback.measure.step import model_args

    train, peaks = tier["train"], {}
    for shape in train["runs"]["shapes"]:
        margs = model_args(tier["model"], shape, "streamback", VOCAB)
        peak = estimate_step_memory(margs, train["micro_batch_size"], train["seq_len"])["peak"]
        moments = 8 * count_params(_model(tier["model"], shape, "streamback"))
        peaks[shape] = (peak + moments) / GIB
        assert peak + moments < GB80, (shape, peaks[shape])
    top = max(peaks, key=peaks.get)
    stated = f"{peaks[top]:.1f} GiB"
    assert stated in COSTS, (top, stated)
