"""The analyses (streamback/analysis/): numbers checked against hand-computed values and direct
computations, on tiny models; the fp64 ground truth; the command on a small run matrix."""

import json
import math

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from streamback import layout
from streamback.analysis.envelope import abs_quantile, envelope, training_envelope
from streamback.analysis.loss import accumulation_rows, loss_curves, trailing_mean
from streamback.analysis.precision import error_stats, layer_error, swallowed
from streamback.errors import StreambackError
from streamback.model.formats import STREAM_LABELS, StreamFormat
from streamback.model.model import ModelArgs, Transformer
from streamback.model.swallow import swallow_stats
from streamback.model.weights import load_model, read_model, save_model
from streamback.runs import RunSpec
from streamback.stats import paired_difference
from streamback.train.metrics import read_metrics

from conftest import ROOT
from helpers.analysis import analyze, matrix, write_metrics  # noqa: F401  (matrix: a fixture)

pytestmark = pytest.mark.usefixtures("one_thread")


def tiny_model(path, block="baseline", stream="fp32", seed=0, vocab=300, **kw):
    """A random tiny model written as a model file; returns what read_model gives back."""
    dims = dict(dim=64, n_layers=3, n_heads=4, n_kv_heads=1, multiple_of=32, max_seq_len=64) | kw
    args = ModelArgs(**dims, vocab_size=vocab, block=block, stream=stream)
    model = Transformer(args)
    model.init_weights(seed)
    save_model(path, args, model.state_dict())
    return read_model(path)


def random_tokens(batch=4, seq=33, vocab=300, seed=1):
    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(seed))


# -- layer error ------------------------------------------------------------------------------


def test_sign_flips_and_errors_on_a_hand_built_case():
    x = torch.tensor([1.0, -2.0, 0.0, 3.0, -0.0, 5.0])
    truth = torch.tensor([1.0, 2.0, -1.0, -3.0, 4.0, 5.0])
    stats = error_stats(x, truth)
    # opposite signs at entries 1 and 3; a zero on either side (entries 2 and 4) is not a flip
    assert stats["sign_flips"] == 2 and stats["sign_flip_fraction"] == 2 / 6
    assert stats["max_abs_error"] == 6.0  # |3 - (-3)|
    # derived: two fp64 square roots and a quotient of exact integer sums: a few 2^-53; 1e-15 is 4 ulps
    assert stats["rel_error"] == pytest.approx(
        math.sqrt(16 + 1 + 36 + 16) / math.sqrt(1 + 4 + 1 + 9 + 16 + 25), rel=1e-15
    )


def test_fp32_stream_is_closer_to_the_truth_than_bf16_and_full_precision_against_itself_is_zero(tmp_path):
    trained = tiny_model(tmp_path / "model.pt")
    batch = random_tokens()
    table = layer_error(trained, batch, "fp64", ["bf16", "fp32"])
    assert set(table.kind) == {"activations", "stream_gradients", "gradients"}
    assert len(table) == 2 * (4 + 4 + 3)  # boundaries 0..3 twice, blocks 0..2
    last = table[(table.kind == "activations") & (table.layer == 3)].set_index("variant")
    # both start from the bf16 embedding (h_0's error, up to 2^-9 x |h_0|); only the bf16 stream adds its roundings
    assert last.loc["fp32", "max_abs_error"] < last.loc["bf16", "max_abs_error"] / 2
    assert last.loc["fp32", "rel_error"] < last.loc["bf16", "rel_error"] / 2
    assert (table.max_abs_error > 0).all()  # bf16 compute is not the truth

    same = layer_error(trained, batch, "fp32", ["fp32"], compute_dtype=torch.float32)
    assert (same.max_abs_error == 0).all() and (same.rel_error == 0).all() and (same.sign_flips == 0).all()


