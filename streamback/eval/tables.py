"""`streamback benchmark-table`: lm-eval's results of every run as two tables (rule benchmark_table).

- results/tables/benchmarks.csv, one row per run, task, filter and metric: `run, shape, block,
  stream, seed, task, filter, metric, value, stderr, n, chance` - lm-eval's value and standard
  error (empty where lm-eval has none, e.g. word perplexity), n the items scored, the run's
  training seed, and the accuracy of answering without reading the item (`chance`: 1 / the
  choices of a multiple-choice item, the most frequent answer's share for a cloze; empty
  elsewhere). `filter` is lm-eval's: `none` for most tasks, each of the task's `filter_list`
  otherwise (gsm8k: strict-match, flexible-extract). `checkpoints`, `checkpoint_mean`,
  `checkpoint_sd`: the run's last checkpoints scored (eval.last_checkpoints; 1: the final model
  alone), their mean and their sd (np.std, ddof 0, as signal-and-noise; empty for one): the
  score's within-run noise.
- results/tables/benchmark_checkpoints.csv (eval.last_checkpoints > 1): every run's
  checkpoints.csv, `run, step, task, filter, metric, value`, the final step's values checked to be
  results.json's (task_snr.csv's noise: `streamback.report.seeds`).
- results/tables/benchmark_pairs.csv: every other run of a shape against the shape's baseline of
  the same training seed (`comparison` names it the same for every seed: `streamback`,
  `streamback-mxfp8`), per task, filter and metric whose per-item values are 0/1 (accuracies), on
  the same items under that filter (`streamback.stats`): `diff` = value - baseline_value with a
  paired bootstrap interval (`ci_low`, `ci_high`), the items right in one run only
  (`baseline_only`, `run_only`), the exact McNemar p-value, the p-value after Holm's correction
  over the `tests` rows of the same shape and run (every task, filter and 0/1 metric of that
  comparison; `family` lists them), the smallest difference these items detect (`mdd`, at
  eval.pairs.power) and a verdict in words. Then, per comparison, task, filter and metric, a row
  over the seeds (seed `all`): the mean difference with its t interval over seeds (`ci_low`,
  `ci_high`) and a bootstrap over seeds then items (`boot_low`, `boot_high`), the seeds' sd of
  the difference and the baseline's own (`baseline_sd`, the noise floor), the exact sign-flip p
  (`p_seeds`, never below 2 / 2^seeds) Holm-adjusted over the comparison's rows over seeds, the
  minimum detectable effect over the seeds at eval.pairs.power and alpha (`mde`: from the seeds'
  sd, never below the items' own noise `within_se`), the seeds eval.pairs.target would take at
  that spread (`seeds_for_target`), and a verdict against the seed-to-seed spread (one seed: that
  training randomness is not covered).

Only complete evaluations are read (`read_results`): results.json must parse and hold every task
with its item count and every metric under every filter, each task's samples file must hold its n
items under each filter, each with its doc_id, doc_hash and metrics, and two runs are paired only
on identical items (lm-eval's doc_hash); anything else stops the command, naming the file and the
rule to rerun, so no row is ever left out silently.
"""

from __future__ import annotations

import argparse
import json
import math
from collections import Counter

import numpy as np
import pandas as pd

from streamback import layout, stats
from streamback.config import DEFAULT_CONFIG, add_config_arguments, load_config, section_from_args, section_from_json
from streamback.errors import StreambackError
from streamback.io import read_json, write_csv
from streamback.runs import RunSpec, comparison_name, comparisons, run_matrix

HELP = (
    "aggregate lm-eval's results of every run (benchmarks.csv) and test each run against its shape's baseline "
    "(benchmark_pairs.csv)"
)

BENCHMARK_COLUMNS = [
    "run",
    "shape",
    "block",
    "stream",
    "seed",
    "task",
    "filter",
    "metric",
    "value",
    "stderr",
    "n",
    "chance",
    "checkpoints",
    "checkpoint_mean",
    "checkpoint_sd",
]
CHECKPOINT_COLUMNS = ["run", "step", "task", "filter", "metric", "value"]
PAIR_COLUMNS = [
    "shape",
    "comparison",
    "seed",
    "task",
    "filter",
    "metric",
    "baseline",
    "run",
    "stream",
    "n",
    "baseline_value",
    "value",
    "diff",
    "ci_low",
    "ci_high",
    "boot_low",
    "boot_high",
    "seeds",
    "sd",
    "baseline_sd",
    "baseline_only",
    "run_only",
    "p_mcnemar",
    "p_seeds",
    "p_holm",
    "tests",
    "family",
    "mdd",
    "within_se",
    "sd_low",
    "sd_high",
    "mde",
    "mde_low",
    "mde_high",
    "target",
    "seeds_for_target",
    "seeds_for_target_low",
    "seeds_for_target_high",
    "verdict",
]
SAMPLE_KEYS = ("doc_id", "doc_hash", "filter")  # what pairing reads of each sample, besides its metrics


