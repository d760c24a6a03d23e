"""`streamback preflight-table`: every arm's passed preflight in one table, and the whole matrix's
projected cost against `train.budget_gpu_hours` and the tiers table's `train.stated_gpu_hours`.

One row per arm: the checked run, its device, tokens/s, the projected hours of one run and of
the arm's runs (one per seed; the seeds of an arm train alike), and each check's status. The
matrix's projection is the sum of the arms'. Over the budget, or over STATED_SHARE times the
stated cost, it prints one line per failed check (the projection, the bound, the costliest arm),
writes no table, removes the matrix's gate (`--gate`) and exits 1; passed, it writes `passed` to
the gate where it does not say so already. Where a budget or a stated cost is set, every train job
waits for that gate (results/preflight/matrix.pass): nothing trains over budget.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from streamback import layout
from streamback.config import add_config_arguments, section_from_args
from streamback.io import read_json, write_csv, write_if_changed
from streamback.runs import run_matrix

HELP = (
    "one table of every arm's preflight, and the whole matrix's projected cost against the budget and the stated cost"
)
STATED_SHARE = 1.5  # a projection over one and a half times the tiers table's cost says the table misleads its reader
CHECKS = ("disk", "stream_dtype", "losses", "speed", "budget", "memory", "resume", "shadow")
EXIT_FAILED = 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser, "train")
    parser.add_argument(
        "--records",
        type=Path,
        nargs="+",
        required=True,
        help="the arms' preflight records (results/preflight/<arm>.json)",
    )
    parser.add_argument("--out", type=Path, default=None, help="the table (default: results/tables/preflights.csv)")
    parser.add_argument(
        "--gate",
        type=Path,
        default=None,
        help="the matrix's verdict the train jobs wait for (results/preflight/matrix.pass), written where it changes "
        "(default: none)",
    )


def run(args: argparse.Namespace) -> int:
    train_cfg = section_from_args(args, "train")
    table = preflight_table(
        {path: read_json(path, "run `snakemake preflight` again") for path in args.records}, train_cfg
    )
    problems = matrix_problems(table, train_cfg)
    for problem in problems:
        print(f"preflight matrix: FAILED {problem}", file=sys.stderr)
    if problems:
        if args.gate is not None:
            args.gate.unlink(missing_ok=True)
        return EXIT_FAILED
    write_csv(args.out or layout.table(layout.PREFLIGHT_TABLE), table)
    if args.gate is not None:
        write_if_changed(args.gate, layout.PASSED)
    hours = table.arm_hours.sum()
    print(
        f"preflight matrix: PASS: {len(table)} arms, {int(table.runs.sum())} runs, projected {hours:,.2f} "
        f"{table.unit.iloc[0]}"
    )
    return 0


def preflight_table(records: dict, train_cfg: dict) -> pd.DataFrame:
    """One row per record (columns: arm, run, runs, device, processes, tokens_per_s, run_hours, arm_hours,
    unit, each check's status, created)."""
    arms = {}
    for spec in run_matrix(train_cfg).values():
        arms[spec.arm] = arms.get(spec.arm, 0) + 1
    rows = []
    for path, record in records.items():
        checks = {c["name"]: c for c in record["checks"]}
        speed = checks["speed"]["values"]
        runs = arms.get(record["arm"], 0)
        rows.append(
            {
                "arm": record["arm"],
                "run": record["run"],
                "runs": runs,
                "device": record["device"],
                "processes": record["processes"],
                "tokens_per_s": speed["tokens_per_s"],
                "run_hours": speed["projected_hours"],
                "arm_hours": runs * speed["projected_hours"],
                "unit": record["unit"],
                **{name: checks[name]["status"] if name in checks else "" for name in CHECKS},
                "created": record["created"],
            }
        )
    return pd.DataFrame(
        rows,
        columns=[
            "arm",
            "run",
            "runs",
            "device",
            "processes",
            "tokens_per_s",
            "run_hours",
            "arm_hours",
            "unit",
            *CHECKS,
            "created",
        ],
    )


def matrix_problems(table: pd.DataFrame, train_cfg: dict) -> list[str]:
    """One line per failed matrix check (budget, stated cost), naming the figure, the bound and the
    arm that costs most."""
    hours, unit = table.arm_hours.sum(), table.unit.iloc[0] if len(table) else "GPU-hours"
    if len(table):
        top = table.loc[table.arm_hours.idxmax()]
        costliest = f"; the costliest arm: {top.arm}, {top.arm_hours:,.2f} {unit} ({int(top.runs)} runs)"
    else:
        costliest = ""
    problems = []
    budget, stated = train_cfg["budget_gpu_hours"], train_cfg["stated_gpu_hours"]
    if budget is not None and hours > budget:
        problems.append(
            f"budget: projected {hours:,.2f} {unit} for the matrix (bound: train.budget_gpu_hours {budget:,.2f})"
            + costliest
        )
    if stated is not None and hours > STATED_SHARE * stated:
        problems.append(
            f"stated cost: projected {hours:,.2f} {unit} for the matrix (bound: {STATED_SHARE:g} x the tiers table's "
            f"{stated:,.2f}, train.stated_gpu_hours)" + costliest
        )
    return problems
