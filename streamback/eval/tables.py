"""`streamback benchmark-table`: lm-eval's results of every run as two tables (rule benchmark_table).

- results/tables/benchmarks.csv, one row per run, task and metric: `run, shape, block, stream,
  task, metric, value, stderr, n` - lm-eval's value and standard error (empty where lm-eval has
  none, e.g. word perplexity), n the items scored. A metric under a filter other than lm-eval's
  `none` is named `metric,filter`.
- results/tables/benchmark_pairs.csv: every other run of a shape against the shape's baseline, per
  task and per metric whose per-item values are 0/1 (accuracies), on the same items
  (`streamback.eval.stats`): `diff` = value - baseline_value with a paired bootstrap interval
  (`ci_low`, `ci_high`), the items right in one run only (`baseline_only`, `run_only`), the exact
  McNemar p-value, the p-value after Holm's correction over the `tests` rows of the same shape and
  run, the smallest difference these items detect (`mdd`, at eval.pairs.power) and a verdict in words.

Only complete evaluations are read: results.json must parse and hold every task, each task's
samples file must hold its n items, and two runs are paired only on identical items (lm-eval's
doc_hash); anything else stops the command, naming the file.
"""

from __future__ import annotations

import argparse
import json
import math

import pandas as pd

from streamback import layout
from streamback.config import DEFAULT_CONFIG, add_config_arguments, load_config, section_from_args, section_from_json
from streamback.errors import StreambackError
from streamback.eval import stats
from streamback.io import read_json, write_csv
from streamback.runs import RunSpec, run_matrix

HELP = "aggregate lm-eval's results of every run (benchmarks.csv) and test each run against its shape's baseline (benchmark_pairs.csv)"

BENCHMARK_COLUMNS = ["run", "shape", "block", "stream", "task", "metric", "value", "stderr", "n"]
PAIR_COLUMNS = ["shape", "task", "metric", "baseline", "run", "stream", "n", "baseline_value", "value", "diff", "ci_low", "ci_high",
                "baseline_only", "run_only", "p_mcnemar", "p_holm", "tests", "mdd", "verdict"]


def read_results(run: str, tasks: list[str]) -> dict:
    """lm-eval's results of `run`, checked complete: {"results", "n": {task: items}, "samples": {task: [sample]}}."""
    path = layout.eval_results(run)
    rerun = f"evaluate the run again (rule evaluate, {run})"
    results = read_json(path, rerun)
    missing = [t for t in tasks if t not in results.get("results", {})]
    if missing:
        raise StreambackError(f"{path} has no results for {', '.join(missing)}: {rerun}")
    counts, samples = {}, {}
    for task in tasks:
        counts[task] = results["n-samples"][task]["effective"]
        sample_path = layout.eval_samples(run, task)
        try:
            samples[task] = [json.loads(line) for line in sample_path.read_text().splitlines() if line.strip()]
        except (OSError, json.JSONDecodeError) as err:
            raise StreambackError(f"{sample_path} cannot be read ({err}): {rerun}") from None
        if len(samples[task]) != counts[task]:
            raise StreambackError(f"{sample_path} holds {len(samples[task])} items, {path} says {counts[task]}: {rerun}")
    return {"results": results["results"], "n": counts, "samples": samples}


def benchmark_rows(spec: RunSpec, evaluation: dict, tasks: list[str]) -> list[dict]:
    rows = []
    for task in tasks:
        scores = evaluation["results"][task]
        for key, value in scores.items():
            if "," not in key or key.split(",")[0].endswith("_stderr"):
                continue
            metric, filt = key.split(",", 1)
            stderr = scores.get(f"{metric}_stderr,{filt}")
            rows.append({"run": spec.name, "shape": spec.shape, "block": spec.block, "stream": spec.stream, "task": task,
                         "metric": metric if filt == "none" else key, "value": _number(value), "stderr": _number(stderr),
                         "n": evaluation["n"][task]})
    return rows


def _number(value) -> float:
    return float(value) if isinstance(value, (int, float)) else math.nan


def per_item(samples: list[dict], metric: str) -> dict[int, float]:
    return {s["doc_id"]: s[metric] for s in samples}


def binary_metrics(samples: list[dict]) -> list[str]:
    """The metrics whose per-item values are all 0 or 1."""
    names = samples[0]["metrics"] if samples else []
    return [m for m in names if all(isinstance(s.get(m), (int, float)) and s[m] in (0, 1) for s in samples)]