def read_results(run: str, tasks: list[str]) -> dict:
    """lm-eval's results of `run`, checked complete: {"results", "n": {task: items}, "filters": {task:
    [filter]}, "metrics": {task: [metric]}, "samples": {task: {filter: [sample]}}}. Every metric lm-eval
    reports for a task (its higher_is_better) must have a value under every filter of the task
    (its config's filter_list, else lm-eval's `none`), and each filter's samples must be the n items,
    each with its doc_id, doc_hash and metrics; anything missing names the file and how to rerun."""
    path = layout.eval_results(run)
    rerun = f"evaluate the run again (rule evaluate: snakemake --forcerun {path})"
    results = read_json(path, rerun)
    for key in ("results", "n-samples", "configs", "higher_is_better"):
        if not isinstance(results.get(key) if isinstance(results, dict) else None, dict):
            raise StreambackError(f"{path} has no {key!r}: not a whole lm-eval results file: {rerun}")
    missing = [t for t in tasks if t not in results["results"]]
    if missing:
        raise StreambackError(f"{path} has no results for {', '.join(missing)}: {rerun}")
    out = {"results": results["results"], "n": {}, "filters": {}, "metrics": {}, "samples": {}, "output_type": {}}
    for task in tasks:
        try:
            n = out["n"][task] = int(results["n-samples"][task]["effective"])
        except (KeyError, TypeError, ValueError):
            raise StreambackError(
                f"{path} has no n-samples of task {task} (n-samples.{task}.effective): {rerun}"
            ) from None
        metrics = out["metrics"][task] = list(results["higher_is_better"].get(task) or {})
        if not metrics:
            raise StreambackError(f"{path} names no metric of task {task} (higher_is_better.{task}): {rerun}")
        filters = out["filters"][task] = [
            f["name"] for f in (results["configs"].get(task) or {}).get("filter_list") or []
        ] or ["none"]
        out["output_type"][task] = (results["configs"].get(task) or {}).get("output_type")
        absent = [f"{m},{f}" for f in filters for m in metrics if f"{m},{f}" not in results["results"][task]]
        if absent:
            raise StreambackError(
                f"{path} has no {', '.join(absent)} of task {task} (each metric under each filter): {rerun}"
            )
        out["samples"][task] = _read_samples(layout.eval_samples(run, task), filters, metrics, n, path, rerun)
    return out


def _read_samples(
    sample_path, filters: list[str], metrics: list[str], n: int, results_path, rerun: str
) -> dict[str, list[dict]]:
    """{filter: samples} of one task's samples file, each filter's the n items, each sample complete."""
    by_filter: dict[str, list[dict]] = {f: [] for f in filters}
    try:
        lines = sample_path.read_text().splitlines()
    except OSError as err:
        raise StreambackError(f"{sample_path} cannot be read ({err.strerror or err}): {rerun}") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            sample = json.loads(line)
        except json.JSONDecodeError as err:
            raise StreambackError(f"{sample_path}, line {number}: not JSON ({err}): {rerun}") from None
        lacking = (
            [key for key in (*SAMPLE_KEYS, *metrics) if key not in sample]
            if isinstance(sample, dict)
            else ["everything"]
        )
        if lacking:
            raise StreambackError(f"{sample_path}, line {number}: no {', '.join(lacking)}: {rerun}")
        if sample["filter"] not in by_filter:
            raise StreambackError(
                f"{sample_path}, line {number}: filter {sample['filter']!r} is not one of the task's "
                f"({', '.join(filters)}) in {results_path}: {rerun}"
            )
        by_filter[sample["filter"]].append(sample)
    for filt, samples in by_filter.items():
        if len({s["doc_id"] for s in samples}) != n or len(samples) != n:
            raise StreambackError(
                f"{sample_path} holds {len(samples)} items under filter {filt}, {results_path} says {n}: {rerun}"
            )
    return by_filter


