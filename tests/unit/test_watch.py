"""Watching a long run: the live precision signals (the analyses' swallow definitions on the
training step's own forward pass, the format's grid step at the stream's max), the early warnings
on constructed metric streams that should and should not fire and on real micro runs made to drift
(a bf16 stream pushed large by scaling the embedding fires; the same run with an fp32 stream does
not), TensorBoard's event files read back with tensorboard's own reader (every step once across a
resume, off with one key), and the study page's section."""

import json
import math
import shutil

import numpy as np
import pandas as pd
import pytest
import torch

from streamback import layout
from streamback.config import validate_config
from streamback.model.formats import StreamFormat, quantize_mx, quantize_nvfp4
from streamback.model.model import ModelArgs, Transformer
from streamback.model.swallow import swallow_counts, swallow_fractions, swallow_stats
from streamback.model.weights import read_model
from streamback.train import checkpoint as ckpt
from streamback.train import trainer as train_module
from streamback.train.metrics import read_metrics
from streamback.train.signals import SHADOW_KEYS, SIGNAL_KEYS
from streamback.train.watch import Watch, layer_ranges, steady_rise

from helpers.train import MODEL, TRAIN, deterministic

WARNINGS = validate_config({})["train"]["log"]["warnings"]  # the schema's defaults


def micro_config(**train_overrides) -> dict:
    return validate_config({"model": MODEL, "train": {**TRAIN, **train_overrides}})


def train_micro(data_dir, root, run, tensorboard=True, embedding_scale=None, monkeypatch=None, **overrides):
    """Train a micro run in this process (an optional factor on the initial embedding); its metrics records."""
    if embedding_scale is not None:
        build = train_module.Trainer._build_model

        def scaled(self):
            model = build(self)
            with torch.no_grad():
                model.tok_embeddings.weight.mul_(embedding_scale)
            return model

        monkeypatch.setattr(train_module.Trainer, "_build_model", scaled)
    cfg = micro_config(**overrides)
    torch.set_num_threads(1)
    status = train_module.train(
        cfg["train"],
        cfg["model"],
        run,
        data_dir,
        root / "out",
        root / "ckpt",
        tensorboard=root / "tb" if tensorboard else None,
    )
    assert status == 0
    return read_metrics(root / "out" / layout.METRICS_FILE)


