"""`streamback drift`: simulate the running sums (`streamback.drift.simulate`) and write the tables,
figures and page (`streamback.drift.report`) under --outdir (default results/drift)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from streamback import layout
from streamback.config import add_config_arguments, section_from_args
from streamback.drift.report import how, write_outputs
from streamback.drift.simulate import simulate

HELP = "simulate the drift of a long running sum kept in fp32, bf16 (nearest, stochastic, Kahan), fp16 and fp8"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser, "drift")
    parser.add_argument(
        "--outdir", type=Path, default=layout.DRIFT_DIR, help=f"directory for the outputs (default: {layout.DRIFT_DIR})"
    )


def run(args: argparse.Namespace) -> int:
    cfg = section_from_args(args, "drift")
    began = time.perf_counter()
    sim = simulate(cfg)
    seconds = time.perf_counter() - began
    print(
        f"drift: {len(sim.paths)} paths x {len(cfg['settings'])} settings x {len(cfg['seeds'])} seeds x "
        f"{cfg['coords']} coordinates x {cfg['steps']} steps in {seconds:.1f} s ({how(sim)})"
        + "".join(f"\ndrift: {name} {reason}" for name, reason in sim.skipped.items())
    )
    write_outputs(cfg, sim, args.outdir, seconds)
    print(
        f"drift: wrote {', '.join(layout.DRIFT_FILES.values())} and {len(layout.DRIFT_FIGURES)} figures (.svg, .png) "
        f"to {args.outdir}"
    )
    return 0
