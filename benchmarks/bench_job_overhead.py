"""The fixed cost of a job: a train and an evaluate job of the default study, wall time against
the work they are there for.

    PYTHONPATH=. python benchmarks/bench_job_overhead.py [--run tiny-fat-short-baseline] [--repeat 2]

Builds, in a fresh working directory, what one run needs (`snakemake` on the default config: the
corpus, its tokens, the local tasks), then runs its train and evaluate jobs `--repeat` times each
(forced, one at a time; train from its first step). Per job it prints Snakemake's wall time (its benchmark record), the
work (train: the steps' seconds that summary.json records; evaluate: the seconds from loading
the model to the last score, which the log states) and the difference, the fixed cost; and,
apart, the seconds a bare process takes to import each stage's module.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from streamback import layout  # noqa: E402


def snakemake(workdir: Path, *args: str) -> None:
    cmd = [
        sys.executable,
        "-m",
        "snakemake",
        "-s",
        str(ROOT / "Snakefile"),
        "--directory",
        str(workdir),
        "--cores",
        "2",
        *args,
    ]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"snakemake {' '.join(args)} failed:\n{proc.stderr[-3000:]}")


def wall_seconds(workdir: Path, rule: str, run: str) -> float:
    with open(workdir / layout.timing_file(rule, run)) as f:
        return float(next(csv.DictReader(f, delimiter="\t"))["s"])


def import_seconds(module: str) -> float:
    """A fresh process's time to import `module` (the median of three), less a bare interpreter's."""

    def timed(code: str) -> float:
        began = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)
        return time.perf_counter() - began

    return statistics.median(timed(f"import {module}") for _ in range(3)) - statistics.median(
        timed("pass") for _ in range(3)
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", default="tiny-fat-short-baseline", help="a run of the default config's matrix")
    parser.add_argument("--repeat", type=int, default=2, help="times each job runs (forced)")
    parser.add_argument(
        "--workdir", type=Path, default=None, help="the working directory (default: a new temporary one)"
    )
    args = parser.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="job-overhead-"))
    results = str(layout.eval_results(args.run))
    snakemake(workdir, results)  # data, tasks, the run and its evaluation, once
    rows = []
    for _ in range(args.repeat):
        shutil.rmtree(workdir / layout.checkpoint_dir(args.run))  # else the run resumes at its end and trains nothing
        snakemake(
            workdir, str(layout.model_file(args.run)), "--forcerun", "train"
        )  # the target first: --forcerun takes a list
        work = json.loads((workdir / layout.summary_file(args.run)).read_text())["train_seconds"]
        rows.append(("train", wall_seconds(workdir, "train", args.run), work))
        snakemake(workdir, results, "--forcerun", "evaluate")
        log = (workdir / "logs" / "evaluate" / f"{args.run}.log").read_text()
        work = float(re.search(rf"evaluate: {re.escape(args.run)} in ([0-9.]+) s", log).group(1))
        rows.append(("evaluate", wall_seconds(workdir, "evaluate", args.run), work))
    print(f"{args.run} in {workdir} (2 cores)")
    print(f"{'job':<10}{'wall s':>9}{'work s':>9}{'fixed s':>9}")
    for job, wall, work in rows:
        print(f"{job:<10}{wall:>9.2f}{work:>9.2f}{wall - work:>9.2f}")
    for job in ("train", "evaluate"):
        fixed = [wall - work for j, wall, work in rows if j == job]
        print(f"{job}: fixed cost, median of {len(fixed)}: {statistics.median(fixed):.2f} s")
    for module in ("torch", "streamback.train.trainer", "lm_eval", "streamback.eval.stage"):
        print(f"import {module}: {import_seconds(module):.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