def event_scalars(root, tag):
    """(step, value) of every event of `tag` TensorBoard shows for the one recipe under root / "tb"."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (recipe,) = (root / "tb").iterdir()
    board = EventAccumulator(str(recipe), size_guidance={"scalars": 0, "tensors": 0})
    board.Reload()
    return board, [(e.step, e.value) for e in board.Scalars(tag)]


# ---- the signals' definitions --------------------------------------------------------------


def test_swallow_counts_add_up_over_adds():
    """Counts of two adds summed give the shares of the two together (what the trainer pools over layers, micro-batches,
    ranks)."""
    bf16 = StreamFormat.parse("bf16")
    h = torch.tensor([600.0, 600.0, 1.0, 8.0]).bfloat16()
    d = torch.tensor([1.9, 2.1, 0.001, 0.0]).bfloat16()
    h2, d2 = torch.tensor([600.0, 3.0]).bfloat16(), torch.tensor([1.0, 0.5]).bfloat16()
    pooled = swallow_fractions(swallow_counts(h, d, bf16.add(h, d)) + swallow_counts(h2, d2, bf16.add(h2, d2)))
    together = swallow_stats(torch.cat([h, h2]), torch.cat([d, d2]), bf16.add(torch.cat([h, h2]), torch.cat([d, d2])))
    # derived: the same fractions of integer counts, pooled or at once: one fp64 division each (1 ulp, 2.2e-16)
    assert pooled == pytest.approx(together, rel=1e-15)
    assert together["swallowed_fraction"] == 3 / 5  # 600 + 1.9, 1 + 0.001, 600 + 1.0; the zero update is not one


def test_the_capture_s_add_fn_sees_every_add_and_changes_nothing():
    """swallow_counts through `add_fn` on a training forward equal the analysis's on the captured
    tensors, one entry per sublayer add, and the loss and gradients are bit-identical to an uncaptured step."""
    torch.manual_seed(0)
    model = Transformer(
        ModelArgs(dim=32, n_layers=2, n_heads=2, n_kv_heads=1, vocab_size=50, multiple_of=16, max_seq_len=16)
    )
    tokens = torch.randint(0, 50, (2, 9))
    loss = model(tokens[:, :-1], targets=tokens[:, 1:])
    loss.backward()
    plain = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    with model.capture(("residual",), add_fn=swallow_counts) as live:
        captured_loss = model(tokens[:, :-1], targets=tokens[:, 1:])
        captured_loss.backward()
    assert torch.equal(captured_loss, loss) and all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), plain))
    with torch.no_grad(), model.capture() as cap:
        model(tokens[:, :-1])
    res, mid = cap["residual"], cap["mid"]
    expected = [
        swallow_counts(*adds)
        for layer in range(2)
        for adds in (
            (res[layer], cap["attention"][layer], mid[layer]),
            (mid[layer], cap["feed_forward"][layer], res[layer + 1]),
        )
    ]
    assert len(live["adds"]) == 4 and all(torch.equal(a, b) for a, b in zip(live["adds"], expected))
    assert all(c[1] > 0 for c in live["adds"])  # a bf16 stream swallows some updates even at init


def test_spacing_is_the_grid_step_at_the_stream_s_max():
    values = [0.0, 1e-6, 0.3, 1.0, 600.0, 1024.0, 3.0e4]
    for name, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16), ("fp32", torch.float32)):
        x = torch.tensor(values, dtype=dtype)
        gap = torch.nextafter(x, torch.tensor(math.inf, dtype=dtype)).double() - x.double()
        assert StreamFormat.parse(name).spacing(-x).tolist() == gap.tolist(), name
    assert StreamFormat.parse("bf16").spacing(torch.tensor(600.0)).item() == 4.0  # the drift note's step at 600
    assert StreamFormat.parse("fp8_e4m3").spacing(torch.tensor([300.0, 1.0, 2.0**-9])).tolist() == [
        32.0,
        0.125,
        2.0**-9,
    ]
    block = torch.zeros(32)
    block[:2] = torch.tensor([300.0, 5.0])
    assert quantize_mx(block)[0] == 288.0 and StreamFormat.parse("mxfp8").spacing(torch.tensor(288.0)).item() == 32.0
    for top, held in ((303.0, 288.0), (305.0, 320.0)):  # steps of 32 at the block's max: 288 + 15 stays, 288 + 17 moves
        block[0] = top
        assert quantize_mx(block)[0] == held
    block = torch.zeros(16)
    block[:2] = torch.tensor([5.0, 3.4])
    top, below = quantize_nvfp4(block)[:2]  # element 6 of the block's scale, and the next value down, element 4
    # derived: grid values by hand, binary fractions times an fp32 scale (a few fp32 roundings within approx's 1e-6)
    assert below == pytest.approx(float(top) * 4 / 6) and StreamFormat.parse("nvfp4").spacing(
        top
    ).item() == pytest.approx(float(top - below))


# ---- warnings on constructed metric streams -------------------------------------------------


def watched(records, warmup=0, **thresholds):
    """The events a Watch with the default thresholds (but `thresholds`) gives for `records`."""
    watch = Watch({**WARNINGS, **thresholds}, warmup, "bf16")
    return [event for record in records for event in watch.observe(record)]


def stream_record(
    step, swallowed, spacing=(0.01, 0.01, 0.01), update=(0.1, 0.1), absmax=(4.0, 300.0, 300.0), loss=3.0, grad_norm=1.0
):
    return {
        "step": step,
        "loss": loss,
        "grad_norm": grad_norm,
        "swallowed_fraction": list(swallowed),
        "lost_mass_fraction": [0.0, 0.0],
        "update_mean_abs": list(update),
        "stream_spacing": list(spacing),
        "stream_absmax": list(absmax),
    }


def test_the_swallowed_warning_fires_when_a_layer_passes_the_threshold():
    shares = {10: (0.1, 0.6), 20: (0.1, 0.7), 30: (0.1, 0.2), 40: (0.55, 0.9)}
    events = watched([stream_record(s, v) for s, v in shares.items()])
    assert [(e["warning"], e["step"], e["layer"], e["value"]) for e in events] == [
        ("swallowed", 10, 1, 0.6),
        ("swallowed", 40, 0, 0.55),
        ("swallowed", 40, 1, 0.9),
    ]  # once per crossing, per layer
    assert (
        events[0]["threshold"] == 0.5 and "step 10, layer 1" in events[0]["message"] and "60.0%" in events[0]["message"]
    )
    assert watched([stream_record(s, (0.4, 0.49)) for s in (10, 20, 30)]) == []
    assert watched([stream_record(10, (0.9, 0.9))], swallowed_fraction=None) == []  # null: off


def test_the_spacing_warning_compares_the_step_at_the_max_with_the_typical_update():
    big = stream_record(10, (0.0, 0.0), spacing=(0.03, 2.0, 0.01), update=(0.5, 0.5))
    (event,) = watched([big])
    assert (event["warning"], event["layer"], event["value"]) == ("spacing", 0, 4.0)  # boundary 1 is layer 0's output
    assert "grid step is 2" in event["message"] and "300" in event["message"]
    assert watched([stream_record(10, (0.0, 0.0), spacing=(0.03, 0.25, 0.25), update=(0.5, 0.5))]) == []
    assert watched([big], spacing_share=8.0) == []


def test_the_spacing_warning_names_a_step_s_layers_once_as_ranges():
    """Layers 0-2 and 4 of a deep stream pass the threshold at one step: one event naming them as
    ranges; at the next step the same layers still hold (quiet) and layer 3 begins to (one event)."""
    layers = 6
    first = stream_record(
        10,
        (0.0,) * layers,
        spacing=(0.01, 2.0, 2.0, 2.0, 0.01, 3.0, 0.01),
        update=(0.5,) * layers,
        absmax=(4.0, 300.0, 300.0, 300.0, 300.0, 500.0, 500.0),
    )
    second = {**first, "step": 20, "stream_spacing": [0.01, 2.0, 2.0, 2.0, 2.0, 3.0, 0.01]}
    events = watched([first, second])
    assert [(e["step"], e["layer"], e["value"]) for e in events] == [(10, "0-2, 4", 6.0), (20, 3, 4.0)]
    assert events[0]["message"].startswith("warning (step 10, layers 0-2, 4): at the stream's max |h| 300 to 500 ")
    assert "grid step is 2 to 3, up to 6 x" in events[0]["message"]
    assert layer_ranges([7, 0, 1, 2, 5, 8]) == "0-2, 5, 7-8"


@pytest.mark.parametrize("label", ["bf16", "bf16_sr", "fp16"])
def test_the_shadow_bound_holds_against_simulated_rounded_sums_at_20_40_and_80_layers(label):
    """The stream as a sum, boundary by boundary: an embedding entered into the format, then two
    updates a layer (bf16 values, as the sublayers compute, with a drift that grows the max from
    about 4 to about 100 at 80 layers), summed in the format and in fp64 from the same updates. At
    every boundary the largest |error| of any element, and so the gap of max |h|, stays within
    `shadow_gap_bound`; the bound is not vacuous: it is within 100x of the worst error seen. A
    stream rounded to fp8 E4M3 under the same name passes the bound at some boundary."""
    from streamback.model.rounding import FP8_E4M3, round_to
    from streamback.train.signals import shadow_gap_bound

    fmt = StreamFormat.parse(label)
    gen = torch.Generator().manual_seed(0)

    def absmax(x):  # per trial
        return x.double().abs().amax(1)

    for depth in (20, 40, 80):
        x = torch.randn(4, 2048, generator=gen, dtype=torch.float64) * 2  # 4 trials
        h, s, c = fmt.enter(x.float()), x.clone(), round_to(x.float(), FP8_E4M3).double()
        errors, run_max, shadow_max, coarse_max = [absmax(h - s)], [absmax(h)], [absmax(s)], [absmax(c)]
        for layer in range(depth):
            for _ in range(2):
                delta = (torch.randn(4, 2048, generator=gen) * 0.3 + 80 / (2 * depth)).bfloat16()
                h, s = fmt.add(h, delta), s + delta.double()
                c = round_to((c + delta.double()).float(), FP8_E4M3).double()
            errors.append(absmax(h.double() - s)), run_max.append(absmax(h)), shadow_max.append(absmax(s))
            coarse_max.append(absmax(c))
        worst, coarse_over = 0.0, False
        for trial in range(4):
            run, shadow, error, coarse = (
                [float(v[trial]) for v in series] for series in (run_max, shadow_max, errors, coarse_max)
            )
            bounds = shadow_gap_bound(fmt, run, shadow)
            assert all(e <= bound * m for e, bound, m in zip(error, bounds, shadow)), (depth, trial)
            assert all(abs(a - b) / b <= bound for a, b, bound in zip(run, shadow, bounds))
            worst = max(worst, max(e / (bound * m) for e, bound, m in zip(error, bounds, shadow)))
            over = shadow_gap_bound(fmt, coarse, shadow)
            coarse_over |= any(abs(a - b) / b > bound for a, b, bound in zip(coarse, shadow, over))
        assert worst > 0.01 and coarse_over, (depth, worst)


def steps(losses, grad_norms, gains=None, every=10):
    records = []
    for step, (loss, norm) in enumerate(zip(losses, grad_norms), 1):
        record = {"step": step, "loss": float(loss), "grad_norm": float(norm)}
        if gains is not None and step % every == 0:
            record["norm_gain_absmax"] = {"layers.0.ffn_norm": float(gains[step - 1]), "norm": 1.0}
        records.append(record)
    return records


def test_steady_rise_needs_every_quarter_above_the_last():
    assert steady_rise([1, 1, 2, 2, 3, 3, 4, 4]) == 3.0
    assert steady_rise([1, 1, 2, 2, 1.5, 1.5, 4, 4]) is None
    assert steady_rise([1, 2, 3]) is None


def test_norm_gains_climbing_fire_and_flat_or_warmup_gains_do_not():
    rng = np.random.default_rng(0)
    n, noise = 400, rng.normal(0, 0.01, 400)
    rising = 1.0 + np.clip(np.arange(n) - 200, 0, None) / 200 * 0.5 + noise  # flat, then +50% over the last 200 steps
    events = watched(steps(np.full(n, 3.0), np.ones(n), rising), trend_window=200)
    assert {(e["warning"], e["layer"]) for e in events} == {("gain_rise", "layers.0.ffn_norm")}
    (event,) = events
    assert event["step"] > 300 and event["value"] > 0.25 and "layers.0.ffn_norm" in event["message"]
    assert watched(steps(np.full(n, 3.0), np.ones(n), 1.0 + noise), trend_window=200) == []
    early = 1.0 + np.minimum(np.arange(n), 200) / 200 + noise  # rises only during a 200-step warmup
    assert watched(steps(np.full(n, 3.0), np.ones(n), early), warmup=200, trend_window=200) == []


def test_a_slow_grad_norm_rise_fires_only_while_the_loss_is_flat():
    rng = np.random.default_rng(1)
    n = 600
    norms = 0.5 * (1 + np.arange(n) / n) * np.exp(rng.normal(0, 0.1, n))  # noisy steps, +100% over the run
    flat = 3.0 + rng.normal(0, 0.01, n)
    events = watched(steps(flat, norms), trend_window=400)
    assert [(e["warning"], e["layer"]) for e in events] == [("grad_norm_rise", None)]
    assert (
        events[0]["step"] >= 400
        and events[0]["value"] > 0.25
        and "while the loss stayed within 1.0%" in events[0]["message"]
    )
    falling = np.linspace(4.0, 3.0, n)
    assert watched(steps(falling, norms), trend_window=400) == []  # the loss moves with it: not the drift note's sign
    assert watched(steps(flat, 0.5 * np.exp(rng.normal(0, 0.1, n))), trend_window=400) == []  # noise alone
    single = np.full(n, 0.5)
    single[500] = 5.0  # one step's jump is no trend
    assert watched(steps(flat, single), trend_window=400) == []


def test_a_loss_spike_fires_and_noise_does_not():
    rng = np.random.default_rng(2)
    losses = 3.0 + rng.normal(0, 0.03, 300)
    assert watched(steps(losses, np.ones(300))) == []
    losses[250] = 4.0
    (event,) = watched(steps(losses, np.ones(300)))
    # derived: 4.0 over the median m of 100 losses 3 + N(0, 0.03) (m's sd ~0.004): (4 - m) / m is 1/3 to 0.0017 per sd
    # of m; 0.03 is 18 sd
    assert (event["warning"], event["step"], event["layer"]) == ("loss_spike", 251, None) and event[
        "value"
    ] == pytest.approx(1 / 3, abs=0.03)
    losses[50] = 9.0  # before a full window of 100 steps: not tested
    assert [e["step"] for e in watched(steps(losses, np.ones(300)))] == [251]


def test_a_watch_replayed_to_a_checkpoint_continues_as_the_uninterrupted_one():
    rng = np.random.default_rng(3)
    n = 500
    losses, norms = 3.0 + rng.normal(0, 0.02, n), 0.5 * (1 + 2 * np.arange(n) / n)
    losses[[150, 420]] = 5.0
    records = steps(losses, norms)
    whole = watched(records, trend_window=200)
    assert [e["warning"] for e in whole] == ["loss_spike", "grad_norm_rise", "loss_spike"]
    resumed = Watch({**WARNINGS, "trend_window": 200}, 0, "bf16")
    resumed.replay(records[:300])
    assert [e for e in whole if e["step"] > 300] == [
        event for record in records[300:] for event in resumed.observe(record)
    ]


# ---- real runs ---------------------------------------------------------------------------------


DRIFT = {
    "tokens": 8 * 8 * 32,
    "schedule": {"warmup_steps": 2, "decay_steps": 2},
}  # 8 steps, the stream recorded at steps 4 and 8


def test_a_bf16_stream_pushed_large_fires_the_swallowed_warning(tokens, tmp_path, monkeypatch, capsys):
    records = train_micro(tokens, tmp_path, "micro-baseline", embedding_scale=64.0, monkeypatch=monkeypatch, **DRIFT)
    assert [r["step"] for r in records if "swallowed_fraction" in r] == [4, 8]
    fired = [e for r in records for e in r.get("warnings", [])]
    swallowed = [e for e in fired if e["warning"] == "swallowed"]
    assert swallowed and all(e["step"] == 4 and e["value"] > 0.5 for e in swallowed)
    assert {e["layer"] for e in swallowed} <= {0, 1} and records[3]["swallowed_fraction"][
        swallowed[0]["layer"]
    ] == swallowed[0]["value"]
    assert any(e["warning"] == "spacing" for e in fired)
    log = capsys.readouterr().err
    assert all(f"[micro-baseline] {e['message']}" in log for e in fired)
    # TensorBoard has the warnings as text and the live signals as scalars
    board, shares = event_scalars(tmp_path, "swallowed_fraction/0")
    # derived: TensorBoard stores a scalar as fp32 (2^-24 = 6e-8 relative); 1e-6 is 16x
    assert shares == [
        (r["step"], pytest.approx(r["swallowed_fraction"][0], rel=1e-6)) for r in records if "swallowed_fraction" in r
    ]
    (text,) = [e for e in board.Tensors("warnings/text_summary")]
    assert text.step == 4 and swallowed[0]["message"] in text.tensor_proto.string_val[0].decode()


def test_the_same_run_with_an_fp32_stream_stays_quiet(tokens, tmp_path, monkeypatch, capsys):
    records = train_micro(
        tokens,
        tmp_path,
        "micro-streamback",
        embedding_scale=64.0,
        monkeypatch=monkeypatch,
        log={**TRAIN["log"], "tensorboard": False},
        **DRIFT,
    )
    stream = [r for r in records if "swallowed_fraction" in r]
    assert len(stream) == 2 and all(set(SIGNAL_KEYS) <= set(r) for r in stream)
    assert all(v < 0.01 for r in stream for v in r["swallowed_fraction"]) and all(
        v < 1e-3 for r in stream for v in r["lost_mass_fraction"]
    )
    assert (
        all(s < 1e-3 for r in stream for s in r["stream_spacing"]) and max(stream[0]["stream_absmax"]) > 100
    )  # pushed large all the same
    assert not any("warnings" in r for r in records) and "warning (" not in capsys.readouterr().err
    assert not (tmp_path / "tb").exists()  # train.log.tensorboard: false writes no event file


def test_tensorboard_shows_every_step_once_across_a_resume(tokens, tmp_path):
    records = train_micro(tokens, tmp_path, "micro-streamback")
    (recipe,) = layout.recipe_dirs(tmp_path / "ckpt")
    shutil.rmtree(
        ckpt.checkpoint_dir(recipe, 30)
    )  # as if killed after the checkpoint of step 25, with steps 26-30 in the event file
    shutil.rmtree(tmp_path / "out")
    assert deterministic(train_micro(tokens, tmp_path, "micro-streamback")) == deterministic(records)
    assert len(list((tmp_path / "tb" / recipe.name).iterdir())) == 2  # one event file per attempt
    for tag, key in (
        ("train/loss", "loss"),
        ("train/val_loss", "val_loss"),
        ("train/lr", "lr"),
        ("train/grad_norm", "grad_norm"),
        ("stream_absmax/2", "stream_absmax"),
        ("lost_mass_fraction/1", "lost_mass_fraction"),
        ("norm_gain_absmax/layers.1.ffn_norm", "norm_gain_absmax"),
    ):
        _, seen = event_scalars(tmp_path, tag)
        index = {"stream_absmax": 2, "lost_mass_fraction": 1, "norm_gain_absmax": "layers.1.ffn_norm"}.get(key)
        expected = [(r["step"], r[key] if index is None else r[key][index]) for r in records if key in r]
        assert [s for s, _ in seen] == [s for s, _ in expected], tag  # every step once, in order
        # derived: TensorBoard stores a scalar as fp32 (2^-24 = 6e-8 relative); 1e-6 is 16x
        assert [v for _, v in seen] == pytest.approx([v for _, v in expected], rel=1e-6), tag
    board, speed = event_scalars(tmp_path, "train/tokens_per_s")
    assert len(speed) == 30 and {"train/elapsed_s", "train/tokens"} <= set(board.Tags()["scalars"])


def test_without_the_tensorboard_package_the_run_says_so_and_writes_none(tmp_path, monkeypatch):
    import sys

    from streamback.train.tensorboard import open_writer

    monkeypatch.setitem(
        sys.modules, "torch.utils.tensorboard", None
    )  # as where tensorboard is not installed: the import fails
    said = []
    assert open_writer(tmp_path / "tb", 1, said.append) is None
    assert said == [
        "tensorboard is not installed: no event files (pip install tensorboard, or train.log.tensorboard: false to "
        "stop this line)"
    ]
    assert not (tmp_path / "tb").exists()


# ---- the study page ------------------------------------------------------------------------------


def test_the_page_shows_the_live_swallowed_share_and_every_warning(tmp_path, monkeypatch):
    from streamback.report.page import Study, live_signals

    config = validate_config({})
    monkeypatch.chdir(tmp_path)
    runs = list(Study(config, []).runs)[:2]
    warning = {
        "warning": "swallowed",
        "step": 20,
        "layer": 1,
        "value": 0.7,
        "threshold": 0.5,
        "message": "warning (step 20, layer 1): ...",
    }
    for run, extra in zip(runs, ({20: {"warnings": [warning]}}, {})):
        layout.run_dir(run).mkdir(parents=True)
        lines = [
            {
                "step": s,
                "tokens": 100 * s,
                "loss": 1.0,
                "swallowed_fraction": [0.1, 0.2],
                "lost_mass_fraction": [0.01, 0.02],
            }
            | extra.get(s, {})
            for s in (10, 20)
        ]
        layout.metrics_file(run).write_text("".join(json.dumps(r) + "\n" for r in lines))
    blocks = live_signals(Study(config, []))
    assert blocks[0] == "Live precision signals"
    chart = blocks[1].to_dict()
    assert len(chart["datasets"][next(iter(chart["datasets"]))]) == 2 * 2 * 2  # runs x steps x layers
    table = next(b for b in blocks if isinstance(b, pd.DataFrame))
    assert table.to_dict("records") == [
        {
            "run": runs[0],
            **{k: warning[k] for k in ("step", "warning", "layer", "threshold", "message")},
            "value": "0.7",
        }
    ]
    assert blocks[-1] == f"No warning fired in {runs[1]}."


# ---- the full-precision shadow --------------------------------------------------------------

SHADOWED = {**DRIFT, "log": {**TRAIN["log"], "stream_every": 1, "shadow_every": 1, "tensorboard": False}}


def test_the_shadow_is_the_step_s_batch_through_its_weights_with_an_fp64_stream(tokens, tmp_path):
    """Step 1's shadow equals an independent forward: the initial weights (init_weights of the
    run's seed) in a model built with an fp64 stream and the same bf16 compute, on the step's two
    micro-batches (train_windows of step 0), max |h| and loss by hand."""
    from dataclasses import replace

    from streamback.data.shards import TokenDataset
    from streamback.train.batches import num_windows, rank_micro_batches, read_windows, train_windows
    from streamback.train.validation import next_token_loss

    records = train_micro(tokens, tmp_path, "micro-baseline", tensorboard=False, **SHADOWED)
    assert all(
        set(SHADOW_KEYS) <= set(r)
        and r["shadow_stream"] == "fp64"
        and len(r["shadow_absmax"]) == len(r["shadow_gap"]) == 3
        for r in records
    )
    cfg = micro_config(**SHADOWED)
    data = TokenDataset(tokens, "train")
    args = ModelArgs.from_config(cfg["model"], "micro", data.vocab_size, block="baseline")
    model = Transformer(replace(args, block="streamback", stream="fp64"))  # bf16 compute, fp64 stream
    model.init_weights(cfg["train"]["seed"])
    windows = train_windows(
        cfg["train"]["seed"], 0, cfg["train"]["batch_size"], num_windows(data.num_tokens, cfg["train"]["seq_len"])
    )
    absmax, losses = torch.zeros(3, dtype=torch.float64), []
    with torch.no_grad():
        for micro in rank_micro_batches(windows, 0, 1, cfg["train"]["micro_batch_size"]):
            batch = read_windows(data, micro, cfg["train"]["seq_len"])
            with model.capture(("residual",)) as seen:
                losses.append(float(next_token_loss(model(batch[:, :-1]), batch[:, 1:])))
                assert all(h.dtype == torch.float64 for h in seen["residual"])
                absmax = torch.maximum(absmax, torch.stack([h.abs().max() for h in seen["residual"]]))
    first = records[0]
    assert first["shadow_absmax"] == pytest.approx(absmax.tolist(), rel=1e-6)
    assert first["shadow_loss"] == pytest.approx(sum(losses) / len(losses), rel=1e-5)
    assert first["shadow_gap"] == pytest.approx(
        [abs(a - s) / s for a, s in zip(first["stream_absmax"], first["shadow_absmax"])]
    )
    assert first["shadow_gap"][0] == 0  # the embedding: bf16 rows, entered exactly into either stream


def test_the_shadow_sees_a_bf16_stream_pushed_large_drift_and_an_fp32_one_not(tokens, tmp_path, monkeypatch):
    runs = {}
    for run in ("micro-baseline", "micro-streamback"):
        root = tmp_path / run
        runs[run] = train_micro(
            tokens, root, run, tensorboard=False, embedding_scale=64.0, monkeypatch=monkeypatch, **SHADOWED
        )
        monkeypatch.undo()
    bf16 = max(g for r in runs["micro-baseline"] for g in r["shadow_gap"])
    fp32 = max(g for r in runs["micro-streamback"] for g in r["shadow_gap"])
    # measured: 2.3e-4 against 6.8e-8 (a bf16 stream's max within a few of its ulps, 2^-8, of the fp64 stream's)
    assert bf16 > 5e-5 and fp32 < 1e-6 and bf16 > 300 * fp32
    assert all(abs(r["shadow_loss"] - r["loss"]) < 1e-4 for r in runs["micro-streamback"])


def test_the_shadow_changes_no_bit_of_training(tokens, tmp_path):
    """A stochastically rounded stream draws from the global generator every step: the shadow,
    between the backward and the optimizer step, must draw nothing and touch no gradient."""
    run = "micro-streamback-bf16_sr"
    off = train_micro(
        tokens, tmp_path / "off", run, tensorboard=False, **{**SHADOWED, "log": {**SHADOWED["log"], "shadow_every": 0}}
    )
    on = train_micro(tokens, tmp_path / "on", run, tensorboard=False, **SHADOWED)
    assert all("shadow_gap" not in r for r in off) and all(r["shadow_stream"] == "fp64" for r in on)
    assert deterministic(off) == deterministic(on)
    a, b = (read_model(tmp_path / side / "out" / layout.MODEL_FILE).state for side in ("off", "on"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_shadow_step_records_the_stream_and_shadow_every_off_changes_no_rule_params(tokens, tmp_path):
    from streamback import jobs

    records = train_micro(
        tokens,
        tmp_path,
        "micro-baseline",
        tensorboard=False,
        **{**DRIFT, "log": {**TRAIN["log"], "stream_every": 4, "shadow_every": 3}},
    )
    assert [r["step"] for r in records if "stream_absmax" in r] == [3, 4, 6, 8] and [
        r["step"] for r in records if "shadow_gap" in r
    ] == [3, 6]
    off = jobs.train(micro_config(log={**TRAIN["log"], "shadow_every": 0}), "micro-baseline")["train"]["log"]
    assert "shadow_every" not in off  # the schema's 0: the params of every run trained before the key are unchanged
    assert (
        jobs.train(micro_config(log={**TRAIN["log"], "shadow_every": 8}), "micro-baseline")["train"]["log"][
            "shadow_every"
        ]
        == 8
    )


def test_the_page_sums_up_each_run_s_shadow(tmp_path, monkeypatch):
    from streamback.report.page import Study, live_signals

    config = validate_config({})
    monkeypatch.chdir(tmp_path)
    shadowed, plain = list(Study(config, []).runs)[:2]
    for run, gaps in ((shadowed, [[0.0, 1e-3, 2e-3], [0.0, 4e-3, 3e-3]]), (plain, [])):
        layout.run_dir(run).mkdir(parents=True)
        lines = [
            {
                "step": 50 * (i + 1),
                "tokens": 100,
                "loss": 2.0,
                "shadow_stream": "fp64",
                "shadow_absmax": [1.0, 2.0, 3.0],
                "shadow_gap": g,
                "shadow_loss": 2.0 - 1e-3 * (i + 1),
            }
            for i, g in enumerate(gaps)
        ] or [{"step": 1, "tokens": 100, "loss": 2.0}]
        layout.metrics_file(run).write_text("".join(json.dumps(r) + "\n" for r in lines))
    blocks = live_signals(Study(config, []))
    at = blocks.index("Full-precision shadow")
    assert blocks[at + 1].to_dict("records") == [
        {
            "run": shadowed,
            "shadow_stream": "fp64",
            "shadowed_steps": 2,
            "max_gap": "4.00e-03",
            "max_gap_step": 100,
            "max_gap_boundary": 1,
            "last_max_gap": "4.00e-03",
            "loss_minus_shadow": "+1.50e-03",
        }
    ]
