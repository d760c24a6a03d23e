"""`streamback evaluate`: one trained run through lm-evaluation-harness (rule evaluate).

The run is the `streamback` lm-eval model (`streamback.eval.lm`: as trained, bf16 compute and its
stream); the tasks are `eval.tasks`, by lm-eval's names, looked up by lm-eval's TaskManager in
streamback/eval/tasks/ (the local tasks), `eval.include_path`, and lm-eval's own tasks when a
name is not local. Everything is checked before the first item is scored: the model file, the
tokenizer against the model (its vocabulary, its corpus), every task name (unknown ones with
lm-eval's closest names), each task's data as lm-eval loads them (a hub dataset that cannot be
reached, a local data file that is missing, empty or unreadable, named with task and split;
`streamback.eval.taskload`) and that each task has items.

Outputs, in results/eval/<run>/ (`--outdir`): lm-eval's results JSON as its EvaluationTracker
writes it (`results.json`) and its per-item samples (`samples_<task>.jsonl`, `log_samples`).
They are written in a temporary directory and renamed into place, results.json last, so a
results.json is never half-written and always has its samples beside it. lm-eval's environment
record in results.json (torch's collect_env, which runs pip and the like, and the versions) is
taken once per machine and software and kept beside the runs' outputs (`environment_record`).

With `--snapshots` (eval.last_checkpoints k > 1: the run's models at k-1 earlier steps, which the
trainer writes), the same process then scores each of them on the same loaded tasks (no samples,
no bootstrap: the values alone) and writes `checkpoints.csv`, one row per step, task, filter and
metric of the final model and every snapshot (`step, task, filter, metric, value`), before
results.json. Every snapshot must be of the final model's run (architecture, corpus) and an earlier step.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import sys
import time
from pathlib import Path

import pandas as pd

from streamback import layout
from streamback.config import DEFAULT_CONFIG, add_config_arguments, load_config, section_from_args
from streamback.errors import StreambackError
from streamback.eval.taskload import load_tasks, task_manager
from streamback.io import write_csv, write_json
from streamback.progress import plain_logs

HELP = "evaluate a trained run with lm-evaluation-harness (the `streamback` model): results.json and per-item samples"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser, "eval")
    parser.add_argument("--run-name", required=True, help="the run, e.g. tiny-fat-short-streamback")
    parser.add_argument(
        "--model", type=Path, default=None, help="its model file (default: results/runs/<run>/model.pt)"
    )
    parser.add_argument(
        "--tokens",
        type=Path,
        default=None,
        help="token directory of the run's corpus (default: the config's, results/tokens/<corpus>)",
    )
    parser.add_argument(
        "--outdir",
        type=Path,
        default=None,
        help="for results.json and samples_<task>.jsonl (default: results/eval/<run>)",
    )
    parser.add_argument(
        "--snapshots",
        type=Path,
        nargs="*",
        default=[],
        metavar="FILE",
        help="the run's models at earlier steps (eval.last_checkpoints: "
        "results/runs/<run>/last/step_<N>.pt), scored after it into checkpoints.csv",
    )
    parser.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (default: torch's choice)")


def run(args: argparse.Namespace) -> int:
    plain_logs()  # before lm-eval and datasets import tqdm
    cfg = section_from_args(args, "eval")  # threads and kernels: args.execution_context, applied by cli.main
    tokens = args.tokens or layout.tokens_dir(load_config(args.config or DEFAULT_CONFIG)["data"])
    model_file, outdir = args.model or layout.model_file(args.run_name), args.outdir or layout.eval_dir(args.run_name)
    evaluate(cfg, model_file, tokens, outdir, args.execution_context.device, snapshots=args.snapshots)
    return 0


def evaluate(cfg: dict, model_file, tokens_dir, outdir, device: str | None = None, snapshots=()) -> dict:
    """Evaluate one run on cfg["tasks"]; writes results.json and samples_<task>.jsonl to `outdir`
    (and, with `snapshots`, checkpoints.csv) and returns lm-eval's results (without the samples)."""
    os.environ.setdefault("DISABLE_MULTIPROC", "1")  # lm-eval's bootstrap stderrs in this process, on its threads
    import lm_eval  # lm-eval (and tqdm with it) after plain_logs() has turned tqdm's bars off
    import lm_eval.evaluator  # its add_env_info, taken once per machine (environment_record)
    from lm_eval.loggers import EvaluationTracker
    from lm_eval.utils import make_table

    from streamback.eval.lm import StreambackLM  # imports lm-eval: after plain_logs(), as the lines above

    outdir = Path(outdir)
    absent = [str(p) for p in snapshots if not Path(p).is_file()]
    if absent:  # before anything is scored
        raise StreambackError(
            f"snapshot {', '.join(absent)} does not exist (eval.last_checkpoints: rule train writes it)"
        )
    for stale in (
        outdir / layout.EVAL_RESULTS_FILE,
        outdir / layout.EVAL_CHECKPOINTS_FILE,
        *(outdir / layout.EVAL_SAMPLES_FILE.format(task=n) for n in cfg["tasks"]),
    ):
        stale.unlink(missing_ok=True)
    manager = task_manager(cfg["tasks"], cfg["include_path"])
    began = time.perf_counter()
    tasks = load_tasks(manager, cfg["tasks"])  # before the model: a task the cache lacks fails in seconds
    lm = StreambackLM(
        pretrained=str(model_file),
        tokens=str(tokens_dir),
        batch_size=cfg["batch_size"],
        max_length=cfg["max_length"],
        device=device,
    )
    print(
        f"evaluate: {lm.run.name} ({lm.model.args.block}, stream {lm.model.stream_format.label}, "
        f"{lm.model.compute_dtype}) "
        f"on {', '.join(f'{n} ({len(t.eval_docs)} items)' for n, t in tasks.items())}",
        file=sys.stderr,
        flush=True,
    )
    staging = outdir / f".staging-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    tracker = EvaluationTracker(output_path=str(staging / "results.json"))
    real_add_env_info = lm_eval.evaluator.add_env_info
    lm_eval.evaluator.add_env_info = lambda storage: storage.update(
        environment_record(outdir.parent, real_add_env_info)
    )
    try:
        results = lm_eval.simple_evaluate(
            model=lm,
            tasks=list(tasks.values()),
            task_manager=manager,
            log_samples=True,
            bootstrap_iters=cfg["bootstrap_iters"],
            evaluation_tracker=tracker,
        )
        samples = results.pop("samples")
        tracker.save_results_aggregated(results=results, samples=samples)
        for name in results["configs"]:
            tracker.save_results_samples(task_name=name, samples=samples[name])
        for name in cfg["tasks"]:
            (written,) = staging.glob(f"samples_{name}_*.jsonl")
            os.replace(written, outdir / layout.EVAL_SAMPLES_FILE.format(task=name))
        if snapshots:
            rows = score_rows(results, cfg["tasks"], _step(lm.run.trained, model_file))
            for path in snapshots:
                step, scores = evaluate_snapshot(cfg, lm, path, tasks, manager, device)
                if step in {row["step"] for row in rows} or step > rows[0]["step"]:
                    raise StreambackError(
                        f"snapshot {path} is of step {step}, not an earlier step than the final "
                        f"model's ({rows[0]['step']}) and the other snapshots'"
                    )
                rows += score_rows(scores, cfg["tasks"], step)
            write_csv(outdir / layout.EVAL_CHECKPOINTS_FILE, pd.DataFrame(rows, columns=CHECKPOINT_COLUMNS))
        (written,) = staging.glob("results_*.json")
        os.replace(written, outdir / layout.EVAL_RESULTS_FILE)
    finally:
        lm_eval.evaluator.add_env_info = real_add_env_info
        shutil.rmtree(staging, ignore_errors=True)
    print(make_table(results))
    print(
        f"evaluate: {lm.run.name} in {time.perf_counter() - began:.1f} s; wrote {outdir / layout.EVAL_RESULTS_FILE} "
        f"and the samples of "
        f"{len(cfg['tasks'])} tasks",
        file=sys.stderr,
    )
    return results