def test_fp64_model_is_fp64_throughout_and_matches_fp32_to_fp32_precision(tmp_path):
    """The ground truth's path: fp64 compute and stream (and parameters), against the fp32 model."""
    from streamback.analysis.precision import reference_model

    trained = tiny_model(tmp_path / "model.pt", block="streamback")
    model = reference_model(trained, "fp64", "cpu")
    assert model.stream_format == StreamFormat("fp64") and all(p.dtype == torch.float64 for p in model.parameters())
    batch = random_tokens()
    with model.capture(("residual", "attention"), grad=True) as cap:
        logits = model(batch)
        logits.logsumexp(-1).mean().backward()
    assert logits.dtype == torch.float64
    assert {h.dtype for h in cap["residual"] + cap["attention"]} == {torch.float64}
    assert (
        cap["residual"][0].grad.dtype == torch.float64
        and model.layers[0].attention.wq.weight.grad.dtype == torch.float64
    )
    with torch.no_grad():
        fp32 = load_model(trained, compute_dtype=torch.float32)(batch)
    error = (fp32.double() - logits.detach()).abs().max().item()
    assert 0 < error < 1e-4
    with pytest.raises(StreambackError, match="'fp64' has no stochastic"):
        StreamFormat.parse("fp64_sr")


def straightforward_layer_error(trained, batch, reference, variants, seed, compute_dtype):
    """The layer error as first written: a model built per variant, each kind's tensors concatenated, compared whole."""
    from streamback.analysis.precision import reference_model
    from streamback.train.validation import next_token_loss

    def passes(model):
        with model.capture(("residual",), grad=True) as cap:
            next_token_loss(model(batch[:, :-1]), batch[:, 1:]).backward()
        return {
            "activations": [h.detach() for h in cap["residual"]],
            "stream_gradients": [h.grad for h in cap["residual"]],
            "gradients": [torch.cat([p.grad.flatten() for p in layer.parameters()]) for layer in model.layers],
        }

    def stats(x, truth):
        x, truth = x.double(), truth.double()
        flips = int((((x > 0) & (truth < 0)) | ((x < 0) & (truth > 0))).sum())
        return {
            "max_abs_error": float((x - truth).abs().max()),
            "rel_error": float((x - truth).norm() / truth.norm()),
            "sign_flips": flips,
            "sign_flip_fraction": flips / x.numel(),
        }

    truth, rows = passes(reference_model(trained, reference, "cpu")), []
    for variant in variants:
        torch.manual_seed(seed)
        seen = passes(load_model(trained, compute_dtype=compute_dtype, stream=variant))
        rows += [
            {"variant": variant, "kind": kind, "layer": layer, **stats(x, ref)}
            for kind in seen
            for layer, (x, ref) in enumerate(zip(seen[kind], truth[kind]))
        ]
    return pd.DataFrame(rows)


def test_the_chunked_layer_error_of_each_window_is_the_straightforward_one(tmp_path, monkeypatch):
    """One truth and one variant model for all windows, the stream switched per variant, the embedding and head
    frozen, the statistics a chunk at a time (smaller than a block's gradients here) over per-parameter parts:
    the figures of the direct way."""
    from streamback.analysis import precision

    monkeypatch.setattr(precision, "CHUNK", 1000)
    trained = tiny_model(tmp_path / "model.pt", block="streamback", tied_embeddings=True)  # as most public models
    windows = random_tokens(batch=3, seq=17, seed=4)
    variants = ["bf16", "fp32", "bf16_sr", "mxfp8"]
    ours = precision.layer_errors(trained, windows.split(1), "fp64", variants, seed=5, compute_dtype=torch.bfloat16)
    theirs = pd.concat(
        [
            straightforward_layer_error(trained, windows[w : w + 1], "fp64", variants, 5, torch.bfloat16).assign(
                window=w
            )
            for w in range(3)
        ],
        ignore_index=True,
    )
    assert list(ours.columns) == list(theirs.columns) and len(ours) == 3 * 4 * (4 + 4 + 3)
    exact = ["variant", "kind", "layer", "window", "max_abs_error", "sign_flips", "sign_flip_fraction"]
    pd.testing.assert_frame_equal(ours[exact], theirs[exact])
    # derived (probabilistic): chunked and whole fp64 sums of n <= 5e4 squares differ by ~sqrt(n) 2^-53 = 2.5e-14
    # (a worst case, n 2^-53 = 5.5e-12, would not hold): 1e-12 is 40x that
    assert np.allclose(ours.rel_error, theirs.rel_error, rtol=1e-12, atol=0) and (ours.sign_flips > 0).any()


