"""The page's answer from constructed tables: the rows over seeds carry the minimum detectable
effect and the seeds a band takes, the verdict table and sentences say them, the identical
one-item difference is not called consistent, and the answer section opens with the forest plot."""

import re

import numpy as np
import pandas as pd
import pytest

from streamback import layout, stats
from streamback.analysis.loss import final_differences, primary_table
from streamback.config import load_config, merge_config, validate_config
from streamback.eval.tables import across_seeds_rows
from streamback.report import answer, page
from streamback.runs import comparisons, run_matrix

SEEDS = [0, 1, 2]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A default config of one shape over three seeds and its two tables written under tmp_path:
    loss_difference.csv from constructed window losses (StreamBack 0.01 nats lower, seed spread
    0.002, window noise 0.02), benchmark_pairs.csv from constructed items (one item of 100 lost
    by StreamBack in each seed, and a task it wins by 20 to 25 points); built once for the module."""
    tmp_path = tmp_path_factory.mktemp("answer")
    config = validate_config(
        merge_config(load_config(), {"train": {"runs": {"shapes": ["tiny-medium"], "streams": [], "seeds": SEEDS}}})
    )
    matrix = run_matrix(config["train"])
    pairs = comparisons(matrix)
    rng = np.random.default_rng(0)
    losses = {}
    for shape, base, other in pairs:
        shift = 0.01 + 0.002 * rng.standard_normal()
        for split in ("train", "val"):
            a = 3.0 + 0.3 * rng.standard_normal(64)
            losses[base, split], losses[other, split] = a, a - shift + 0.02 * rng.standard_normal(64)
    curves = pd.DataFrame(columns=["shape", "comparison", "seed", "split", "smoothed"])
    loss = final_differences(pairs, matrix, losses, curves, config["analysis"], 64)
    rows = []
    for shape, base, other in pairs:
        seed = matrix[other].seed
        for task, items in (
            ("lost_one", np.array([-1.0] + [0.0] * 99)),
            ("won", np.array([1.0] * (20 + 2 * seed) + [0.0] * (80 - 2 * seed))),
        ):
            rows.append(
                {
                    "shape": shape,
                    "comparison": "streamback",
                    "seed": seed,
                    "task": task,
                    "filter": "none",
                    "metric": "acc",
                    "baseline": base,
                    "run": other,
                    "stream": "fp32",
                    "n": 100,
                    "_items": list(items),
                    "diff": items.mean(),
                    "baseline_value": 0.5,
                    "value": 0.5 + items.mean(),
                    "p_holm": 1.0,
                }
            )
    bench = pd.DataFrame(across_seeds_rows(rows, [], config["eval"]["pairs"]))
    (tmp_path / layout.TABLES_DIR).mkdir(parents=True)
    loss.to_csv(tmp_path / layout.table("loss_difference"), index=False)
    primary_table(loss, config["analysis"]).to_csv(tmp_path / layout.table(layout.PRIMARY_TABLE), index=False)
    per_seed = pd.DataFrame(rows).drop(columns=["_items"]).assign(mdd=float("nan"), seeds=1)
    pd.concat([per_seed, bench], ignore_index=True).to_csv(tmp_path / layout.table("benchmark_pairs"), index=False)
    return tmp_path, (config, loss, bench)


@pytest.fixture
def tables(built, tmp_path, monkeypatch):
    """The built tables in a fresh copy of their directory, as the working directory."""
    import shutil

    shutil.copytree(built[0] / "results", tmp_path / "results")
    monkeypatch.chdir(tmp_path)
    return built[1]


def test_the_rows_over_seeds_carry_the_resolution(tables):
    _, loss, bench = tables
    row = loss[(loss.seed == "all") & (loss.split == "val")].iloc[0]
    seeds = loss[(loss.seed != "all") & (loss.split == "val")]
    sd = seeds.final_difference.std(ddof=1)
    # derived: the same formula by hand on the same floats (fp64 roundings only, within approx's default 1e-6)
    assert row.seeds == 3 and row.sd == pytest.approx(sd) and row.band == 0.001 and row.target == 0.002
    # derived: a sample sd of 64 draws has relative sd 1/sqrt(2 x 63) = 0.09: 0.3 is 3.4 sd
    assert row.within_se == pytest.approx(0.02 / 8, rel=0.3)  # 64 windows of noise 0.02
    sigma = max(sd, row.within_se)
    # derived: the same formula by hand on the same floats (fp64 roundings only, within approx's default 1e-6); here and
    # below
    assert row.mde == pytest.approx(stats.seed_mde(sigma, 3, 0.05, 0.8))
    assert row.seeds_for_band == stats.seeds_needed(sigma, 0.001) and row.seeds_for_band > 3
    assert row.p_seeds == 0.25  # every seed the same sign: the exact floor of three seeds
    lost = bench[bench.task == "lost_one"].iloc[0]
    assert (
        lost.sd == 0 and lost.boot_high == 0.0 and lost.p_seeds == 0.25 and lost.verdict.startswith("within seed noise")
    )
    assert (
        lost.mde == pytest.approx(stats.seed_mde(0.0, 3, 0.05, 0.8, lost.within_se)) and lost.mde > 0
    )  # the items' noise
    won = bench[bench.task == "won"].iloc[0]
    assert won.verdict.startswith("consistent across seeds: better by 22.0 points")


def test_the_answer_says_what_the_tier_resolves_and_opens_with_the_forest_plot(tables):
    config, loss, _ = tables
    row = loss[(loss.seed == "all") & (loss.split == "val")].iloc[0]
    text = " ".join(map(str, answer.loss(config)))
    assert (
        f"this tier resolves |Δ| ≥ {row.mde:.4f} nats; the paper's band of ±0.001 nats would take "
        f"{int(row.seeds_for_band):,} seeds at this spread"
    ) in text
    words = " ".join(map(str, answer.benchmarks(config)))
    assert "1 of 2 benchmark comparisons" in words and "tiny-medium-streamback on won acc (+22.0 points" in words
    assert "lost_one" not in words.split("are consistent across seeds")[1].split(";")[0]
    assert (
        "cannot give p below 0.25, so after Holm over a comparison's 2 tests no difference can reach alpha 0.05 (that "
        "takes 7 seeds)" in words
    )  # 2 x 2 / 2^7 <= 0.05 < 2 x 2 / 2^6
    table = answer.verdicts()
    assert list(table.quantity) == [
        "final train loss (nats)",
        "final val loss (nats)",
        "lost_one acc (points)",
        "won acc (points)",
    ]
    assert table.set_index("quantity").loc["lost_one acc (points)", "verdict"] == "within seed noise"
    assert (
        table.set_index("quantity").loc["final val loss (nats)", "seeds for the band"]
        == f"±0.001 nats: {int(row.seeds_for_band):,} ({int(row.seeds_for_band_low):,} to "
        f"{int(row.seeds_for_band_high):,})"
    )
    study_ = page.Study(config=config, config_files=[])
    blocks = page.the_answer(study_)
    # at most five short sentences, the primary test's first; then the forest plot: an Altair chart with its bands
    first = next(i for i, b in enumerate(blocks) if not isinstance(b, str))
    assert 1 <= first <= 5 and blocks[0].startswith(answer.lead(pd.read_csv(layout.table("primary")).verdict_band[0]))
    chart = blocks[first]
    spec = chart.to_dict()
    assert spec["facet"]["row"]["sort"] == ["tiny-medium"]  # the config's order of shapes
    assert spec["facet"]["row"]["field"] == "shape" and len(spec["spec"]["layer"]) == 7
    marks = [
        layer["mark"]["type"] if isinstance(layer["mark"], dict) else layer["mark"] for layer in spec["spec"]["layer"]
    ]
    assert marks == ["rect", "rect", "rule", "point", "rule", "rule", "point"]
    assert isinstance(blocks[first + 3], pd.DataFrame) and [name for name, _ in page.sections(study_)][:2] == [
        "The answer",
        "What was run",
    ]
    from streamback.charts import save_figure

    save_figure(chart, layout.SEED_FIGURE)  # Vega draws it: the bands, bars and points of both kinds
    svg = layout.figure(layout.SEED_FIGURE, "svg").read_text()
    assert svg.lstrip().startswith("<svg") and "final val loss" in svg and "won acc" in svg
    width = float(re.search(r'<svg[^>]*\swidth="([\d.]+)"', svg).group(1))
    assert width <= 1400, width  # the page's viewport in test_the_page_renders_offline_in_chromium


def test_the_benchmark_answer_leads_with_the_tasks_that_can_rank(tables):
    from streamback.report.seeds import task_snr

    config, _, _ = tables
    matrix = run_matrix(config["train"])
    wobble = {0: -1.0, 1: 0.0, 2: 1.0}
    rows = []
    for name, spec in matrix.items():
        top = 0.6 if spec.block == "streamback" else 0.5
        rows += [
            {"run": name, "task": "clear", "filter": "none", "metric": "acc", "value": top + 0.01 * wobble[spec.seed]},
            {
                "run": name,
                "task": "coin",
                "filter": "none",
                "metric": "acc",
                "value": 0.5 + (top - 0.5) / 10 + 0.05 * wobble[spec.seed],
            },
        ]
    table = task_snr(config["train"], pd.DataFrame(rows))
    assert (
        list(table.task) == ["clear", "coin"]
        and (table.models == 2).all()
        and (table.noise_from == "training seeds").all()
    )
    clear, coin = table.iloc[0], table.iloc[1]
    sd = 0.01 * np.sqrt(2 / 3)  # np.std of -1, 0, 1 times 0.01
    # derived: the same formula by hand on the same floats (fp64 roundings only, within approx's default 1e-6); here and
    # below
    assert clear.snr == pytest.approx(0.1 / sd) and clear.can_rank
    assert coin.snr == pytest.approx(0.01 / (5 * sd)) and not coin.can_rank and coin.decision_accuracy < 0.6
    table.to_csv(layout.table("task_snr"), index=False)
    words = answer.benchmarks(config)
    assert words[0].startswith("Over the 2 run arms, with each arm's noise from its training seeds")
    assert "1 of 2 task metrics can rank these models: clear acc (SNR " in words[0]
    assert words[0].index("clear acc") < words[0].index("Cannot rank at this scale (SNR below 2.77): coin acc (SNR 0.2")


def _mechanism_tables(matrix, ratios, flips_of, share_of):
    """layer_error.csv, swallowed.csv and envelope.csv of constructed runs: the last layer's error ratio
    bf16 / fp32 `ratios[run]`, the bf16 stream's sign-flip share `flips_of(i, run)` (fp32: 0.001), its
    swallowed share `share_of(i, run)` (fp32: 0.001), and a reach 5 higher in StreamBack runs."""
    rows, swallowed, envelope = [], [], []
    for i, run in enumerate(matrix):
        for variant, error, flips in (("bf16", 1e-2, flips_of(i, run)), ("fp32", 1e-2 / ratios[run], 0.001)):
            rows += [
                {
                    "run": run,
                    "seed": matrix[run].seed,
                    "variant": variant,
                    "kind": "activations",
                    "layer": layer,
                    "max_abs_error": error * (layer + 1) / 3,
                    "sign_flip_fraction": flips,
                }
                for layer in range(3)
            ]
        swallowed += [
            {"run": run, "seed": matrix[run].seed, "variant": v, "swallowed_fraction": f, "lost_mass_fraction": f / 10}
            for v, f in (("bf16", share_of(i, run)), ("fp32", 0.001))
        ]
        top = 40.0 + i + (5.0 if matrix[run].block == "streamback" else 0.0)
        envelope += [{"run": run, "seed": matrix[run].seed, "layer": 0, "max": top, "min": -top}]
    for name, frame in (("layer_error", rows), ("swallowed", swallowed), ("envelope", envelope)):
        pd.DataFrame(frame).to_csv(layout.table(name), index=False)


def test_the_mechanisms_get_intervals_over_seeds_and_resolution(tables):
    """layer error, sign flips, swallowed share and envelope on constructed per-run tables: each
    sentence gives the t interval over the seeds, a seed the mean of its two runs (they share weights
    and batches), and what they resolve, from streamback.stats."""
    config, _, _ = tables
    matrix = run_matrix(config["train"])
    runs = list(matrix)
    ratios = dict(zip(runs, [10.0, 12.0, 8.0, 11.0, 9.0, 14.0]))
    _mechanism_tables(matrix, ratios, lambda i, run: 0.02 + 0.001 * i, lambda i, run: 0.2 + 0.002 * i)

    def by_seed(per_run):  # one value a seed: the mean of the seed's runs
        return np.array([np.mean([per_run[r] for r in runs if matrix[r].seed == s]) for s in SEEDS])

    text = answer.layer_error(matrix)[0]
    logs = by_seed({r: np.log(v) for r, v in ratios.items()})
    summary = stats.across_seeds(logs, 0.95)
    assert (
        f"geometric mean {np.exp(logs.mean()):.1f}, 95% t interval ×{np.exp(summary['low']):.2f} to "
        f"×{np.exp(summary['high']):.2f} over 3 seeds of 1 shape, a seed the mean of its runs" in text
    )
    assert f"they resolve a ratio beyond ×{np.exp(stats.seed_mde(summary['sd'], 3)):.2f}" in text
    gap = by_seed({r: 100 * (0.02 + 0.001 * i - 0.001) for i, r in enumerate(runs)})
    flips = stats.across_seeds(gap, 0.95)
    assert f"in points of coordinates: 95% t interval {flips['low']:+.3f} to {flips['high']:+.3f} over 3 seeds" in text
    text = answer.swallowed(matrix)[0]
    share = stats.across_seeds(by_seed({r: 100 * (0.2 + 0.002 * i - 0.001) for i, r in enumerate(runs)}), 0.95)
    assert (
        f"bf16 minus fp32, in points: 95% t interval {share['low']:+.2f} to {share['high']:+.2f} over 3 seeds of 1 "
        f"shape, a seed the mean of its runs; they resolve |Δ| ≥ {stats.seed_mde(share['sd'], 3):.2f}"
    ) in text
    text = answer.envelope(config, comparisons(matrix))[0]
    # StreamBack's top minus the baseline's of the same seed: 5 + 3 in every seed (the matrix lists the three
    # baselines, then StreamBack)
    assert (
        "StreamBack's maximum minus the baseline's, per seed: tiny-medium: +8.0 (95% t interval +8.0 to +8.0 over 3 "
        "seeds; no spread" in text
    )


def test_a_seed_s_duplicate_runs_give_the_one_run_a_seed_interval(tables):
    """Each seed's two runs measure alike: every mechanism interval on the page is the t interval of
    one value a seed (scipy's, 2 degrees of freedom), as if each seed had trained one run."""
    from scipy import stats as sps

    config, _, _ = tables
    matrix = run_matrix(config["train"])
    per_seed = {0: 10.0, 1: 12.0, 2: 9.0}
    _mechanism_tables(
        matrix,
        {r: per_seed[matrix[r].seed] for r in matrix},
        lambda i, run: 0.02 + 0.001 * matrix[run].seed,
        lambda i, run: 0.2 + 0.01 * matrix[run].seed ** 2,
    )
    logs = np.log(list(per_seed.values()))
    low, high = sps.t.interval(0.95, 2, logs.mean(), sps.sem(logs))
    assert f"95% t interval ×{np.exp(low):.2f} to ×{np.exp(high):.2f} over 3 seeds" in answer.layer_error(matrix)[0]
    shares = 100 * (0.2 + 0.01 * np.array([0, 1, 4]) - 0.001)
    low, high = sps.t.interval(0.95, 2, shares.mean(), sps.sem(shares))
    assert f"95% t interval {low:+.2f} to {high:+.2f} over 3 seeds" in answer.swallowed(matrix)[0]
    headline = answer.headline(config)
    assert f"(×{np.exp(sps.t.interval(0.95, 2, logs.mean(), sps.sem(logs))[0]):.1f}" in headline[1]


def test_the_first_sentence_of_each_primary_verdict():
    """primary.csv's verdict against the paper's band opens the page's first sentence in plain words;
    one seed a shape gives no interval and says so."""
    row = pd.Series(
        {"estimate": 0.024, "low": 0.006, "high": 0.042, "seeds": 15, "strata": 3, "p": 0.004, "band": 0.001}
    )
    for verdict, opening in (
        ("different", "On this tier the fp32 stream changes training: "),
        ("different, but within ±0.05 nats", "On this tier the fp32 stream changes training, but by less than"),
        ("equivalent within ±0.001 nats", "On this tier the fp32 stream does not change training beyond the paper's"),
        ("inconclusive", "This tier cannot tell whether the fp32 stream changes training: "),
    ):
        text = answer.primary_sentence(pd.Series({**row, "verdict_band": verdict}))
        assert text.startswith(opening) and text.endswith(f"against the paper's ±0.001 nats: {verdict}).")
        assert (
            "0.0240 nats lower than the baseline's (95% t interval +0.0060 to +0.0420 nats over 15 seeds of 3 " in text
        )
        assert "exact sign-flip p = 0.004" in text
    single = pd.Series({**row, "low": float("nan"), "high": float("nan"), "seeds": 3, "verdict_band": "inconclusive"})
    assert "over 3 seeds of 3 shapes: one seed a shape gives no interval" in answer.primary_sentence(single)
