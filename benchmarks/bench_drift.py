"""Time the drift simulation: the vectorised default grid against a plain per-step Python loop.

The vectorised run is `streamback.drift.simulate` on the default config's `drift` section: every
path, setting and seed advances together, one call per step of the step function that
torch.compile turns into one fused kernel. Its compile time is reported on its own (the first
call; Inductor's on-disk cache may make it a warm start, --cold turns that cache off). The
compiled run is then timed --repeats times (the machine may be shared: the fastest is the
figure, the median beside it), and the same run with the eager step (the fallback where
compiling fails) over --eager-steps steps. The plain loop runs each (path, setting, seed) on its
own 4096-coordinate vector, step by step, with the same `advance` and the same noise, over
--plain-steps steps. Runs shorter than the grid's steps are extrapolated linearly. Everything
runs on one thread; times are CPU seconds of this process (on one thread, the compute, little
affected by other jobs) with wall-clock seconds beside them. The compile's C++ builds run in
worker processes, so its wall-clock time is the figure there. A breakdown of one step of the
whole grid shows where the time goes.

    python benchmarks/bench_drift.py [--repeats 3] [--eager-steps 400] [--plain-steps 50] [--cold]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from streamback.config import load_config
from streamback.drift.simulate import (
    PATHS,
    advance,
    compiled_step,
    draws,
    rounding_seed,
    simulate,
    skip_reason,
    start_value,
)
from streamback.model.rounding import stochastic_noise

GOAL_S = 1.0


def timed(fn, *args, **kwargs):
    """(result, CPU seconds, wall seconds) of fn(*args, **kwargs)."""
    cpu, wall = time.process_time(), time.perf_counter()
    result = fn(*args, **kwargs)
    return result, time.process_time() - cpu, time.perf_counter() - wall


def simulated_paths(cfg: dict) -> tuple:
    return tuple(p for name, p in PATHS.items() if name in cfg["paths"] and not skip_reason(p, cfg["start"]))


def plain_loop(cfg: dict, steps: int) -> dict:
    """Each (path, setting, seed) separately, one [coords] vector, `steps` steps; final values."""
    finals = {}
    sr_gen = torch.Generator().manual_seed(rounding_seed(cfg["seeds"]))
    for path in simulated_paths(cfg):
        for j, s in enumerate(cfg["settings"]):
            mu, sigma = torch.tensor(s["mu"]), torch.tensor(s["sigma"])
            for k, seed in enumerate(cfg["seeds"]):
                gen = torch.Generator().manual_seed(seed)
                total = torch.full((cfg["coords"],), start_value(path, cfg["start"]))
                comp = torch.zeros(cfg["coords"]) if path.compensated else None
                for _ in range(steps):
                    update = mu + sigma * torch.randn(cfg["coords"], generator=gen)
                    noise = (
                        [stochastic_noise(total.shape, path.sum_format, sr_gen) for _ in range(path.sum_roundings)]
                        if path.rounding == "stochastic"
                        else None
                    )
                    total, comp = advance(path, total, comp, update, noise)
                finals[path.name, j, k] = total
    return finals


def step_arguments(cfg: dict) -> tuple:
    """Arguments of one `step` of the whole default grid (values as at the start)."""
    run = simulated_paths(cfg)
    shape = (len(cfg["seeds"]), len(cfg["settings"]), cfg["coords"])
    totals = torch.stack([torch.full(shape, start_value(p, cfg["start"])) for p in run])
    comps = [torch.zeros(shape) if p.compensated else None for p in run]
    mu = torch.tensor([s["mu"] for s in cfg["settings"]]).view(1, -1, 1)
    sigma = torch.tensor([s["sigma"] for s in cfg["settings"]]).view(1, -1, 1)
    z, noise = next(draws(run, cfg["seeds"], shape, 1))
    return run, totals, comps, z, mu, sigma, noise


def per_step(fn, steps: int) -> float:
    """CPU seconds per step of `fn(steps)`."""
    _, cpu, _ = timed(fn, steps)
    return cpu / steps


def breakdown(cfg: dict, steps: int) -> dict[str, float]:
    """CPU seconds per step of the whole grid: the random draws, the compiled step, the rest."""
    run = simulated_paths(cfg)
    shape = (len(cfg["seeds"]), len(cfg["settings"]), cfg["coords"])
    nearest = tuple(p for p in run if p.rounding == "nearest")
    args = step_arguments(cfg)
    compiled = compiled_step()

    def noise_only(n):
        for _ in draws(nearest, cfg["seeds"], shape, n):
            pass

    def all_draws(n):
        for _ in draws(run, cfg["seeds"], shape, n):
            pass

    def steps_only(n):
        for _ in range(n):
            compiled(*args)

    noise = per_step(noise_only, steps)
    times = {
        "noise N(0, 1), per seed": noise,
        "stochastic-rounding bits": per_step(all_draws, steps) - noise,
        "compiled step, all paths": per_step(steps_only, steps),
    }
    total = per_step(lambda n: simulate(cfg | {"steps": n}), steps)
    times["the rest (recording, loop)"] = total - sum(times.values())
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of the compiled grid")
    parser.add_argument("--eager-steps", type=int, default=400, help="steps of the eager vectorised run (extrapolated)")
    parser.add_argument("--plain-steps", type=int, default=50, help="steps of the plain loop (extrapolated)")
    parser.add_argument("--breakdown-steps", type=int, default=400, help="steps timed in the breakdown")
    parser.add_argument("--cold", action="store_true", help="turn off Inductor's on-disk caches: a cold compile")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.cold:
        from torch._inductor import config as inductor_config

        inductor_config.force_disable_caches = True
    cfg = load_config()["drift"]
    steps = cfg["steps"]
    print(
        f"default grid: {len(cfg['paths'])} paths x {len(cfg['settings'])} settings x {len(cfg['seeds'])} seeds x "
        f"{cfg['coords']} coordinates x {steps} steps; torch {torch.__version__}, {torch.get_num_threads()} thread"
    )

    step_args = step_arguments(cfg)
    _, compile_cpu, compile_wall = timed(compiled_step(), *step_args)
    print(
        f"compile (one-off, first call of the step{', caches off' if args.cold else ', on-disk cache allowed'}): "
        f"{compile_wall:6.2f} s wall ({compile_cpu:.2f} s CPU in this process)"
    )

    runs = [timed(simulate, cfg) for _ in range(args.repeats)]
    assert all(sim.compiled for sim, _, _ in runs)
    cpu = min(c for _, c, _ in runs)
    print(
        f"vectorised, compiled step (all paths, settings, seeds at once): {cpu:6.2f} s CPU "
        f"(median {statistics.median(c for _, c, _ in runs):.2f}; {min(w for _, _, w in runs):.2f} s wall), "
        f"{args.repeats} runs"
    )

    def extrapolated(label, fn, n):
        _, c, w = timed(fn, n)
        print(f"{label} {c * steps / n:6.2f} s CPU ({w * steps / n:.2f} s wall), {n} steps x{steps / n:g}")
        return c * steps / n

    eager = extrapolated(
        "vectorised, eager step (the fallback):        ",
        lambda n: simulate(cfg | {"steps": n}, compiled=False),
        args.eager_steps,
    )
    plain = extrapolated(
        "plain per-step loop per (path, setting, seed):", lambda n: plain_loop(cfg, n), args.plain_steps
    )
    print(
        f"speed-up of the compiled vectorised grid: {plain / cpu:.0f}x over the plain loop, {eager / cpu:.1f}x over "
        f"eager"
    )
    print(
        f"goal: under {GOAL_S:g} s of compute for the default grid on one core: "
        f"{'met' if cpu < GOAL_S else 'not met'} ({cpu:.2f} s)"
    )

    # the implementations agree: plain loop = vectorised on every deterministic path; compiled = eager on all
    finals, short = plain_loop(cfg, args.plain_steps), simulate(cfg | {"steps": args.plain_steps})
    for (name, j, k), total in finals.items():
        if PATHS[name].rounding == "nearest":
            assert torch.equal(short.final[name][k, j], total), (name, j, k)
    eager_short = simulate(cfg | {"steps": args.plain_steps}, compiled=False)
    assert all(torch.equal(short.final[name], eager_short.final[name]) for name in short.paths)

    print(f"breakdown, CPU per step of the whole grid ({args.breakdown_steps} steps each):")
    parts = breakdown(cfg, args.breakdown_steps)
    for name, seconds in parts.items():
        print(f"  {name:28s} {seconds * 1e6:6.0f} us/step  = {seconds * steps:5.2f} s over {steps} steps")
    print(f"  {'sum':28s} {sum(parts.values()) * 1e6:6.0f} us/step  = {sum(parts.values()) * steps:5.2f} s")


if __name__ == "__main__":
    main()