def benchmark_rows(spec: RunSpec, evaluation: dict, tasks: list[str]) -> list[dict]:
    """One row per task, filter and metric (all checked present by `read_results`)."""
    rows = []
    for task in tasks:
        scores = evaluation["results"][task]
        for filt in evaluation["filters"][task]:
            for metric in evaluation["metrics"][task]:
                rows.append(
                    {
                        "run": spec.name,
                        "shape": spec.shape,
                        "block": spec.block,
                        "stream": spec.stream,
                        "seed": spec.seed,
                        "task": task,
                        "filter": filt,
                        "metric": metric,
                        "value": _number(scores[f"{metric},{filt}"]),
                        "stderr": _number(scores.get(f"{metric}_stderr,{filt}")),
                        "n": evaluation["n"][task],
                        "chance": chance(evaluation, task, filt, metric),
                    }
                )
    return rows


def read_checkpoints(run: str, rows: list[dict], k: int) -> pd.DataFrame:
    """The run's checkpoints.csv (eval.last_checkpoints = `k`), checked: k steps, each with every
    task, filter and metric of the run's benchmark `rows`, the last step's values those of
    results.json; rows of benchmark_checkpoints.csv. StreambackError names the file and the rerun."""
    path = layout.eval_checkpoints(run)
    rerun = f"evaluate the run again (rule evaluate: snakemake --forcerun {layout.eval_results(run)})"
    try:
        frame = pd.read_csv(path, keep_default_na=False, na_values=[""])
    except (OSError, ValueError) as err:
        raise StreambackError(f"{path} cannot be read ({err}): {rerun}") from None
    if list(frame.columns) != CHECKPOINT_COLUMNS[1:]:
        raise StreambackError(
            f"{path} has columns {', '.join(map(str, frame.columns))}, not {', '.join(CHECKPOINT_COLUMNS[1:])}: {rerun}"
        )
    steps = sorted(frame.step.unique())
    if len(steps) != k:
        raise StreambackError(f"{path} holds {len(steps)} checkpoints, eval.last_checkpoints asks for {k}: {rerun}")
    values = {(r.step, r.task, r["filter"], r.metric): r.value for _, r in frame.iterrows()}
    for row in rows:
        absent = [step for step in steps if (step, row["task"], row["filter"], row["metric"]) not in values]
        if absent:
            raise StreambackError(
                f"{path} has no {row['metric']},{row['filter']} of task {row['task']} at step "
                f"{', '.join(map(str, absent))}: {rerun}"
            )
        final = values[(steps[-1], row["task"], row["filter"], row["metric"])]
        same = math.isclose(final, row["value"], rel_tol=1e-9) or math.isnan(final) and math.isnan(row["value"])
        if not same:
            raise StreambackError(
                f"{path}: task {row['task']} {row['metric']},{row['filter']} is {final} at the final "
                f"step {steps[-1]}, {layout.eval_results(run)} says {row['value']}: not the same "
                f"evaluation; {rerun}"
            )
    return frame.assign(run=run)[CHECKPOINT_COLUMNS]


def with_checkpoints(rows: list[dict], scores: pd.DataFrame | None) -> None:
    """Fill the rows' checkpoints, checkpoint_mean and checkpoint_sd (ddof 0) from the run's
    checkpoint scores (None: the final model alone)."""
    groups = (
        {}
        if scores is None
        else {key: g.value.to_numpy(dtype=float) for key, g in scores.groupby(["task", "filter", "metric"], sort=False)}
    )
    for row in rows:
        values = groups.get((row["task"], row["filter"], row["metric"]), [row["value"]])
        row.update(
            checkpoints=len(values),
            checkpoint_mean=float(np.mean(values)),
            checkpoint_sd=float(np.std(values)) if len(values) > 1 else math.nan,
        )


