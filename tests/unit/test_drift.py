"""streamback.drift.simulate: the measured grids, hand-derived drifts, the vectorised grid against a plain
loop in torch's native narrow dtypes, and the compiled step against the eager one."""

import math

import pytest
import torch

from streamback import cli
from streamback.drift import simulate as drift
from streamback.drift.simulate import PATHS, simulate, spacing_table, summary_table
from streamback.model.rounding import BF16, FP8_E4M3, FP8_E5M2, FP16

from helpers.drift import assert_same_simulation, config


def finals(cfg):
    sim = simulate(cfg, compiled=False)
    return sim, {name: sim.final[name][0, :, 0].tolist() for name in sim.paths}


# --- spacing -------------------------------------------------------------------------------


def test_spacing_probes_at_600():
    probes = spacing_table().query("kind == 'probe'").set_index(["format", "value", "update"])
    assert probes.loc[("bf16", 600.0, 2.0)].gap == 4.0
    assert probes.loc[("bf16", 600.0, 2.0)].result == 600.0  # +2.0 is lost (a tie, to the even 600)
    assert probes.loc[("bf16", 600.0, 2.1)].result == 604.0  # +2.1 jumps by a whole gap
    assert probes.loc[("bf16", 604.0, 2.0)].result == 608.0  # the same tie from an odd grid point goes up
    assert probes.loc[("fp16", 600.0, 0.2)].gap == 0.5 and probes.loc[("fp16", 600.0, 0.3)].result == 600.5


def test_spacing_per_power_of_two_range():
    ranges = spacing_table().query("kind == 'range'")
    hand = {
        ("bf16", 512.0): 4.0,
        ("bf16", 1024.0): 8.0,
        ("bf16", 1.0): 2**-7,
        ("fp16", 512.0): 0.5,
        ("fp16", 1024.0): 1.0,
        ("fp8_e4m3", 256.0): 32.0,
        ("fp8_e4m3", 1.0): 0.125,
        ("fp8_e5m2", 512.0): 128.0,
    }
    measured = ranges.set_index(["format", "value"]).gap
    for key, gap in hand.items():
        assert measured[key] == gap, key
    for spec in (BF16, FP16, FP8_E4M3, FP8_E5M2):
        rows = ranges[ranges.format == spec.name]
        exponents = [math.frexp(v)[1] - 1 for v in rows.value]
        assert exponents == list(range(spec.min_exponent, math.floor(math.log2(spec.max_value)) + 1))
        # a format with m stored mantissa bits has 2**m values in each power-of-two range
        assert all(gap == math.ldexp(1.0, e - spec.mantissa_bits) for gap, e in zip(rows.gap, exponents))


# --- drift with known outcomes --------------------------------------------------------------


def test_constant_updates_hand_derived():
    cfg = config(settings=[{"mu": 1.0, "sigma": 0.0}, {"mu": 2.0, "sigma": 0.0}, {"mu": 2.1, "sigma": 0.0}])
    sim, end = finals(cfg)
    assert end["fp32"][:2] == [800.0, 1000.0] and end["fp32_bf16_updates"][:2] == [800.0, 1000.0]
    assert end["fp16"][:2] == [800.0, 1000.0]
    # bf16 (gap 4): +1 is always lost, +2 is a tie that goes back to the even 600, and +2.1 climbs 4 a
    # step until 1024, where the gap doubles to 8 and +2.1 is lost again: it freezes at 1024.
    assert end["bf16"] == [600.0, 600.0, 1024.0]
    # Kahan's compensation term carries what each rounding lost, so the sum is exact
    assert end["bf16_kahan"][:2] == [800.0, 1000.0]
    # 600 is not an fp8 e5m2 value: it is stored as 640 (gap 128 there), and nothing below 64 moves it
    assert sim.initial["fp8_e5m2"] == 640.0 and end["fp8_e5m2"] == [640.0] * 3

    _, end = finals(config(start=604.0, settings=[{"mu": 2.0, "sigma": 0.0}]))
    assert end["bf16"] == [608.0]  # 606 ties up to the even 608, and 610 ties back down to it