CHECKPOINT_COLUMNS = ["step", "task", "filter", "metric", "value"]


def score_rows(results: dict, tasks: list[str], step: int) -> list[dict]:
    """checkpoints.csv's rows of one model's lm-eval results: each task's metrics (higher_is_better)
    under each of its filters (its filter_list, else `none`), at `step`."""
    rows = []
    for task in tasks:
        filters = [f["name"] for f in (results["configs"].get(task) or {}).get("filter_list") or []] or ["none"]
        for filt in filters:
            for metric in results["higher_is_better"].get(task) or {}:
                value = results["results"][task].get(f"{metric},{filt}")
                rows.append(
                    {
                        "step": step,
                        "task": task,
                        "filter": filt,
                        "metric": metric,
                        "value": float(value) if isinstance(value, (int, float)) else float("nan"),
                    }
                )
    return rows


def evaluate_snapshot(cfg: dict, final, path: Path, tasks: dict, manager, device: str | None) -> tuple[int, dict]:
    """(step, lm-eval's results) of the snapshot `path` of the run whose final model `final` (a
    StreambackLM) is, on the tasks already loaded: the values alone (no samples, no bootstrap)."""
    import lm_eval

    from streamback.eval.lm import StreambackLM

    began = time.perf_counter()
    lm = StreambackLM(
        pretrained=str(path),
        tokens=str(final.run.tokens_dir),
        batch_size=cfg["batch_size"],
        max_length=cfg["max_length"],
        device=device,
    )
    if lm.run.trained.args != final.run.trained.args or lm.run.trained.data != final.run.trained.data:
        raise StreambackError(
            f"snapshot {path} is not of the run of {final.run.model_file} (another architecture, "
            "stream or corpus): give the run's own last/step_<N>.pt"
        )
    results = lm_eval.simple_evaluate(
        model=lm, tasks=list(tasks.values()), task_manager=manager, log_samples=False, bootstrap_iters=0
    )
    step = _step(lm.run.trained, path)
    print(
        f"evaluate: snapshot {path} (step {step}) in {time.perf_counter() - began:.1f} s", file=sys.stderr, flush=True
    )
    return step, results