def chance(evaluation: dict, task: str, filt: str, metric: str) -> float:
    """The accuracy of answering without reading the item: for a multiple-choice task's acc and
    acc_norm the mean over its items of 1 / the number of choices (lm-eval scores one request per
    choice: the sample's `arguments`); for a continuation scored by exact match (a cloze, lm-eval's
    loglikelihood `acc`) the share of the items whose answer is the most frequent one, the best
    guess that ignores the context; NaN for anything else (generation, perplexities)."""
    samples = evaluation["samples"][task][filt]
    kind = evaluation["output_type"][task]
    if kind == "multiple_choice" and metric in ("acc", "acc_norm"):
        counts = [len(s.get("arguments") or ()) for s in samples]
        return sum(1 / c for c in counts) / len(counts) if counts and all(counts) else math.nan
    if kind == "loglikelihood" and metric == "acc" and samples and all("target" in s for s in samples):
        answers = Counter(str(s["target"]) for s in samples)
        return max(answers.values()) / len(samples)
    return math.nan


def _number(value) -> float:
    return float(value) if isinstance(value, (int, float)) else math.nan


def per_item(samples: list[dict], metric: str) -> dict[int, float]:
    return {s["doc_id"]: s[metric] for s in samples}


def is_binary(samples: list[dict], metric: str) -> bool:
    """Whether the metric's per-item values are all 0 or 1 (an accuracy)."""
    return all(isinstance(s[metric], (int, float)) and s[metric] in (0, 1) for s in samples)


def pair_rows(
    shape: str, base: str, other: RunSpec, evaluations: dict, tasks: list[str], pairs_cfg: dict
) -> list[dict]:
    """The rows of `other` against the baseline run `base` of its seed: per task, filter and 0/1
    metric, on that filter's items; Holm-adjusted over themselves (the family, which `family` spells
    out). Each row keeps the per-item differences (`_items`, b - a) for the rows over seeds."""
    rows = []
    for task in tasks:
        for filt in evaluations[base]["filters"][task]:
            a_samples, b_samples = (
                evaluations[base]["samples"][task][filt],
                evaluations[other.name]["samples"][task][filt],
            )
            a_hash, b_hash = ({s["doc_id"]: s["doc_hash"] for s in samples} for samples in (a_samples, b_samples))
            if a_hash != b_hash:
                raise StreambackError(
                    f"task {task}: runs {base} and {other.name} were evaluated on different items "
                    f"({layout.eval_samples(base, task)} vs {layout.eval_samples(other.name, task)}): evaluate both "
                    f"again"
                )
            for metric in evaluations[base]["metrics"][task]:
                binary = is_binary(a_samples, metric), is_binary(b_samples, metric)
                if binary[0] != binary[1]:
                    raise StreambackError(
                        f"task {task}, filter {filt}: metric {metric} is 0/1 per item in "
                        f"{layout.eval_samples(base if binary[0] else other.name, task)} but not in "
                        f"{layout.eval_samples(other.name if binary[0] else base, task)}: evaluate both again"
                    )
                if not binary[0]:
                    continue
                a_by_id, b_by_id = per_item(a_samples, metric), per_item(b_samples, metric)
                ids = sorted(a_by_id)
                a, b = [a_by_id[i] for i in ids], [b_by_id[i] for i in ids]
                diff, low, high = stats.paired_bootstrap_ci(
                    a, b, pairs_cfg["confidence"], pairs_cfg["resamples"], pairs_cfg["seed"]
                )
                only_a, only_b = stats.discordant(a, b)
                n = len(ids)
                rows.append(
                    {
                        "shape": shape,
                        "comparison": comparison_name(other),
                        "seed": other.seed,
                        "task": task,
                        "filter": filt,
                        "metric": metric,
                        "baseline": base,
                        "run": other.name,
                        "stream": other.stream,
                        "n": n,
                        "seeds": 1,
                        "_items": [y - x for x, y in zip(a, b)],
                        "baseline_value": sum(a) / n,
                        "value": sum(b) / n,
                        "diff": diff,
                        "ci_low": low,
                        "ci_high": high,
                        "baseline_only": only_a,
                        "run_only": only_b,
                        "p_mcnemar": stats.mcnemar_exact(only_a, only_b),
                        "mdd": stats.min_detectable_difference(
                            n, (only_a + only_b) / n, pairs_cfg["alpha"], pairs_cfg["power"]
                        ),
                    }
                )
    family = holm_family(base, other.name, rows)
    for row, adjusted in zip(rows, stats.holm([r["p_mcnemar"] for r in rows])):
        row.update(p_holm=adjusted, tests=len(rows), family=family)
        row["verdict"] = verdict(row, pairs_cfg)
    return rows


