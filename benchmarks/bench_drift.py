"""Time the drift simulation: the vectorised default grid against a plain per-step Python loop.

The vectorised run is `streamback.drift.simulate` on the default config's `drift` section: every
path, setting and seed advances together, one Python iteration per step. The plain loop runs
each (path, setting, seed) on its own 4096-coordinate vector, step by step, with the same
`advance` and the same noise, over `--plain-steps` steps, and its time is extrapolated linearly
to the full step count (it is too slow to run whole). Both run on one core; times are CPU
seconds of this process (on one thread, the compute, unaffected by other jobs sharing the
machine) with wall-clock seconds beside them. A per-path breakdown shows where the time goes.

    python benchmarks/bench_drift.py [--plain-steps 100] [--breakdown-steps 200]
"""

from __future__ import annotations

import argparse
import time

import torch

from streamback.config import load_config
from streamback.drift import PATHS, advance, rounding_seed, simulate, skip_reason, start_value


def plain_loop(cfg: dict, steps: int) -> dict:
    """Each (path, setting, seed) separately, one [coords] vector, `steps` steps; final values."""
    finals = {}
    sr_gen = torch.Generator().manual_seed(rounding_seed(cfg["seeds"]))
    for name, path in PATHS.items():
        if name not in cfg["paths"] or skip_reason(path, cfg["start"]):
            continue
        for j, s in enumerate(cfg["settings"]):
            mu, sigma = torch.tensor(s["mu"]), torch.tensor(s["sigma"])
            for k, seed in enumerate(cfg["seeds"]):
                gen = torch.Generator().manual_seed(seed)
                total = torch.full((cfg["coords"],), start_value(path, cfg["start"]))
                comp = torch.zeros(cfg["coords"]) if path.compensated else None
                for _ in range(steps):
                    update = mu + sigma * torch.randn(cfg["coords"], generator=gen)
                    total, comp = advance(path, total, comp, update, sr_gen)
                finals[name, j, k] = total
    return finals


def timed(fn, *args):
    """(result, CPU seconds, wall seconds) of fn(*args)."""
    cpu, wall = time.process_time(), time.perf_counter()
    result = fn(*args)
    return result, time.process_time() - cpu, time.perf_counter() - wall


def breakdown(cfg: dict, steps: int) -> dict[str, float]:
    """CPU seconds per step of each path's `advance` on the whole [seeds, settings, coords] batch."""
    shape = (len(cfg["seeds"]), len(cfg["settings"]), cfg["coords"])
    update = 0.2 + 0.5 * torch.randn(shape)
    gen = torch.Generator().manual_seed(0)
    times = {}
    gens = [torch.Generator().manual_seed(s) for s in cfg["seeds"]]
    z = torch.empty(len(cfg["seeds"]), cfg["coords"])
    began = time.process_time()
    for _ in range(steps):
        for k, g in enumerate(gens):
            torch.randn(cfg["coords"], generator=g, out=z[k])
    times["noise (randn per seed)"] = (time.process_time() - began) / steps
    for name, path in PATHS.items():
        if name not in cfg["paths"] or skip_reason(path, cfg["start"]):
            continue
        total = torch.full(shape, start_value(path, cfg["start"]))
        comp = torch.zeros(shape) if path.compensated else None
        began = time.process_time()
        for _ in range(steps):
            total, comp = advance(path, total, comp, update, gen)
        times[name] = (time.process_time() - began) / steps
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plain-steps", type=int, default=100, help="steps the plain loop runs before extrapolating")
    parser.add_argument("--breakdown-steps", type=int, default=200, help="steps timed per path in the breakdown")
    args = parser.parse_args()
    torch.set_num_threads(1)
    cfg = load_config()["drift"]
    steps = cfg["steps"]
    grid = (f"{len(cfg['paths'])} paths x {len(cfg['settings'])} settings x {len(cfg['seeds'])} seeds x "
            f"{cfg['coords']} coordinates x {steps} steps")
    print(f"default grid: {grid}; torch {torch.__version__}, {torch.get_num_threads()} thread")

    _, cpu, wall = timed(simulate, cfg)
    print(f"vectorised (all paths, settings, seeds at once): {cpu:6.2f} s CPU ({wall:.2f} s wall)")
    finals, plain_cpu, plain_wall = timed(plain_loop, cfg, args.plain_steps)
    scale = steps / args.plain_steps
    print(f"plain per-step loop per (path, setting, seed):   {plain_cpu * scale:6.2f} s CPU ({plain_wall * scale:.2f} s wall), "
          f"timed over {args.plain_steps} steps and extrapolated x{scale:g}")
    print(f"speed-up of the vectorised grid: {plain_cpu * scale / cpu:.1f}x; goal: under 1 s of compute")

    # the two implementations agree on every deterministic path after the plain loop's steps
    short = simulate(cfg | {"steps": args.plain_steps})
    for (name, j, k), total in finals.items():
        if PATHS[name].rounding == "nearest":
            assert torch.equal(short.final[name][k, j], total), (name, j, k)

    print(f"breakdown, CPU per step on the whole batch ({args.breakdown_steps} steps each):")
    per_step = breakdown(cfg, args.breakdown_steps)
    for name, seconds in per_step.items():
        print(f"  {name:24s} {seconds * 1e6:8.0f} us/step  = {seconds * steps:6.2f} s over {steps} steps")
    print(f"  {'sum':24s} {sum(per_step.values()) * 1e6:8.0f} us/step  = {sum(per_step.values()) * steps:6.2f} s")


if __name__ == "__main__":
    main()
