"""depth.csv and depth_trend.csv (streamback.report.depth) from constructed analysis tables whose
measures change with depth by known slopes, checked against a hand computation; and the page's
section drawn from them."""

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from streamback import layout, stats
from streamback.config import DEFAULT_CONFIG, load_config, merge_config
from streamback.errors import StreambackError
from streamback.report import depth
from streamback.runs import comparison_name, run_matrix

SHAPES = {"tiny-fat-short": 2, "tiny-medium": 4, "tiny-skinny-tall": 8}  # the default's depths
SEEDS = (0, 1, 2)
JITTER = {0: -0.0002, 1: 0.0, 2: 0.0002}  # per seed, around the loss difference's line
RUN_JITTER = {"baseline": -0.01, "streamback": 0.01}  # per block, around the flip ratio's line


def config(streams=()):
    """The default's depths and three seeds; `streams` below bf16 on tiny-medium, seed 0, as the default has them."""
    runs = {"shapes": list(SHAPES), "seeds": list(SEEDS), "streams": list(streams)}
    runs.update(stream_shapes=["tiny-medium"], stream_seeds=[0])
    return merge_config(load_config(DEFAULT_CONFIG), {"train": {"runs": runs}})


def val_difference(n_layers, seed):
    return 0.001 * math.log2(n_layers) + JITTER[seed]  # grows by 0.001 nats a doubling


def flip_ratio(n_layers, block, seed):
    return 0.8 - 0.1 * math.log2(n_layers) + RUN_JITTER[block] + 0.001 * seed  # shrinks by 0.1 a doubling


def tables(streams=(), duplicates=False):
    """The four analyses' tables of the default's depths, three seeds, baseline and StreamBack (and `streams`); an
    MXFP8 stream has 1.5 times the fp32 stream's gradient flips, three times its error, and swallows half the
    updates. `duplicates`: each seed's two runs measure alike (the baseline's values), as if one run."""
    cfg = config(streams)
    loss, errors, swallowed, envelope = [], [], [], []
    for name, spec in run_matrix(cfg["train"]).items():
        n_layers = SHAPES[spec.shape]
        if spec.block == "streamback":
            for split, scale in (("val", 1.0), ("train", 0.0)):  # the train split: no trend, a constant
                loss.append(
                    {
                        "shape": spec.shape,
                        "comparison": comparison_name(spec),
                        "seed": str(spec.seed),
                        "split": split,
                        "final_difference": scale * val_difference(n_layers, spec.seed) + (1 - scale) * 0.002,
                    }
                )
        ratio = flip_ratio(n_layers, "baseline" if duplicates else spec.block, spec.seed)
        for layer in range(n_layers + 1):
            for kind in ("activations", "stream_gradients", "gradients"):
                if kind == "gradients" and layer == n_layers:
                    continue
                for variant, flips, error in (
                    ("bf16", 1000, 0.5),
                    ("fp32", 1000 * ratio, 0.5 / (2 * n_layers)),
                    ("mxfp8", 1500 * ratio, 1.5 / (2 * n_layers)),
                ):
                    errors.append(
                        {
                            "run": name,
                            "seed": spec.seed,
                            "variant": variant,
                            "kind": kind,
                            "layer": layer,
                            "max_abs_error": error,
                            "sign_flips": flips if kind == "gradients" else 500,
                        }
                    )
            envelope.append(
                {"run": name, "seed": spec.seed, "layer": layer, "max": 10.0 * n_layers + spec.seed, "min": -3.0}
            )
        for layer in range(n_layers):
            for sublayer in ("attention", "feed_forward"):
                for variant, share in (("bf16", 0.01 * n_layers + 0.001 * spec.seed), ("fp32", 0.0), ("mxfp8", 0.5)):
                    swallowed.append(
                        {
                            "run": name,
                            "seed": spec.seed,
                            "variant": variant,
                            "layer": layer,
                            "sublayer": sublayer,
                            "swallowed_fraction": share,
                        }
                    )
    loss = pd.DataFrame(loss)
    over = []
    for (shape, comparison, split), group in loss.groupby(["shape", "comparison", "split"]):
        d = group.final_difference.to_numpy()
        mean, low, high = (d.mean(), d.mean() - 1, d.mean() + 1)  # the analysis' own intervals are copied, not redone
        over.append(
            {
                "shape": shape,
                "comparison": comparison,
                "seed": layout.ALL_SEEDS,
                "split": split,
                "final_difference": mean,
                "ci_low": low,
                "ci_high": high,
                "boot_low": low,
                "boot_high": high,
                "mde": 0.003,
                "seeds_for_band": 40.0,
                "verdict": "within seed noise: made up",
            }
        )
    return cfg, {
        "loss_difference": pd.concat([loss, pd.DataFrame(over)], ignore_index=True),
        "layer_error": pd.DataFrame(errors),
        "swallowed": pd.DataFrame(swallowed),
        "envelope": pd.DataFrame(envelope),
    }


