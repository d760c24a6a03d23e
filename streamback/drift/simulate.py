"""Drift of a long running sum kept in a narrow float format (the drift note).

Every coordinate starts at `start` and, for `steps` steps, has `mu + sigma * N(0, 1)` added to
it, the way a residual stream has each block's output added to it. Each *path* keeps that sum
differently (`PATHS`): in fp32, in fp32 but with bf16-rounded updates, in bf16 rounded to
nearest (of fp32 updates, and of bf16-rounded ones: the baseline block adds its bf16 sublayer
output to its bf16 stream), in bf16 with stochastic rounding, in bf16 with a bf16 Kahan compensation term, in fp16
and in the fp8 formats. All rounding is `streamback.model.rounding`'s (`round_to`, and `round_fp32`, its
arithmetic with the random bits passed in).

Within one seed every path and every (mu, sigma) setting sees the same fp32 noise draws (common
random numbers), so the differences between paths are due to rounding alone. The simulation
is vectorised: the running values of all paths form one [paths, seeds, settings, coords] tensor
and the only Python loop is over steps. One step of every path is one function (`step`), which
`torch.compile` turns into a single fused, vectorised kernel giving the same bits as the eager
step (rounding works on bit patterns, which no fusion can skip); where compiling fails, the same
function runs eagerly. Stochastic rounding draws its random bits from one further generator,
seeded from the whole seed list. Noise and rounding bits are drawn `CHUNK` steps at a time; for
the noise that is the same numbers as drawing step by step (when `coords` is a multiple of 16:
torch draws normals in blocks of 16).

A path whose format cannot hold the start value (fp8 e4m3 tops out at 448 < 600) is not
simulated: its rows carry NaN drift and a note saying why, rather than a saturated result
that would look like a finding.

The tables of the outcome (`summary_table`, `trajectory_table`, `spacing_table`) are here too;
figures and the page are `streamback.drift.report`'s, the command `streamback drift` is
`streamback.drift.stage`.
"""

from __future__ import annotations

import functools
import hashlib
import math
import warnings
from dataclasses import dataclass

import pandas as pd
import torch

from streamback.errors import StreambackError
from streamback.model.rounding import (
    BF16,
    FP8_E4M3,
    FP8_E5M2,
    FP16,
    FP32,
    FloatSpec,
    Noise,
    round_fp32,
    round_to,
    stochastic_noise,
)


@dataclass(frozen=True)
class SumPath:
    """One way of keeping the running sum."""

    name: str
    sum_format: FloatSpec  # grid the running sum lives on
    rounding: str = "nearest"  # how each new sum is rounded onto that grid
    update_format: FloatSpec = FP32  # grid each update is rounded onto before it is added
    compensated: bool = False  # Kahan: carry each step's rounding error in a second sum_format value
    about: str = ""

    @property
    def sum_roundings(self) -> int:
        """Roundings onto `sum_format` per step (each draws its own bits if stochastic)."""
        return 4 if self.compensated else 1


PATHS = {
    p.name: p
    for p in (
        SumPath("fp32", FP32, about="fp32 sum (the reference)"),
        SumPath("fp32_bf16_updates", FP32, update_format=BF16, about="fp32 sum of bf16-rounded updates"),
        SumPath("bf16", BF16, about="sum kept in bf16, round to nearest even"),
        SumPath(
            "bf16_bf16_updates",
            BF16,
            update_format=BF16,
            about="bf16 sum of bf16-rounded updates, round to nearest even (the baseline block's own add)",
        ),
        SumPath("bf16_sr", BF16, rounding="stochastic", about="sum kept in bf16, stochastic rounding"),
        SumPath("fp16", FP16, about="sum kept in fp16, round to nearest even"),
        SumPath("bf16_kahan", BF16, compensated=True, about="bf16 sum with a bf16 Kahan compensation term"),
        SumPath("fp8_e4m3", FP8_E4M3, about="sum kept in fp8 e4m3 (saturating), round to nearest even"),
        SumPath("fp8_e5m2", FP8_E5M2, about="sum kept in fp8 e5m2, round to nearest even"),
    )
}
REFERENCE = "fp32"


