"""A finished study's preflights against its training: kernels and tokens/s, arm by arm (issue 37).

For each preflight record (`results/preflight/<arm>.json`): the kernels it names against those
of its arm's runs (`summary.json`), and its tokens/s (the `speed` check: the median of its timed
steps) against the median over the arm's runs of each run's median `tokens_per_s` over its steps
(`metrics.jsonl`). Prints one row per arm and the count within 10%. Read-only: it runs nothing,
so the figures are those of the machine and load the study ran under (two train jobs at once on
two cores in the default study).

Beside each arm, from the same study, the noise floor no preflight of its length can beat: the
spread of the arm's runs (max - min over their median; "-" for one run), and the window: the
run's own first steps, the very steps the preflight repeats, timed as the preflight times them
(`timed_tokens_per_s` over the record's `timed_steps` after the warm-up), against that run's
median, the largest gap over the arm's runs.

    PYTHONPATH=. python benchmarks/bench_preflight_speed.py [STUDY_DIR]   # default: this checkout
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from streamback import layout
from streamback.preflight.probe import WARMUP_STEPS, timed_tokens_per_s
from streamback.runs import seed_suffix
from streamback.train.metrics import read_metrics

WITHIN = 0.10  # issue 37's goal: a preflight's tokens/s within 10% of its runs'


def arm_rows(study: Path) -> list[dict]:
    rows = []
    for record_path in sorted((study / layout.PREFLIGHT_DIR).glob("*.json")):
        record = json.loads(record_path.read_text())
        arm = record["arm"]
        speed = next(c for c in record["checks"] if c["name"] == "speed")["values"]
        runs = []
        for summary_path in sorted((study / layout.run_dir(arm)).parent.glob("*/summary.json")):
            summary = json.loads(summary_path.read_text())
            base_seed = json.loads((study / layout.recipe_file(summary["run"])).read_text())["train"]["seed"]
            if summary["run"] != arm + seed_suffix(summary["seed"], base_seed):  # a run of another arm
                continue
            steps = [r for r in read_metrics(summary_path.parent / "metrics.jsonl") if "tokens_per_s" in r]
            median = statistics.median(r["tokens_per_s"] for r in steps)
            window, _ = timed_tokens_per_s(steps[: WARMUP_STEPS + speed["timed_steps"]])
            runs.append(
                {"run": summary["run"], "kernels": summary["kernels"], "median": median, "window": window / median - 1}
            )
        if not runs:
            continue
        medians = [r["median"] for r in runs]
        run_median = statistics.median(medians)
        rows.append(
            {
                "arm": arm,
                "runs": len(runs),
                "kernels_match": all(r["kernels"] == record["kernels"] == speed["kernels"] for r in runs),
                "kernels": record["kernels"],
                "preflight": speed["tokens_per_s"],
                "runs_median": run_median,
                "ratio": speed["tokens_per_s"] / run_median - 1,
                "runs_within": sum(abs(speed["tokens_per_s"] / r["median"] - 1) <= WITHIN for r in runs),
                "spread": (max(medians) - min(medians)) / run_median if len(runs) > 1 else None,
                "window": max((r["window"] for r in runs), key=abs),
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("study", nargs="?", type=Path, default=Path("."), help="a finished study's directory")
    args = parser.parse_args()
    rows = arm_rows(args.study)
    if not rows:
        raise SystemExit(f"{args.study}: no preflight record with trained runs under {layout.PREFLIGHT_DIR}")
    print(
        f"{'arm':40} {'runs':>4} {'kernels same':>12} {'preflight tok/s':>15} {'runs median':>11} {'diff':>7} "
        f"{'runs spread':>11} {'window':>7}"
    )
    for r in rows:
        spread = "-" if r["spread"] is None else f"{r['spread']:.1%}"
        print(
            f"{r['arm']:40} {r['runs']:>4} {str(r['kernels_match']):>12} {r['preflight']:>15,.0f} "
            f"{r['runs_median']:>11,.0f} {r['ratio']:>+7.1%} {spread:>11} {r['window']:>+7.1%}"
        )
    arms = sum(abs(r["ratio"]) <= WITHIN for r in rows)
    runs_within, runs = sum(r["runs_within"] for r in rows), sum(r["runs"] for r in rows)
    kernels = sum(r["kernels_match"] for r in rows)
    print(
        f"kernels: {kernels} of {len(rows)} arms name their runs' kernels ({rows[0]['kernels']}); tokens/s within "
        f"{WITHIN:.0%} of the arm's median: {arms} of {len(rows)} arms, {runs_within} of {runs} runs; the noise floor: "
        f"the runs of one arm differ by up to {max((r['spread'] or 0) for r in rows):.1%}, a run's own timed window "
        f"lies up to {max(abs(r['window']) for r in rows):.1%} from its median"
    )


if __name__ == "__main__":
    main()