@pytest.fixture(scope="module")
def built():
    cfg, sources = tables()
    table, trend = depth.depth_tables(cfg, sources)
    return cfg, table, trend.set_index("measure")


def test_a_row_per_depth_with_the_loss_rows_over_the_seeds_as_they_are(built):
    _, table, _ = built
    assert table.depth.tolist() == [2, 4, 8] and set(table.comparison) == {"streamback"}
    assert (table.stream == "fp32").all() and (table.seeds == 3).all() and (table.runs == 6).all()
    for row in table.itertuples():
        mean = np.mean([val_difference(row.depth, s) for s in SEEDS])
        # derived: figures of constructed inputs by hand (fp64 roundings only, within approx's default 1e-6)
        assert row.val_difference == pytest.approx(mean) and row.val_low == pytest.approx(mean - 1)
        assert row.val_mde == 0.003 and row.val_seeds_for_band == 40 and row.val_verdict == "within seed noise"


def test_the_per_run_measures_by_hand(built):
    _, table, _ = built
    for row in table.itertuples():
        # one value a seed, the mean of its two runs (they share weights and batches): 2 degrees of freedom, not 5
        ratios = [np.mean([flip_ratio(row.depth, b, s) for b in RUN_JITTER]) for s in SEEDS]
        mean, low, high = np.mean(ratios), *sps.t.interval(0.95, 2, np.mean(ratios), sps.sem(ratios))
        # derived: figures of constructed inputs by hand (fp64 roundings only, within approx's default 1e-6); here and
        # below
        assert (row.grad_flip_ratio, row.grad_flip_ratio_low, row.grad_flip_ratio_high) == pytest.approx(
            (mean, low, high)
        )
        assert row.stream_grad_flip_ratio == pytest.approx(1.0)  # 500 flips each way
        assert row.last_error_ratio == pytest.approx(1 / (2 * row.depth))
        assert row.swallowed_bf16 == pytest.approx(0.01 * row.depth + 0.001) and row.swallowed_stream == 0
        assert row.stream_max_baseline == pytest.approx(10.0 * row.depth + 1)  # mean over seeds 0, 1, 2
        assert row.stream_max_compared == pytest.approx(10.0 * row.depth + 1)