def test_bf16_updates_into_a_bf16_sum_hand_derived():
    """bf16_bf16_updates rounds each update to bf16 first, as the baseline block's bf16 sublayer output
    is: 2.005 is 2.0 in bf16 (its gap at 2 is 2^-6), so at 600 (gap 4) it is the tie that goes back to
    the even 600, where the fp32 update 2.005 is past the half gap and climbs 4 a step to 1024."""
    cfg = config(steps=200, settings=[{"mu": 2.005, "sigma": 0.0}, {"mu": 2.1, "sigma": 0.0}])
    _, end = finals(cfg)
    assert end["bf16"] == [1024.0, 1024.0]
    assert end["bf16_bf16_updates"] == [600.0, 1024.0]  # 2.1 is 2.09375 in bf16: still past the half gap
    assert end["fp32_bf16_updates"][0] == 600.0 + 200 * 2.0  # exact: every partial sum is an integer
    _, end = finals(config(start=604.0, steps=200, settings=[{"mu": 2.005, "sigma": 0.0}]))
    assert end["bf16_bf16_updates"] == [608.0]  # 604 + 2.0 ties up to the even 608, 608 + 2.0 back down to it
    # three steps by hand, in bf16 (gap 4 at 600): 600 + 1.99 (1.9921875 in bf16) -> 600; + 2.3 (2.296875)
    # -> 602.296875 -> 604; + -2.01 (-2.0) -> 602, a tie to the even 600 ... 604 is odd (151 x 4), 600 even
    sums = torch.tensor([600.0])
    for update in (1.99, 2.3, -2.01):
        sums = drift.advance(PATHS["bf16_bf16_updates"], sums, None, torch.tensor([update]))[0]
        assert sums.item() in (600.0, 604.0)
    assert sums.item() == 600.0


def test_stochastic_rounding_keeps_constant_updates_on_average():
    """+1 at 600 in bf16 rounds up to 604 with probability 1/4; after 100 steps the mean drift is 100."""
    sim = simulate(
        config(coords=4096, steps=100, settings=[{"mu": 1.0, "sigma": 0.0}], paths=["bf16_sr"]), compiled=False
    )
    drift = sim.final["bf16_sr"].double() - 600.0
    standard_error = math.sqrt(100 * 16 * 0.25 * 0.75 / drift.numel())
    assert abs(drift.mean().item() - 100.0) < 5 * standard_error


def _native_loop(path, cfg, mu, sigma, seed):
    """One (setting, seed) of `path` step by step in torch's native bf16 / fp16 / fp8 arithmetic."""
    g = torch.Generator().manual_seed(seed)
    mu, sigma = torch.tensor(mu), torch.tensor(sigma)
    dtype = {
        "fp32": torch.float32,
        "fp32_bf16_updates": torch.float32,
        "bf16": torch.bfloat16,
        "bf16_bf16_updates": torch.bfloat16,
        "bf16_kahan": torch.bfloat16,
        "fp16": torch.float16,
        "fp8_e5m2": torch.float8_e5m2,
    }[path]
    total = torch.full((cfg["coords"],), cfg["start"]).to(dtype)
    comp = torch.zeros(cfg["coords"], dtype=dtype)
    for _ in range(cfg["steps"]):
        update = mu + sigma * torch.randn(cfg["coords"], generator=g)
        if path == "fp32_bf16_updates":
            total = total + update.bfloat16().float()
        elif path == "bf16_bf16_updates":
            total = total + update.bfloat16()  # bf16 + bf16, torch's native add (in fp32, rounded once to bf16)
        elif path == "bf16_kahan":
            y = (update - comp.float()).bfloat16()
            new = total + y  # bf16 + bf16: computed in fp32, rounded to bf16
            comp = (new - total) - y
            total = new
        else:
            total = (total.float() + update).to(dtype)
    return total.float()


