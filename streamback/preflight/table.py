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
import getpass
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd

from streamback import layout, sizes
from streamback.config import add_config_arguments, section_from_args, validate_config
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
        "--disk-config",
        default=None,
        help="the config sections the matrix's disk check reads, as JSON (jobs.preflight_disk; default: no disk check)",
    )
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
    if args.disk_config is not None:
        records = {r["arm"]: r for r in (read_json(p, "run `snakemake preflight` again") for p in args.records)}
        problems += disk_problems(validate_config(json.loads(args.disk_config)), records)
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


# ---- the matrix's disk ---------------------------------------------------------------------------------------

GB = 10**9
CHECKPOINT_BYTES_PER_PARAM = 12  # fp32 weights and AdamW's two moments (the preflight's own estimate)


def matrix_disk_needs(config: dict, records: dict, vocab: int) -> dict[Path, tuple[int, str]]:
    """What the whole matrix will write at its peak, by directory -> (bytes, what): every run's checkpoints
    (train.checkpoint.keep and the one being written: under Slurm every run can train at once, and a finished
    run keeps its last ones), its final fp32 model and eval.last_checkpoints - 1 snapshots, the exports of
    analysis.public_models, and the token shards still to be written (data.train_tokens + val_tokens at the
    shards' bytes a token, less those already there). A preflight record's measured checkpoint replaces the
    estimate of its arm's."""
    train, runs = config["train"], run_matrix(config["train"])
    keep = train["checkpoint"]["keep"] + 1
    snapshots = max(config["eval"]["last_checkpoints"] - 1, 0)
    checkpoints = models = 0
    for spec in runs.values():
        params = sizes.shape_of(config["model"], spec.shape, vocab).params
        disk = next((c for c in records.get(spec.arm, {}).get("checks", []) if c["name"] == "disk"), None)
        measured = disk["values"].get("checkpoint_bytes") if disk else None
        checkpoints += keep * max(CHECKPOINT_BYTES_PER_PARAM * params, measured or 0)
        models += (1 + snapshots) * 4 * params
    needs: dict[Path, tuple[int, str]] = {
        layout.CHECKPOINTS_DIR: (checkpoints, f"{len(runs)} runs x {keep} checkpoints"),
        layout.RESULTS / "runs": (models, f"{len(runs)} final models and {snapshots} snapshots each"),
    }
    exports = [d for d in (config["analysis"]["public_models"] or {}).values() if d is not None]
    for directory in exports:
        run = Path(directory).name
        if run in runs and Path(directory) == layout.hf_dir(run):
            params = sizes.shape_of(config["model"], runs[run].shape, vocab).params
            needs[layout.hf_dir(run)] = (4 * params, f"the export of {run}")
    data = config["data"]
    tokens = (data["train_tokens"] or 0) + (data["val_tokens"] or 0)
    if tokens:
        shards = layout.tokens_dir(data)
        there = sum(f.stat().st_size for f in shards.glob("*.bin")) if shards.is_dir() else 0
        width = 2 if vocab <= 1 << 16 else 4  # uint16 or uint32 tokens (streamback/data/shards.py)
        needs[shards] = (max(tokens * width - there, 0), f"{tokens:,} tokens of {width} bytes, less those written")
    return needs


def parse_lfs_quota(text: str) -> int | None:
    """The bytes still allowed by `lfs quota -u USER PATH`'s output (its documented table: kbytes, quota, limit,
    grace, files, ... in KiB; an over-quota figure carries a '*'; a long file system name puts the figures on the
    next line): the smaller nonzero of quota and limit less the used, or None where neither is set."""
    lines = [line.split() for line in text.splitlines() if line.strip()]
    header = next((i for i, words in enumerate(lines) if words and words[0] == "Filesystem"), None)
    if header is None:
        return None
    words = [w for line in lines[header + 1 :] for w in line]
    if len(words) < 4:
        return None
    figures = [w.rstrip("*") for w in words[1:4]]
    used, quota, limit = (int(f) if f.isdigit() else 0 for f in figures)
    bounds = [b for b in (quota, limit) if b > 0]
    return max(min(bounds) - used, 0) * 1024 if bounds else None


def lfs_quota(path: Path, run=None) -> tuple[int | None, str]:
    """(bytes the user's Lustre quota still allows under `path`, how it was seen): `lfs quota -u $USER` where
    `lfs` exists; (None, why) where no quota could be seen."""
    if shutil.which("lfs") is None:
        return None, "no quota seen (no lfs: not Lustre, or its client tools are not installed)"
    run = run or subprocess.run
    try:
        done = run(["lfs", "quota", "-u", getpass.getuser(), str(path)], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as err:
        return None, f"no quota seen (lfs quota: {err})"
    left = parse_lfs_quota(done.stdout) if done.returncode == 0 else None
    return left, ("lfs quota" if left is not None else "no quota seen (lfs quota reported none)")


def _existing(path: Path) -> Path:
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return Path(".")


def matrix_disk(needs: dict[Path, tuple[int, str]], disk_usage=None, quota=lfs_quota) -> list[dict]:
    """One entry per file system that `needs` writes on (directories on one are summed): its free space
    (`disk_usage(path).free`), the quota left where `quota` sees one (the smaller counts), the needed bytes,
    passed, the shortfall and what the figures are."""
    disk_usage = disk_usage or shutil.disk_usage
    groups: dict = {}
    for path, (nbytes, what) in needs.items():
        where = _existing(Path(path))
        try:
            device = os.stat(where).st_dev
        except OSError:
            device = str(where)
        group = groups.setdefault(device, {"paths": [], "where": where, "needed": 0, "what": []})
        group["paths"].append(str(path))
        group["needed"] += nbytes
        group["what"].append(f"{path}: {nbytes / GB:,.1f} GB ({what})")
    out = []
    for group in groups.values():
        free = disk_usage(group["where"]).free
        left, seen = quota(group["where"])
        room = free if left is None else min(free, left)
        shortfall = max(group["needed"] - room, 0)
        out.append(
            {
                "path": ", ".join(group["paths"]),
                "free_bytes": room,
                "needed_bytes": group["needed"],
                "passed": shortfall == 0,
                "shortfall_bytes": shortfall,
                "basis": f"{free / GB:,.1f} GB free; {seen}"
                + (f" ({left / GB:,.1f} GB left)" if left is not None else "")
                + "; "
                + "; ".join(group["what"]),
            }
        )
    return out


def disk_problems(config: dict, records: dict, disk_usage=None, quota=lfs_quota) -> list[str]:
    """One line per file system the matrix will not fit on at its peak, naming the path and the shortfall."""
    vocab = sizes.vocab_of(config)
    lines = []
    for entry in matrix_disk(matrix_disk_needs(config, records, vocab), disk_usage, quota):
        if not entry["passed"]:
            lines.append(
                f"disk: the matrix needs {entry['needed_bytes'] / GB:,.1f} GB at its peak under {entry['path']}, "
                f"{entry['shortfall_bytes'] / GB:,.1f} GB more than the {entry['free_bytes'] / GB:,.1f} GB there "
                f"({entry['basis']}): free space, or move them (data.dir; results/ as a link)"
            )
    return lines