def test_the_trends_by_hand(built):
    """Slopes a doubling: the loss difference +0.001 (seed noise ±0.0002: resolved), the flip ratio -0.1,
    the bf16 swallowed share +0.01 per layer, so over depths 2, 4, 8 a least-squares +0.02 x 7 / 3 (not
    linear in log2(depth)); the train split's constant and the stream gradients' 1.0 have no trend."""
    _, _, trend = built
    val = trend.loc["val_difference"]
    # derived: figures of constructed inputs by hand (fp64 roundings only, within approx's default 1e-6); here and below
    assert val.slope == pytest.approx(0.001) and val.verdict == "grows with depth" and val.depths == 3
    se = math.sqrt(2 * 0.25 * np.var([-0.0002, 0, 0.0002], ddof=1) / 3)  # w = -1/2, 0, 1/2
    half = sps.t.ppf(0.975, 4) * se  # Welch-Satterthwaite: two equal terms of 2 degrees of freedom each
    assert (val.low, val.high) == pytest.approx((0.001 - half, 0.001 + half)) and val.df == pytest.approx(4)
    assert trend.loc["grad_flip_ratio", "slope"] == pytest.approx(-0.1)
    assert trend.loc["grad_flip_ratio", "verdict"] == "shrinks with depth"
    assert trend.loc["swallowed_bf16", "slope"] == pytest.approx(0.5 * (0.08 - 0.02))
    assert trend.loc["swallowed_bf16", "verdict"] == "grows with depth"
    assert trend.loc["last_error_ratio", "verdict"] == "no trend this tier resolves"  # no spread over runs
    for flat in ("train_difference", "stream_grad_flip_ratio", "swallowed_stream"):
        # derived: a slope fitted to equal values is 0 up to fp64 roundings (a few 2^-53): 1e-12 is wider
        assert trend.loc[flat, "slope"] == pytest.approx(0, abs=1e-12)
        assert trend.loc[flat, "verdict"] == "no trend this tier resolves"


def test_the_stage_writes_its_tables_and_figure_and_a_missing_source_is_named(tmp_path, monkeypatch, capsys):
    from streamback.cli import main

    monkeypatch.chdir(tmp_path)
    cfg, sources = tables()
    layout.TABLES_DIR.mkdir(parents=True)
    with pytest.raises(StreambackError, match="loss_difference.csv does not exist: run rule analyze_loss_difference"):
        depth.read_sources()
    for name, table in sources.items():
        table.to_csv(layout.table(name), index=False)
    import json

    assert main(["depth", "--config-json", json.dumps(cfg)]) == 0
    written = pd.read_csv(layout.table("depth"))
    assert written.depth.tolist() == [2, 4, 8]
    assert layout.figure(layout.DEPTH_FIGURE, "svg").stat().st_size > 0
    assert "val_difference: slope +0.001 a doubling" in capsys.readouterr().out


def test_the_chart_marks_the_paper_s_claims(built):
    _, table, trend = built
    chart = depth.depth_chart(table, trend.reset_index(), 0.001).to_dict()
    rules = [layer for panel in chart["concat"] for layer in panel["layer"] if layer.get("mark", {}).get("strokeDash")]
    claims = sorted(row["claim"] for layer in rules for row in chart["datasets"][layer["data"]["name"]])
    assert claims == [-0.001, -0.001, 0.001, 0.001, 0.5, 0.5]  # two loss panels, two flip-ratio panels


def test_the_page_section_reads_the_two_tables_and_names_the_rule_without_them(tmp_path, monkeypatch):
    from streamback.html_report import Missing
    from streamback.report import page

    monkeypatch.chdir(tmp_path)
    cfg, sources = tables()
    study = page.Study(config=cfg, config_files=[])
    (missing,) = page.depth_section(study)
    assert isinstance(missing, Missing) and "rule depth" in missing and "depth.csv" in missing
    table, trend = depth.depth_tables(cfg, sources)
    layout.TABLES_DIR.mkdir(parents=True)
    table.to_csv(layout.table("depth"), index=False)
    trend.to_csv(layout.table("depth_trend"), index=False)
    text, chart, *rest = page.depth_section(study)
    assert text.startswith("Over depths of 2, 4, 8 layers (3 training seeds each)")
    assert "final validation loss, baseline minus compared (nats): +0.001 a doubling" in text
    assert "parameter-gradient sign flips, stream / bf16: -0.1 a doubling" in text and "shrinks" in text
    assert chart.to_dict()["title"]["text"] == "Does it matter more with depth?"
    assert [df.shape[0] for df in rest if isinstance(df, pd.DataFrame)] == [3, 9]
    assert "Does it matter more with depth?" in [name for name, _ in page.sections(study)]