def test_vectorised_grid_matches_native_dtype_loop():
    settings = [{"mu": 0.2, "sigma": 0.5}, {"mu": 0.5, "sigma": 1.0}]
    cfg = config(steps=300, settings=settings, seeds=[0, 5])
    sim = simulate(cfg, compiled=False)
    summary = summary_table(cfg, sim).set_index(["mu", "sigma", "path", "seed"])
    for path in ["fp32", "fp32_bf16_updates", "bf16", "bf16_bf16_updates", "bf16_kahan", "fp16", "fp8_e5m2"]:
        for j, s in enumerate(settings):
            for k, seed in enumerate(cfg["seeds"]):
                expected = _native_loop(path, cfg, s["mu"], s["sigma"], seed)
                assert torch.equal(sim.final[path][k, j], expected), (path, s, seed)
                drift = (expected.double() - sim.initial[path]).mean().item()
                # derived: the same fp64 mean of fp32 values (n x 2^-53 relative at most, ~1e-14 here): 1e-9 is far
                # wider
                assert summary.loc[(s["mu"], s["sigma"], path, seed), "drift"] == pytest.approx(drift, abs=1e-9)
    # the recorded trajectory ends at the final values
    final_means = torch.stack([sim.final[p].mean(-1) for p in sim.paths])
    # derived (probabilistic): the same fp32 means, maybe summed in another order: ~sqrt(n) 2^-24 = 1e-6 for n = 256
    # coordinates, inside allclose's default rtol 1e-5
    assert sim.steps_recorded[-1] == 300 and torch.allclose(sim.traj_mean[-1], final_means)


def test_summary_rows_ratios_and_the_skipped_e4m3():
    cfg = config(settings=[{"mu": 0.2, "sigma": 1.0}, {"mu": 0.5, "sigma": 1.0}], seeds=[3, 4])
    summary = summary_table(cfg, simulate(cfg, compiled=False))
    assert list(summary.columns[:9]) == [
        "mu",
        "sigma",
        "path",
        "seed",
        "steps",
        "coords",
        "start",
        "drift",
        "drift_ratio",
    ]
    assert len(summary) == 2 * 2 * len(PATHS)
    assert (summary[summary.path == "fp32"].drift_ratio == 1.0).all()
    e4m3 = summary[summary.path == "fp8_e4m3"]
    assert e4m3.drift.isna().all() and e4m3.note.str.contains("448").all()
    # from a start e4m3 can hold, it is simulated
    small = summary_table(config(start=100.0), simulate(config(start=100.0), compiled=False))
    assert small.set_index("path").drift.notna()["fp8_e4m3"]


def test_failed_compile_falls_back_to_the_eager_step(monkeypatch):
    def broken(*args):
        raise RuntimeError("no C++ compiler")

    monkeypatch.setattr(drift, "compiled_step", lambda: broken)
    cfg = config(steps=20, seeds=[0, 1])
    with pytest.warns(UserWarning, match="no C\\+\\+ compiler"):
        sim = simulate(cfg, compiled=True)
    assert not sim.compiled
    assert_same_simulation(sim, simulate(cfg, compiled=False))


def test_cli_rejects_duplicate_settings_before_writing(tmp_path, capsys):
    params = '{"settings": [{"mu": 0.2, "sigma": 0.5}, {"mu": 0.2, "sigma": 0.5}]}'
    assert cli.main(["drift", "--params", params, "--outdir", str(tmp_path / "out")]) == 2
    assert "drift.settings" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


# --- figures -----------------------------------------------------------------------------------


def test_figures_tell_every_path_apart_and_name_what_is_not_drawn():
    """Paths whose mean curves coincide (fp32, fp32 with bf16 updates, SR, Kahan, fp16) each get a
    row of their difference to fp32; a path that was not simulated is named on both figures."""
    from streamback.drift.report import ratio_chart, trajectory_chart
    from streamback.drift.simulate import trajectory_table

    cfg = config(steps=40)
    sim = simulate(cfg, compiled=False)
    assert "fp8_e4m3" in sim.skipped
    spec = trajectory_chart(trajectory_table(cfg, sim), cfg["start"], sim.skipped).to_dict()
    assert any("Not drawn: fp8_e4m3" in line and "448" in line for line in spec["title"]["subtitle"])
    top, below = spec["vconcat"]
    rows = below["data"]["values"] if "values" in below.get("data", {}) else spec["datasets"][below["data"]["name"]]
    assert {r["path"] for r in rows} == set(sim.paths) - {"fp32"}
    fp32_mean = {r["step"]: r["mean"] for r in spec["datasets"][top["data"]["name"]] if r["path"] == "fp32"}
    # derived: the same formula by hand on the same floats (fp64 roundings only, within approx's default 1e-6)
    assert all(r["minus_fp32"] == pytest.approx(r["mean"] - fp32_mean[r["step"]]) for r in rows)
    ratio = ratio_chart(summary_table(cfg, sim)).to_dict()
    assert any("Not drawn: fp8_e4m3" in line for line in ratio["title"]["subtitle"])