def _step(trained, path) -> int:
    if trained.step is None:
        raise StreambackError(
            f"model file {path} records no step (written before models recorded theirs): train the "
            "run again to evaluate its last checkpoints (rule train)"
        )
    return trained.step


def environment_record(cache_dir: Path, add_env_info) -> dict:
    """What lm-eval's `add_env_info` adds to results.json, computed once per machine, Python and
    package versions (its key) and kept in `cache_dir`/.lm_eval_environment/: every run of a study
    on that machine gets the same record, without running torch's collect_env again."""
    from importlib.metadata import PackageNotFoundError, version

    def installed(name: str) -> str | None:
        try:
            return version(name)
        except PackageNotFoundError:
            return None

    versions = {name: installed(name) for name in ("torch", "lm_eval", "transformers", "datasets")}
    identity = {
        "host": platform.node(),
        "python": sys.executable,
        "versions": versions,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "cwd": os.getcwd(),
    }
    key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
    path = Path(cache_dir) / ".lm_eval_environment" / f"{key}.json"
    if path.is_file():
        try:
            return json.loads(path.read_text())["record"]
        except (ValueError, KeyError, TypeError):
            pass  # a damaged record is taken again
    record: dict = {}
    add_env_info(record)
    write_json(path, {"identity": identity, "record": record})
    return record