def holm_family(base: str, run: str, rows: list[dict]) -> str:
    """What one Holm correction covers, in words: e.g. "micro-streamback vs micro-baseline, 3 tests:
    gsm8k exact_match (strict-match, flexible-extract); hellaswag acc"."""
    tests: dict[tuple[str, str], list[str]] = {}
    for row in rows:
        tests.setdefault((row["task"], row["metric"]), []).append(row["filter"])
    parts = [
        f"{task} {metric}" + ("" if filters == ["none"] else f" ({', '.join(filters)})")
        for (task, metric), filters in tests.items()
    ]
    return f"{run} vs {base}, {len(rows)} test{'s' * (len(rows) != 1)}: {'; '.join(parts)}"


def verdict(row: dict, pairs_cfg: dict) -> str:
    """Whether the difference is distinguishable from noise, in plain words."""

    def points(x: float) -> str:
        return f"{100 * x:+.1f}"

    n, alpha, run = row["n"], pairs_cfg["alpha"], row["run"]
    interval = f"{pairs_cfg['confidence']:.0%} CI {points(row['ci_low'])} to {points(row['ci_high'])} points"
    if row["baseline_only"] + row["run_only"] == 0:
        text = f"no difference: both runs are right on exactly the same {n} items"
    elif row["p_holm"] <= alpha:
        text = (
            f"distinguishable from noise: {run} is {abs(100 * row['diff']):.1f} points "
            f"{'better' if row['diff'] > 0 else 'worse'} "
            f"than {row['baseline']} ({interval}; exact McNemar p = {row['p_mcnemar']:.2g}, {row['p_holm']:.2g} after "
            f"Holm over "
            f"{row['tests']} tests)"
        )
    elif row["p_mcnemar"] <= alpha:
        text = (
            f"not distinguishable from noise once the {row['tests']} tests of {run} against {row['baseline']} are "
            f"counted: "
            f"{points(row['diff'])} points ({interval}); p = {row['p_mcnemar']:.2g} alone, {row['p_holm']:.2g} after "
            f"Holm"
        )
    else:
        text = (
            f"not distinguishable from noise: {points(row['diff'])} points ({interval}; exact McNemar p = "
            f"{row['p_mcnemar']:.2g})"
        )
    if math.isnan(row["mdd"]):
        return text + f"; {n} items are too few to detect any difference"
    if row["p_holm"] > alpha:
        text += (
            f"; with {n} items a difference must be about {100 * row['mdd']:.1f} points to be detected "
            f"{pairs_cfg['power']:.0%} of the time"
        )
    return text


def across_seeds_rows(rows: list[dict], benchmarks: list[dict], pairs_cfg: dict) -> list[dict]:
    """Per shape, comparison, task, filter and metric, the row over its training seeds: the mean of
    the seeds' differences with a t interval over seeds (`ci_low`, `ci_high`), a bootstrap over
    seeds then items (`boot_low`, `boot_high`), the sd of the seeds' differences, the baseline's
    own seed-to-seed sd (`baseline_sd`), the exact sign-flip p over seeds (`p_seeds`) Holm-adjusted
    over the comparison's rows like these, the minimum detectable effect over the seeds (`mde`)
    and the seeds eval.pairs.target takes (`seeds_for_target`), each with its range from the sd's
    chi-square interval (`sd_low`, `sd_high`, `mde_low`, `mde_high`, `seeds_for_target_low`,
    `_high`: `stats.seed_row`), and a verdict against the seed-to-seed spread. These are secondary
    verdicts: each names its family (`family`: a comparison's tasks) and its Holm-adjusted p."""
    confidence, alpha = pairs_cfg["confidence"], pairs_cfg["alpha"]
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault((row["shape"], row["comparison"], row["task"], row["filter"], row["metric"]), []).append(row)
    out = []
    for (shape, comparison, task, filt, metric), seeds in groups.items():
        fields, summary = stats.seed_row(
            [r["diff"] for r in seeds],
            [r["_items"] for r in seeds],
            [r["baseline_value"] for r in seeds],
            confidence,
            pairs_cfg["power"],
            {"target": pairs_cfg["target"]},
            pairs_cfg["resamples"],
            pairs_cfg["seed"],
            alpha=alpha,
        )
        first = seeds[0]
        out.append(
            {
                "shape": shape,
                "comparison": comparison,
                "seed": layout.ALL_SEEDS,
                "task": task,
                "filter": filt,
                "metric": metric,
                "baseline": first["baseline"].removesuffix(f"-seed{first['seed']}"),
                "run": first["run"].removesuffix(f"-seed{first['seed']}"),
                "stream": first["stream"],
                "n": first["n"],
                "baseline_value": sum(r["baseline_value"] for r in seeds) / len(seeds),
                "value": sum(r["value"] for r in seeds) / len(seeds),
                "diff": summary["mean"],
                **fields,
                "_summary": summary,
                "_significant": [r["p_holm"] <= alpha for r in seeds],
            }
        )
    by_comparison: dict[tuple, list[dict]] = {}
    for row in out:
        by_comparison.setdefault((row["shape"], row["comparison"]), []).append(row)
    for family_rows in by_comparison.values():
        family = f"{family_rows[0]['run']} vs {family_rows[0]['baseline']} over seeds, {len(family_rows)} tests"
        for row, adjusted in zip(family_rows, stats.holm([r["p_seeds"] for r in family_rows])):
            row.update(p_holm=adjusted, tests=len(family_rows), family=family)
            text = stats.seed_verdict(
                row.pop("_summary"), row.pop("_significant"), row["baseline_sd"], _points, "better", "worse"
            )
            if text.startswith("consistent") and not adjusted <= alpha:
                text += (
                    f"; but p = {row['p_seeds']:.2g} over seeds is {adjusted:.2g} after Holm over the "
                    f"{len(family_rows)} tests"
                )
            row["verdict"] = text
    return out