def test_a_stream_below_bf16_on_one_depth_has_its_row_and_no_trend(tmp_path, monkeypatch):
    """As the default trains them: MXFP8 on tiny-medium with seed 0 alone. Its row compares its runs' own
    stream with bf16 over the comparison's two runs; one depth gives no slope; the StreamBack rows and the
    page's sentence are as without it."""
    from streamback.report import page

    cfg, sources = tables(streams=["mxfp8"])
    table, trend = depth.depth_tables(cfg, sources)
    row = table[table.comparison == "streamback-mxfp8"].iloc[0]
    assert (row.depth, row.stream, row.seeds, row.runs) == (4, "mxfp8", 1, 2)
    ratios = [1.5 * flip_ratio(4, block, 0) for block in RUN_JITTER]
    # derived: figures of constructed inputs by hand (fp64 roundings only, within approx's default 1e-6)
    assert row.grad_flip_ratio == pytest.approx(np.mean(ratios)) and row.last_error_ratio == pytest.approx(3 / 8)
    assert row.swallowed_stream == 0.5 and row.val_difference == pytest.approx(val_difference(4, 0))
    assert not math.isnan(row.val_low)  # the analysis' own interval, copied
    mine = trend[trend.comparison == "streamback-mxfp8"]
    assert len(mine) == len(depth.MEASURES) and mine.slope.isna().all()
    assert (mine.verdict == "no trend this tier resolves").all()
    main = table[table.comparison == "streamback"]
    assert main.depth.tolist() == [2, 4, 8] and (main.seeds == 3).all()
    monkeypatch.chdir(tmp_path)
    layout.TABLES_DIR.mkdir(parents=True)
    table.to_csv(layout.table("depth"), index=False)
    trend.to_csv(layout.table("depth_trend"), index=False)
    text, *_ = page.depth_section(page.Study(config=cfg, config_files=[]))
    assert text.startswith("Over depths of 2, 4, 8 layers (3 training seeds each)")


def test_a_seed_s_two_runs_count_once_in_every_interval():
    """Each seed's baseline and StreamBack runs give identical values (duplicates): every interval of
    depth.csv and depth_trend.csv is the interval of one run a seed, the seeds' values by hand (scipy's
    t with 2 degrees of freedom), not one that counts each seed twice."""
    cfg, sources = tables(duplicates=True)
    table, trend = depth.depth_tables(cfg, sources)
    trend = trend.set_index("measure")
    one_run = {d: [flip_ratio(d, "baseline", s) for s in SEEDS] for d in SHAPES.values()}
    for row in table.itertuples():
        values = one_run[row.depth]
        low, high = sps.t.interval(0.95, len(values) - 1, np.mean(values), sps.sem(values))
        assert (row.grad_flip_ratio_low, row.grad_flip_ratio_high) == pytest.approx((low, high))
    want = stats.depth_trend(list(one_run), list(one_run.values()))
    got = trend.loc["grad_flip_ratio"]
    assert (got.slope, got.low, got.high, got.df) == pytest.approx(
        (want["slope"], want["low"], want["high"], want["df"])
    )
    assert (got.boot_low, got.boot_high) == pytest.approx((want["boot_low"], want["boot_high"]))
    assert got["4_vs_2"] == pytest.approx(want["contrasts"][0]["estimate"])
    assert (got["8_vs_4_low"], got["8_vs_4_high"]) == pytest.approx(
        (want["contrasts"][1]["low"], want["contrasts"][1]["high"])
    )


def test_every_trend_names_its_family_and_its_holm_p(built):
    _, _, trend = built
    assert (trend.family == "depth trends of streamback").all()
    tested = trend.p.notna()
    assert trend.p_holm[tested].tolist() == pytest.approx(stats.holm(trend.p[tested].tolist()))
    assert list(trend.columns[-7:]) == [
        "4_vs_2",
        "4_vs_2_low",
        "4_vs_2_high",
        "8_vs_4",
        "8_vs_4_low",
        "8_vs_4_high",
        "verdict",
    ]