def test_the_swallowed_table_taken_as_each_add_happens_is_the_one_of_the_captured_stream(tmp_path):
    trained, batch = tiny_model(tmp_path / "model.pt"), random_tokens()
    rows = []
    for variant in ["bf16", "fp32", "nvfp4_sr"]:
        torch.manual_seed(2)
        model = load_model(trained, stream=variant)
        with torch.no_grad(), model.capture() as cap:
            model(batch[:, :-1])
        for layer in range(3):
            rows += [
                {
                    "variant": variant,
                    "layer": layer,
                    "sublayer": "attention",
                    **swallow_stats(cap["residual"][layer], cap["attention"][layer], cap["mid"][layer]),
                },
                {
                    "variant": variant,
                    "layer": layer,
                    "sublayer": "feed_forward",
                    **swallow_stats(cap["mid"][layer], cap["feed_forward"][layer], cap["residual"][layer + 1]),
                },
            ]
    pd.testing.assert_frame_equal(swallowed(trained, batch, ["bf16", "fp32", "nvfp4_sr"], seed=2), pd.DataFrame(rows))


# -- envelope -----------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 999, 1000, 1001, 12345])
def test_abs_quantile_is_numpy_s(n):
    x = torch.randn(n, generator=torch.Generator().manual_seed(n))
    # derived: numpy's linear interpolation between the same two order statistics, in fp64: a few 2^-53
    assert abs_quantile(x) == pytest.approx(float(np.quantile(x.abs().double().numpy(), 0.999)), rel=1e-12, abs=0)


def test_envelope_equals_a_direct_computation(tmp_path):
    trained = tiny_model(tmp_path / "model.pt")  # the baseline: a bf16 stream
    batch = random_tokens()
    table = envelope(trained, batch)
    model = load_model(trained)
    with torch.no_grad():  # the stream computed directly, layer by layer
        h = model.embed(batch[:, :-1])
        seen = [h]
        for layer in model.layers:
            h = layer(h, model.rope_cos[:32], model.rope_sin[:32])
            seen.append(h)
    assert list(table.layer) == list(range(4)) and seen[-1].dtype == torch.bfloat16
    for row, h in zip(table.itertuples(), seen):
        values = h.double().numpy()
        assert row.max == values.max() and row.min == values.min()
        # derived: the same interpolation of the same order statistics in fp64, as above
        assert row.abs_p999 == pytest.approx(np.quantile(np.abs(values), 0.999), rel=1e-12)