def pair_rows(shape: str, base: str, other: RunSpec, evaluations: dict, tasks: list[str], pairs_cfg: dict) -> list[dict]:
    """The rows of `other` against the baseline run `base`, Holm-adjusted over themselves."""
    rows = []
    for task in tasks:
        a_samples, b_samples = evaluations[base]["samples"][task], evaluations[other.name]["samples"][task]
        a_hash, b_hash = ({s["doc_id"]: s["doc_hash"] for s in samples} for samples in (a_samples, b_samples))
        if a_hash != b_hash:
            raise StreambackError(f"task {task}: runs {base} and {other.name} were evaluated on different items "
                                  f"({layout.eval_samples(base, task)} vs {layout.eval_samples(other.name, task)}): evaluate both again")
        for metric in [m for m in binary_metrics(a_samples) if m in binary_metrics(b_samples)]:
            a_by_id, b_by_id = per_item(a_samples, metric), per_item(b_samples, metric)
            ids = sorted(a_by_id)
            a, b = [a_by_id[i] for i in ids], [b_by_id[i] for i in ids]
            diff, low, high = stats.paired_bootstrap_ci(a, b, pairs_cfg["confidence"], pairs_cfg["resamples"], pairs_cfg["seed"])
            only_a, only_b = stats.discordant(a, b)
            n = len(ids)
            rows.append({"shape": shape, "task": task, "metric": metric, "baseline": base, "run": other.name, "stream": other.stream,
                         "n": n, "baseline_value": sum(a) / n, "value": sum(b) / n, "diff": diff, "ci_low": low, "ci_high": high,
                         "baseline_only": only_a, "run_only": only_b, "p_mcnemar": stats.mcnemar_exact(only_a, only_b),
                         "mdd": stats.min_detectable_difference(n, (only_a + only_b) / n, pairs_cfg["alpha"], pairs_cfg["power"])})
    for row, adjusted in zip(rows, stats.holm([r["p_mcnemar"] for r in rows])):
        row.update(p_holm=adjusted, tests=len(rows))
        row["verdict"] = verdict(row, pairs_cfg)
    return rows


def verdict(row: dict, pairs_cfg: dict) -> str:
    """Whether the difference is distinguishable from noise, in plain words."""
    def points(x: float) -> str:
        return f"{100 * x:+.1f}"

    n, alpha, run = row["n"], pairs_cfg["alpha"], row["run"]
    interval = f"{pairs_cfg['confidence']:.0%} CI {points(row['ci_low'])} to {points(row['ci_high'])} points"
    if row["baseline_only"] + row["run_only"] == 0:
        text = f"no difference: both runs are right on exactly the same {n} items"
    elif row["p_holm"] <= alpha:
        text = (f"distinguishable from noise: {run} is {abs(100 * row['diff']):.1f} points {'better' if row['diff'] > 0 else 'worse'} "
                f"than {row['baseline']} ({interval}; exact McNemar p = {row['p_mcnemar']:.2g}, {row['p_holm']:.2g} after Holm over "
                f"{row['tests']} tests)")
    elif row["p_mcnemar"] <= alpha:
        text = (f"not distinguishable from noise once the {row['tests']} tests of {run} against {row['baseline']} are counted: "
                f"{points(row['diff'])} points ({interval}); p = {row['p_mcnemar']:.2g} alone, {row['p_holm']:.2g} after Holm")
    else:
        text = f"not distinguishable from noise: {points(row['diff'])} points ({interval}; exact McNemar p = {row['p_mcnemar']:.2g})"
    if math.isnan(row["mdd"]):
        return text + f"; {n} items are too few to detect any difference"
    if row["p_holm"] > alpha:
        text += f"; with {n} items a difference must be about {100 * row['mdd']:.1f} points to be detected {pairs_cfg['power']:.0%} of the time"
    return text


def tables(eval_cfg: dict, train_cfg: dict) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(benchmarks, benchmark_pairs) of every run of the matrix, from results/eval/<run>/."""
    runs, tasks = run_matrix(train_cfg), eval_cfg["tasks"]
    evaluations = {name: read_results(name, tasks) for name in runs}
    benchmarks = [row for name, spec in runs.items() for row in benchmark_rows(spec, evaluations[name], tasks)]
    baselines = {spec.shape: name for name, spec in runs.items() if spec.block == "baseline"}
    pairs = [row for spec in runs.values() if spec.block != "baseline" and spec.shape in baselines
             for row in pair_rows(spec.shape, baselines[spec.shape], spec, evaluations, tasks, eval_cfg["pairs"])]
    return pd.DataFrame(benchmarks, columns=BENCHMARK_COLUMNS), pd.DataFrame(pairs, columns=PAIR_COLUMNS)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser, "eval")
    parser.add_argument("--train-params", default=None, help="the 'train' section as a JSON object, for the run matrix (what the rule passes; default: from --config)")


def run(args: argparse.Namespace) -> int:
    eval_cfg = section_from_args(args, "eval")
    if args.train_params is not None:
        train_cfg = section_from_json(args.train_params, "train", "--train-params")
    else:
        train_cfg = load_config(args.config or DEFAULT_CONFIG)["train"]
    benchmarks, pairs = tables(eval_cfg, train_cfg)
    for name, frame in zip(layout.BENCHMARK_TABLES, (benchmarks, pairs)):
        write_csv(layout.table(name), frame)
        print(f"benchmark-table: wrote {layout.table(name)} ({len(frame)} rows)")
    for row in pairs.itertuples():
        print(f"{row.shape} {row.task} {row.metric}: {row.run} vs {row.baseline}: {row.verdict}")
    return 0