def advance(
    path: SumPath,
    total: torch.Tensor,
    comp: torch.Tensor | None,
    update: torch.Tensor,
    noise: list[Noise] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One step of `path`: add `update` (fp32) to `total`; returns the new (total, compensation).

    `noise`: for a stochastic path, one `stochastic_noise` of the sum format per rounding of the step
    (`path.sum_roundings`), used in order."""
    fmt, draws = path.sum_format, iter(noise or ())

    def rnd(x):
        return round_fp32(x, fmt, next(draws) if path.rounding == "stochastic" else None)

    update = round_fp32(update, path.update_format)
    if not path.compensated:
        return rnd(total + update), comp
    y = rnd(update - comp)
    new = rnd(total + y)
    comp = rnd(rnd(new - total) - y)
    return new, comp


def skip_reason(path: SumPath, start: float) -> str:
    """Why `path` cannot be simulated from `start` ("" if it can)."""
    fmt = path.sum_format
    if abs(start) > fmt.max_value:
        return (
            f"not simulated: start {start:g} is beyond {fmt.name}'s largest finite value {fmt.max_value:g} "
            f"({'it would saturate there' if fmt.saturate else 'it would overflow'} before the first step)"
        )
    return ""


def start_value(path: SumPath, start: float) -> float:
    """`start` as stored in the path's format (rounded to nearest)."""
    return float(round_to(torch.tensor([float(start)]), path.sum_format))


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def rounding_seed(seeds: list[int]) -> int:
    """Seed of the generator of stochastic-rounding bits: derived from the whole seed list."""
    return int.from_bytes(hashlib.sha256(repr(list(seeds)).encode()).digest()[:8], "little") >> 1


@dataclass
class Simulation:
    """The outcome of `simulate`: final values and the recorded trajectory, per path."""

    paths: list[str]  # simulated paths, in PATHS order
    skipped: dict[str, str]  # path -> reason it was not simulated
    initial: dict[str, float]  # path -> the start value as stored on its grid
    final: dict[str, torch.Tensor]  # path -> [seeds, settings, coords]
    steps_recorded: list[int]
    traj_mean: torch.Tensor  # [records, paths, seeds, settings], mean over coordinates
    traj_std: torch.Tensor  # same shape, standard deviation over coordinates
    compiled: bool  # whether the step ran as torch.compile's kernel (else eagerly; the same results)


def check_config(cfg: dict) -> None:
    """Problems the schema cannot express, reported before any work starts."""
    pairs = [(s["mu"], s["sigma"]) for s in cfg["settings"]]
    if len(set(pairs)) != len(pairs):
        raise StreambackError(f"drift.settings: each (mu, sigma) pair must appear once, got {pairs}")
    values = [cfg["start"]] + [v for pair in pairs for v in pair]
    if not all(math.isfinite(v) for v in values):
        raise StreambackError(
            f"drift.start and drift.settings must be finite numbers, got start={cfg['start']}, settings={pairs}"
        )
    if reason := skip_reason(PATHS[REFERENCE], cfg["start"]):
        raise StreambackError(f"drift.start: the fp32 reference path cannot run ({reason})")


def step(
    paths: tuple[SumPath, ...],
    totals: torch.Tensor,
    comps: list[torch.Tensor | None],
    z: torch.Tensor,
    mu: torch.Tensor,
    sigma: torch.Tensor,
    noise: list[list[Noise] | None],
):
    """One step of every path: totals [paths, seeds, settings, coords] and each path's compensation,
    noise z [seeds, coords] (the update is mu + sigma * z per setting), each path's rounding noise."""
    update = mu + sigma * z.unsqueeze(1)
    new = [advance(p, total, comp, update, n) for p, total, comp, n in zip(paths, totals.unbind(), comps, noise)]
    return torch.stack([total for total, _ in new]), [comp for _, comp in new]


@functools.cache
def compiled_step():
    """`step` compiled by torch.compile: on CPU, Inductor's one fused, vectorised C++ kernel. Pinned to
    IEEE arithmetic (no a * b + c contracted into an FMA, no unsafe math), so it gives the eager bits."""
    return torch.compile(
        step,
        fullgraph=True,
        dynamic=False,
        options={"cpp.enable_floating_point_contract_flag": "off", "cpp.enable_unsafe_math_opt_flag": False},
    )


CHUNK = 10  # steps of random numbers drawn at once


def simulate(cfg: dict, compiled: bool = True) -> Simulation:
    """Run every path of the `drift` config section at once; a Python loop only over steps.

    compiled: run the step as torch.compile's kernel (the first call compiles it); where compiling
    fails (no C++ compiler, say) it warns and runs the step eagerly, with the same results, and
    `Simulation.compiled` says so."""
    check_config(cfg)
    seeds, settings = list(cfg["seeds"]), cfg["settings"]
    names = [n for n in PATHS if n == REFERENCE or n in cfg["paths"]]
    skipped = {n: r for n in names if (r := skip_reason(PATHS[n], cfg["start"]))}
    run = tuple(PATHS[n] for n in names if n not in skipped)

    mu = torch.tensor([s["mu"] for s in settings], dtype=torch.float32).view(1, -1, 1)
    sigma = torch.tensor([s["sigma"] for s in settings], dtype=torch.float32).view(1, -1, 1)
    shape = (len(seeds), len(settings), cfg["coords"])
    initial = {p.name: start_value(p, cfg["start"]) for p in run}
    totals = torch.tensor([initial[p.name] for p in run]).view(-1, 1, 1, 1).repeat(1, *shape)
    comps = [torch.zeros(shape) if p.compensated else None for p in run]
    step_all = compiled_step() if compiled else step

    every, steps = cfg["trajectory_every"], cfg["steps"]
    recorded, means, stds = [], [], []

    def record(number):
        mean = totals.mean(dim=-1)
        means.append(mean)
        stds.append((totals - mean.unsqueeze(-1)).square_().mean(dim=-1).sqrt_())
        recorded.append(number)

    record(0)
    for number, (z, noise) in enumerate(draws(run, seeds, shape, steps), start=1):
        args = (run, totals, comps, z, mu, sigma, noise)
        try:
            totals, comps = step_all(*args)
        except Exception as error:  # torch.compile could not build its kernel here
            if step_all is step:
                raise
            warnings.warn(f"drift: torch.compile failed, running the step eagerly (same results, slower): {error}")
            step_all, compiled = step, False
            totals, comps = step_all(*args)
        if number % every == 0 or number == steps:
            record(number)
    return Simulation(
        paths=[p.name for p in run],
        skipped=skipped,
        initial=initial,
        final=dict(zip(initial, totals)),
        steps_recorded=recorded,
        traj_mean=torch.stack(means),
        traj_std=torch.stack(stds),
        compiled=compiled,
    )


def draws(run: tuple[SumPath, ...], seeds: list[int], shape: tuple[int, int, int], steps: int):
    """Per step: the noise z [seeds, coords] (seed k's from its own generator) and each path's rounding
    noise (None, or one `stochastic_noise` per rounding), drawn CHUNK steps at a time."""
    noise_gens = [_generator(s) for s in seeds]
    sr_gen = _generator(rounding_seed(seeds))
    for first in range(0, steps, CHUNK):
        n = min(CHUNK, steps - first)
        z = torch.stack([torch.randn(n, shape[-1], generator=g) for g in noise_gens], dim=1)
        chunk = [
            stochastic_noise((n, p.sum_roundings, *shape), p.sum_format, sr_gen) if p.rounding == "stochastic" else None
            for p in run
        ]
        for i in range(n):
            yield z[i], [None if c is None else _per_rounding(c, i) for c in chunk]


def _per_rounding(chunk: Noise, i: int) -> list[Noise]:
    """Step `i` of a chunk of rounding noise shaped [steps, roundings, ...]: one Noise per rounding."""
    bits, uniforms = chunk
    return [(bits[i, r], None if uniforms is None else uniforms[i, r]) for r in range(bits.shape[1])]


# --- tables -------------------------------------------------------------------------------


def summary_table(cfg: dict, sim: Simulation) -> pd.DataFrame:
    """One row per (mu, sigma, path, seed): the drift, its ratio to the fp32 drift, notes."""
    rows = []
    for j, setting in enumerate(cfg["settings"]):
        for k, seed in enumerate(cfg["seeds"]):
            for name in [n for n in PATHS if n in sim.paths or n in sim.skipped]:
                row = dict(
                    mu=setting["mu"],
                    sigma=setting["sigma"],
                    path=name,
                    seed=seed,
                    steps=cfg["steps"],
                    coords=cfg["coords"],
                    start=cfg["start"],
                )
                if name in sim.skipped:
                    rows.append(
                        row | dict(drift=math.nan, drift_std=math.nan, final_max=math.nan, note=sim.skipped[name])
                    )
                    continue
                final = sim.final[name][k, j].double()
                delta = final - sim.initial[name]
                notes = []
                if sim.initial[name] != cfg["start"]:
                    notes.append(f"start stored as {sim.initial[name]:g} in {PATHS[name].sum_format.name}")
                fmt = PATHS[name].sum_format
                at_limit = int((final.abs() >= fmt.max_value).sum())
                if at_limit:
                    notes.append(
                        f"{at_limit} of {final.numel()} coordinates end at or beyond {fmt.name}'s limit "
                        f"{fmt.max_value:g} ({'saturated' if fmt.saturate else 'overflowed'})"
                    )
                rows.append(
                    row
                    | dict(
                        drift=delta.mean().item(),
                        drift_std=delta.std(correction=0).item(),
                        final_max=final.max().item(),
                        note="; ".join(notes),
                    )
                )
    table = pd.DataFrame(rows)
    ref = table[table.path == REFERENCE].set_index(["mu", "sigma", "seed"])["drift"]
    ref_drift = ref.reindex(pd.MultiIndex.from_frame(table[["mu", "sigma", "seed"]])).to_numpy()
    table.insert(table.columns.get_loc("drift") + 1, "drift_ratio", table["drift"].to_numpy() / ref_drift)
    return table


def trajectory_table(cfg: dict, sim: Simulation) -> pd.DataFrame:
    """Mean and spread (standard deviation) over coordinates of the running value, per recorded step."""
    steps, paths, seeds = sim.steps_recorded, sim.paths, cfg["seeds"]
    settings = cfg["settings"]
    index = pd.MultiIndex.from_product(
        [steps, paths, seeds, range(len(settings))], names=["step", "path", "seed", "setting"]
    ).to_frame(index=False)
    index.insert(0, "mu", [settings[i]["mu"] for i in index.setting])
    index.insert(1, "sigma", [settings[i]["sigma"] for i in index.setting])
    index["mean"] = sim.traj_mean.reshape(-1).numpy()
    index["std"] = sim.traj_std.reshape(-1).numpy()
    return index.drop(columns="setting")[["mu", "sigma", "path", "seed", "step", "mean", "std"]]


SPACING_FORMATS = (BF16, FP16, FP8_E4M3, FP8_E5M2)
# (format, value, update): the note's probes at 600, and the tie-to-even case one grid point up.
PROBES = ((BF16, 600.0, 2.0), (BF16, 600.0, 2.1), (BF16, 604.0, 2.0), (FP16, 600.0, 0.2), (FP16, 600.0, 0.3))


def _next_up(value: float, spec: FloatSpec) -> tuple[float, str]:
    """The next representable value above `value` in `spec`'s native dtype, and how it was found."""
    v = torch.tensor([value], dtype=spec.dtype)
    if spec.dtype in (torch.bfloat16, torch.float16):
        return float(torch.nextafter(v, torch.tensor([math.inf], dtype=spec.dtype))), "torch.nextafter"
    # torch has no nextafter for fp8: decode all 256 codes and take the next finite value up.
    codes = torch.arange(256, dtype=torch.uint8).view(spec.dtype).double()
    above = codes[torch.isfinite(codes) & (codes > float(v))]
    return float(above.min()), "decoding all 256 codes"


def spacing_table() -> pd.DataFrame:
    """The grids measured in torch's native dtypes: the gap in every power-of-two range, and probes."""
    rows = []
    for spec in SPACING_FORMATS:
        top = math.floor(math.log2(spec.max_value))
        for e in range(spec.min_exponent, top + 1):
            value = math.ldexp(1.0, e)
            up, how = _next_up(value, spec)
            rows.append(
                dict(
                    format=spec.name,
                    kind="range",
                    value=value,
                    upper=min(2 * value, spec.max_value),
                    gap=up - value,
                    update=math.nan,
                    result=math.nan,
                    measured_by=how,
                )
            )
    for spec, value, update in PROBES:
        v = torch.tensor([value], dtype=spec.dtype)
        up, how = _next_up(value, spec)
        result = float(v + update)  # native arithmetic: computed in fp32, rounded to nearest even
        rows.append(
            dict(
                format=spec.name,
                kind="probe",
                value=value,
                upper=math.nan,
                gap=up - value,
                update=update,
                result=result,
                measured_by=how,
            )
        )
    return pd.DataFrame(rows)