def test_training_envelope_reads_the_logged_maxima_and_minima(tmp_path):
    path = tmp_path / "metrics.jsonl"
    records = [
        {"step": 1, "tokens": 10, "loss": 5.0},
        {
            "step": 2,
            "tokens": 20,
            "loss": 4.0,
            "stream_absmax": [3.0, 4.0],
            "stream_max": [3.0, 2.0],
            "stream_min": [-1.0, -4.0],
        },
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    table = training_envelope(read_metrics(path), "x")
    assert table.to_dict("list") == {
        "step": [2, 2],
        "tokens": [20, 20],
        "layer": [0, 1],
        "absmax": [3.0, 4.0],
        "max": [3.0, 2.0],
        "min": [-1.0, -4.0],
    }
    with pytest.raises(StreambackError, match="run x: its metrics.jsonl has no stream_max"):
        training_envelope(records[:1], "x")


# -- swallowed updates --------------------------------------------------------------------------


def test_the_note_s_swallowed_update():
    """At 600 the bf16 grid has steps of 4: an update of 1.9 is lost, 2.0 (a tie, to even) too,
    2.1 moves the stream by a whole step of 4; an fp32 stream keeps all three."""
    bf16, fp32 = StreamFormat.parse("bf16"), StreamFormat.parse("fp32")
    for update, swallowed_, out in ((1.9, 1.0, 600.0), (2.0, 1.0, 600.0), (2.1, 0.0, 604.0)):
        d = torch.tensor([update]).bfloat16()
        h = torch.tensor([600.0]).bfloat16()
        result = bf16.add(h, d)
        assert result.item() == out
        stats = swallow_stats(h, d, result)
        exact = 600.0 + d.double().item()
        assert stats == {"swallowed_fraction": swallowed_, "lost_mass_fraction": abs(out - exact) / d.double().item()}
        kept = swallow_stats(h.float(), d, fp32.add(h.float(), d))
        assert kept == {"swallowed_fraction": 0.0, "lost_mass_fraction": 0.0}
    assert bf16.add(torch.tensor([600.0]).bfloat16(), torch.tensor([2.1]).bfloat16()).item() - 600 == 4.0
    # several coordinates at once; a zero update is not counted among the updates
    h = torch.tensor([600.0, 600.0, 600.0]).bfloat16()
    d = torch.tensor([1.9, 2.1, 0.0]).bfloat16()
    stats = swallow_stats(h, d, bf16.add(h, d))
    lost = (600 - (600 + d[0].double())).abs() + (604 - (600 + d[1].double())).abs()
    # derived: exact bf16 values summed in fp64 (exact) and one division: 1 ulp; 1e-15 is 4
    assert stats["swallowed_fraction"] == 0.5 and stats["lost_mass_fraction"] == pytest.approx(
        float(lost / d.double().sum()), rel=1e-15
    )


def test_a_bf16_stream_swallows_far_more_than_an_fp32_stream(tmp_path):
    trained = tiny_model(tmp_path / "model.pt")
    table = swallowed(trained, random_tokens(), ["bf16", "fp32", "nvfp4_sr"])
    assert len(table) == 3 * 3 * 2 and list(table.columns) == [
        "variant",
        "layer",
        "sublayer",
        "swallowed_fraction",
        "lost_mass_fraction",
    ]
    mean = table.groupby("variant")[["swallowed_fraction", "lost_mass_fraction"]].mean()
    assert mean.loc["bf16", "swallowed_fraction"] > 0.01 and mean.loc["fp32", "swallowed_fraction"] < 1e-4
    assert (
        mean.loc["fp32", "lost_mass_fraction"]
        < 1e-6
        < mean.loc["bf16", "lost_mass_fraction"]
        < mean.loc["nvfp4_sr", "lost_mass_fraction"]
    )


# -- loss difference ----------------------------------------------------------------------------


def test_loss_difference_on_two_hand_written_metrics_files(tmp_path):
    write_metrics(tmp_path / "a.jsonl", [5.0, 4.0, 3.5, 3.0, 2.75], {2: 4.5, 4: 3.25, 5: 3.0})
    write_metrics(tmp_path / "b.jsonl", [5.0, 3.9, 3.6, 2.8, 2.5], {2: 4.25, 5: 3.5})
    curves = loss_curves(
        read_metrics(tmp_path / "a.jsonl"), read_metrics(tmp_path / "b.jsonl"), smooth_steps=2, points=100
    )
    train, val = curves[curves.split == "train"], curves[curves.split == "val"]
    assert train.step.tolist() == [1, 2, 3, 4, 5] and train.tokens.tolist() == [100, 200, 300, 400, 500]
    # derived: differences of decimal losses in fp64 (each within 2^-53 x 5): 1e-12 is far wider
    assert train.difference.tolist() == pytest.approx([0.0, 0.1, -0.1, 0.2, 0.25], abs=1e-12)  # baseline minus other
    assert train.smoothed.tolist() == pytest.approx([0.0, 0.05, 0.0, 0.05, 0.225], abs=1e-12)  # steps (s - 2, s]
    assert val.step.tolist() == [2, 5] and val.difference.tolist() == [0.25, -0.5]  # only steps both logged
    assert val.smoothed.tolist() == [0.25, -0.5]  # step 2 is outside step 5's window
    thinned = loss_curves(
        read_metrics(tmp_path / "a.jsonl"), read_metrics(tmp_path / "b.jsonl"), smooth_steps=2, points=2
    )
    assert thinned[thinned.split == "train"].step.tolist() == [1, 4, 5]  # every third step, the last kept
    # derived: the same formula by hand on the same floats (fp64 roundings only, within approx's default 1e-6)
    assert thinned[thinned.split == "train"].smoothed.tolist()[-1] == pytest.approx(0.225)  # smoothed before thinning


def test_paired_interval_against_hand_values_and_scipy_free_reference():
    mean, low, high = paired_difference(np.array([2.0, 4.0, 6.0, 8.0]), np.array([1.0, 2.0, 3.0, 4.0]), 0.95)
    # d = 1, 2, 3, 4: mean 2.5, sd sqrt(5/3), t(0.975, 3) = 3.182446305284263 (the t table)
    half = 3.182446305284263 * math.sqrt(5 / 3) / 2
    # derived: the t quantile to 16 digits from the table and fp64 arithmetic: a few 2^-53
    assert (mean, low, high) == pytest.approx((2.5, 2.5 - half, 2.5 + half), rel=1e-12)
    with pytest.raises(StreambackError, match="at least 2"):
        paired_difference(np.array([1.0]), np.array([0.0]), 0.95)
    assert trailing_mean(np.array([1, 2, 10]), np.array([1.0, 3.0, 5.0]), 5).tolist() == [1.0, 2.0, 5.0]


def test_schema_variants_are_every_stream_label():
    schema = yaml.safe_load((ROOT / "config" / "schema" / "config.schema.yaml").read_text())
    variants = schema["$defs"]["analysis"]["properties"]["variants"]
    assert sorted(variants["items"]["enum"]) == sorted(STREAM_LABELS) == sorted(variants["default"])


# -- the command on a small matrix of (untrained) runs --------------------------------------------


@pytest.mark.slow
def test_a_partial_set_of_runs_gives_a_partial_table_and_missing_runs_are_named(matrix, monkeypatch, capsys):
    root, config = matrix
    status, out, err = analyze(
        monkeypatch,
        capsys,
        root,
        config,
        "envelope",
        "--runs",
        "b-tall-streamback",
        "--model",
        f"extra={root / layout.model_file('a-short-baseline')}",
    )
    assert status == 0, err[-3000:]
    assert "extra has no training metrics" in out
    table = pd.read_csv(root / layout.table("envelope"))
    assert table.run.tolist() == ["b-tall-streamback"] * 5 + ["extra"] * 3
    assert table.seed.isna().tolist() == [False] * 5 + [True] * 3  # an imported model has no training seed
    status, _, err = analyze(monkeypatch, capsys, root, config, "loss-difference", "--runs", "b-tall-streamback")
    assert status == 2 and "b-tall-streamback is compared with b-tall-baseline, but b-tall-baseline is not among" in err
    status, _, err = analyze(monkeypatch, capsys, root, config, "swallowed", "--runs", "c-wide-baseline")
    assert status == 2 and "run 'c-wide-baseline' is not in the train.runs matrix" in err
    (root / layout.model_file("a-short-streamback")).rename(root / "moved.pt")
    try:
        status, _, err = analyze(monkeypatch, capsys, root, config, "layer-error")
        assert status == 2 and "run a-short-streamback has not been trained" in err
    finally:
        (root / "moved.pt").rename(root / layout.model_file("a-short-streamback"))


def test_loss_accumulation_on_hand_written_metrics():
    """Per seed, the slope of the smoothed train-loss difference over the second half of 40 steps; over
    the seeds, its mean and t interval, computed by hand from the constructed slopes."""
    steps = np.arange(1, 41)
    slopes = {0: 0.001, 1: 0.002, 2: 0.0015}
    records = {}
    for seed, slope in slopes.items():
        base = 4.0 - 0.05 * steps
        # the other run's loss: the baseline's less a lead that grows by `slope` a step (and wiggles +-0.01
        # step to step, which the 2-step trailing mean cancels)
        other = base - (0.02 + slope * steps + 0.01 * (-1.0) ** steps)
        records[f"s-baseline-seed{seed}"] = [{"step": int(s), "loss": float(v)} for s, v in zip(steps, base)]
        records[f"s-streamback-seed{seed}"] = [{"step": int(s), "loss": float(v)} for s, v in zip(steps, other)]
    matrix = {
        f"s-{block}-seed{k}": RunSpec(f"s-{block}-seed{k}", "s", block, "fp32", k, k, k, f"s-{block}")
        for k in slopes
        for block in ("baseline", "streamback")
    }
    pairs = [("s", f"s-baseline-seed{k}", f"s-streamback-seed{k}") for k in slopes]
    table = accumulation_rows(pairs, matrix, records, window=2, confidence=0.95).set_index("seed")
    # exact up to the fp64 rounding of losses near 4: far below 1e-9 a step
    assert [table.loc[k, "slope"] for k in slopes] == pytest.approx(list(slopes.values()), abs=1e-9)
    over = table.loc[layout.ALL_SEEDS]
    half = 4.302652729911275 * 0.0005 / math.sqrt(3)  # t(0.975, 2) x sd 0.0005 / sqrt(3), by hand
    assert (over.slope, over.low, over.high) == pytest.approx((0.0015, 0.0015 - half, 0.0015 + half), abs=1e-9)
    assert over.seeds == 3 and over.half_steps == 20 and over.change == pytest.approx(0.03, abs=1e-7)
    assert over.verdict == "grows" and over.p == 0.25
    # too short for a second half: a row that says so, not an error
    short = {name: rs[:2] for name, rs in records.items()}
    row = accumulation_rows(pairs, matrix, short, window=2, confidence=0.95).iloc[-1]
    assert row.verdict == "no trend resolved" and math.isnan(row.slope)