def _points(x: float, sign: bool = True) -> str:
    return f"{100 * x:+.1f} points" if sign else f"{100 * x:.1f} points"


def tables(eval_cfg: dict, train_cfg: dict) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(benchmarks, benchmark_pairs, benchmark_checkpoints) of every run of the matrix, from
    results/eval/<run>/: the pairs per training seed, then over the seeds; the checkpoints' scores
    where eval.last_checkpoints > 1 (else no rows)."""
    runs, tasks, k = run_matrix(train_cfg), eval_cfg["tasks"], eval_cfg["last_checkpoints"]
    evaluations = {name: read_results(name, tasks) for name in runs}
    benchmarks, checkpoints = [], []
    for name, spec in runs.items():
        rows = benchmark_rows(spec, evaluations[name], tasks)
        scores = read_checkpoints(name, rows, k) if k > 1 else None
        with_checkpoints(rows, scores)
        benchmarks += rows
        checkpoints += [] if scores is None else [scores]
    pairs = [
        row
        for shape, base, other in comparisons(runs)
        for row in pair_rows(shape, base, runs[other], evaluations, tasks, eval_cfg["pairs"])
    ]
    pairs += across_seeds_rows(pairs, benchmarks, eval_cfg["pairs"])
    for row in pairs:
        row.pop("_items", None)
    return (
        pd.DataFrame(benchmarks, columns=BENCHMARK_COLUMNS),
        pd.DataFrame(pairs, columns=PAIR_COLUMNS),
        pd.concat(checkpoints, ignore_index=True) if checkpoints else pd.DataFrame(columns=CHECKPOINT_COLUMNS),
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser, "eval")
    parser.add_argument(
        "--train-params",
        default=None,
        help="the 'train' section as a JSON object, for the run matrix (what the rule passes; default: from --config)",
    )


def run(args: argparse.Namespace) -> int:
    eval_cfg = section_from_args(args, "eval")
    if args.train_params is not None:
        train_cfg = section_from_json(args.train_params, "train", "--train-params")
    else:
        train_cfg = load_config(args.config or DEFAULT_CONFIG)["train"]
    benchmarks, pairs, checkpoints = tables(eval_cfg, train_cfg)
    written = [*zip(layout.BENCHMARK_TABLES, (benchmarks, pairs))]
    written += [(layout.CHECKPOINT_TABLE, checkpoints)] if eval_cfg["last_checkpoints"] > 1 else []
    for name, frame in written:
        write_csv(layout.table(name), frame)
        print(f"benchmark-table: wrote {layout.table(name)} ({len(frame)} rows)")
    for row in pairs.itertuples():
        print(f"{row.shape} {row.task} {row.metric} (seed {row.seed}): {row.run} vs {row.baseline}: {row.verdict}")
    return 0
