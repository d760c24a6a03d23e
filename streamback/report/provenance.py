"""What was run, for the study page: the config files and a hash of the merged config, the code's
commit, package versions, the hardware, every run's completion record, and the time each stage took
(Snakemake's `benchmark:` records of its jobs)."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path

import pandas as pd

PACKAGES = (
    "torch",
    "snakemake",
    "lm_eval",
    "transformers",
    "datasets",
    "tokenizers",
    "pandas",
    "altair",
    "vl-convert-python",
)


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def config_hash(config: dict) -> str:
    """sha256 of the merged, validated config as canonical JSON: equal hashes, equal studies."""
    return hashlib.sha256(json.dumps(config, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def git_commit(root: Path) -> str:
    """The checkout's commit, with a warning when its files differ from it; or why there is none."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return commit + (" (with uncommitted changes)" if dirty else "")


def package_versions() -> dict[str, str]:
    """streamback's and the main packages' versions, "not installed" where absent."""
    versions = {"python": platform.python_version()}
    for name in ("streamback", *PACKAGES):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def this_machine() -> str:
    """The CPU model, its cores and memory, of the machine writing the page."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
        mem = (
            int(next(x for x in Path("/proc/meminfo").read_text().splitlines() if x.startswith("MemTotal")).split()[1])
            / 2**20
        )
        memory = f", {mem:.0f} GiB memory"
    except (OSError, StopIteration, ValueError):
        memory = ""
    return f"{model}, {os.cpu_count()} cores{memory} ({platform.system()} {platform.release()})"


def runs_table(summaries: dict[str, dict]) -> pd.DataFrame:
    """One row per trained run from its summary.json: what it is, how far it went, its losses and cost."""
    rows = []
    for run, s in summaries.items():
        rows.append(
            {
                "run": run,
                "shape": s["shape"],
                "block": s["block"],
                "stream": s["stream"],
                "seed": s.get("seed"),
                "parameters": s["params"],
                "tokens": s["tokens"],
                "steps": s["steps"],
                "final loss": s.get("final_loss"),
                "final val loss": s.get("final_val_loss"),
                "device": s.get("device_name") or s.get("device"),
                "processes": s.get("processes"),
                "train time (s)": s.get("train_seconds"),
                "GPU-hours": s.get("gpu_hours"),
            }
        )
    table = pd.DataFrame(rows)
    return table.round({"final loss": 4, "final val loss": 4, "train time (s)": 1, "GPU-hours": 2})


def stage_times(timings: dict[str, list[Path]]) -> pd.DataFrame:
    """Per stage (rule): its jobs, their summed wall-clock and CPU seconds, from Snakemake's
    benchmark files (a TSV per job with columns `s` and `cpu_time`)."""
    rows = []
    for rule, files in timings.items():
        tables = [pd.read_csv(f, sep="\t") for f in files if Path(f).exists()]
        if not tables:
            continue
        t = pd.concat(tables)
        rows.append(
            {
                "stage": rule,
                "jobs": len(tables),
                "wall time (s)": round(float(t["s"].sum()), 1),
                "CPU time (s)": round(float(t["cpu_time"].sum()), 1),
            }
        )
    return pd.DataFrame(rows, columns=["stage", "jobs", "wall time (s)", "CPU time (s)"])
