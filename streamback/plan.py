"""`streamback plan` (`snakemake plan`): before any job, every job kind of the config, what it asks for
against what it needs, on each GPU of plan.gpu_memory_gb.

One row per job kind, GPU and measure (columns: job, jobs, gpu, measure, asked, needed, unit, ok,
basis, fix): host memory, GPU memory, runtime (a train run's time in walltime slices against its
retries), disk (the whole matrix at its peak, streamback.preflight.table.matrix_disk) and GPU-hours
(the matrix against train.budget_gpu_hours). The sizes come from streamback/sizes.py. A train
run's GPU-hours are the preflight's projection where its record exists, else train.stated_gpu_hours
shared among the runs by their FLOPs; both are H200 figures (the tiers' stated costs were measured
there), and an 80 GB GPU's are derived from them as an H100's, at most `sizes.H100_SLOWDOWN` times
the H200's (the same SMs and clocks with less memory bandwidth; docs/costs.md), and say so.
Every mismatch is printed as one line naming the job, the figure and the key to change; the
table is written to results/tables/plan.csv. With --strict, exit status 1 where any mismatch was found.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import pandas as pd

from streamback import layout, sizes
from streamback.check import read_files, resolve
from streamback.config import public_models
from streamback.io import read_json_record, write_csv
from streamback.preflight.table import matrix_disk, matrix_disk_needs
from streamback.runs import comparisons, run_matrix, run_processes, run_setting

HELP = "every job kind's resources against its estimated need (memory, GPU memory, runtime, disk, GPU-hours)"
COLUMNS = ["job", "jobs", "gpu", "measure", "asked", "needed", "unit", "ok", "basis", "fix"]
ANALYSIS_RULES = {
    "layer-error": "analyze_layer_error",
    "envelope": "analyze_envelope",
    "swallowed": "analyze_swallowed",
    "loss-difference": "analyze_loss_difference",
    "public": "analyze_public",
}
EXIT_MISMATCH = 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("configfiles", nargs="*", type=Path, metavar="FILE", help="as `streamback check`")
    parser.add_argument("--config-json", default=None, help="the merged config as JSON (what rule plan passes)")
    parser.add_argument("--out", type=Path, default=None, help="the table (default: results/tables/plan.csv)")
    parser.add_argument("--strict", action="store_true", help="exit 1 where a mismatch was found")


def run(args: argparse.Namespace) -> int:
    if args.config_json is not None:
        config = resolve(json.loads(args.config_json))[0]
    else:
        config = resolve(read_files(args.configfiles))[0]
    table = plan_table(config, preflight_records(config))
    write_csv(args.out or layout.table(layout.PLAN_TABLE), table)
    print(table.drop(columns=["basis", "fix"]).to_string(index=False))
    problems = table[~table.ok]
    for row in problems.itertuples():
        print(
            f"plan: MISMATCH {row.job} on {row.gpu}: {row.measure} asked {_figure(row.asked)} {row.unit}, needs "
            f"{_figure(row.needed)} {row.unit}: {row.fix}",
            file=sys.stderr,
        )
    gpus = sorted(set(table.gpu) - {"any"})
    print(f"plan: {len(problems)} mismatch(es) over {table.job.nunique()} job kinds on {', '.join(gpus)}")
    return EXIT_MISMATCH if len(problems) and args.strict else 0


def _figure(value) -> str:
    """A figure of the table as a line prints it: thousands separated, no decimals on a whole number."""
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.1f}"


def preflight_records(config: dict) -> dict[str, dict]:
    """arm -> its passed preflight record (results/preflight/<arm>.json) where one exists."""
    records = {}
    for spec in run_matrix(config["train"]).values():
        record = None if spec.arm in records else read_json_record(layout.preflight_file(spec.arm))
        if record is not None:
            records[spec.arm] = record
    return records


def _gpus(config: dict, records: dict) -> list[tuple[str, float, bool]]:
    """(name, bytes, is it an H100-class 80 GB GPU) of each GPU the plan covers: plan.gpu_memory_gb and each
    preflight's measured one."""
    gpus = [(f"{gb:g} GB", gb * 1e9, gb < 100) for gb in config["plan"]["gpu_memory_gb"]]
    for record in records.values():
        memory = next((c for c in record["checks"] if c["name"] == "memory"), None)
        on_gpu = "cuda" in record.get("kernels", "")
        if (
            on_gpu
            and memory
            and memory["values"].get("available_bytes")
            and record["device"] not in [g[0] for g in gpus]
        ):
            available = memory["values"]["available_bytes"]
            gpus.append((record["device"], available, available < 100e9))
    return gpus


def _row(job, jobs, gpu, measure, asked, needed, unit, basis, fix, ok=None) -> dict:
    ok = (asked is None or needed is None or asked >= needed) if ok is None else ok
    return {
        "job": job,
        "jobs": jobs,
        "gpu": gpu,
        "measure": measure,
        "asked": asked,
        "needed": needed,
        "unit": unit,
        "ok": bool(ok),
        "basis": basis,
        "fix": "" if ok else fix,
    }


def run_h200_hours(config: dict, records: dict, vocab: int) -> dict[str, tuple[float, str]]:
    """run -> (its GPU-hours, where the figure comes from): its arm's preflight projection on the GPUs it ran on,
    else its FLOPs' share of train.stated_gpu_hours (H200-hours)."""
    train, runs = config["train"], run_matrix(config["train"])
    flops = {
        name: sizes.shape_of(config["model"], spec.shape, vocab).flops_per_token(train["seq_len"])
        for name, spec in runs.items()
    }
    out = {}
    for name, spec in runs.items():
        record = records.get(spec.arm)
        speed = next((c for c in record["checks"] if c["name"] == "speed"), None) if record else None
        if speed is not None:
            out[name] = (speed["values"]["projected_hours"], f"the preflight of {spec.arm} on {record['device']}")
        elif train["stated_gpu_hours"] is not None:
            share = flops[name] / sum(flops.values())
            out[name] = (train["stated_gpu_hours"] * share, "train.stated_gpu_hours by the runs' FLOPs (H200)")
    return out


def plan_table(config: dict, records: dict | None = None, disk_usage=None, quota=None) -> pd.DataFrame:
    """The plan's rows (COLUMNS) for the resolved `config`; `records`: the arms' preflight records;
    `disk_usage` and `quota` as matrix_disk takes them (default: shutil.disk_usage, lfs quota)."""
    records = records or {}
    vocab = sizes.vocab_of(config)
    runs = run_matrix(config["train"])
    rows = []
    for gpu, capacity, h100 in _gpus(config, records):
        rows += _train_rows(config, records, vocab, runs, gpu, h100)
        rows += _model_job_rows(config, vocab, runs, gpu, capacity)
    seen = {"disk_usage": disk_usage} | ({"quota": quota} if quota else {})
    disk = matrix_disk(matrix_disk_needs(config, records, vocab), **seen)
    for entry in disk:
        rows.append(
            _row(
                "matrix",
                len(runs),
                "any",
                f"disk under {entry['path']}",
                entry["free_bytes"] // 10**9,
                math.ceil(entry["needed_bytes"] / 10**9),
                "GB",
                entry["basis"],
                f"free {entry['shortfall_bytes'] / 10**9:,.1f} GB under {entry['path']} or move it (data.dir, a "
                "link for results/)",
                ok=entry["passed"],
            )
        )
    return pd.DataFrame(rows, columns=COLUMNS)


def _train_rows(config, records, vocab, runs, gpu, h100) -> list[dict]:
    train = config["train"]
    hours = run_h200_hours(config, records, vocab)
    slowdown, basis = (sizes.H100_SLOWDOWN, "H200 figure x the H100 bound (docs/costs.md)") if h100 else (1.0, "H200")
    rows, total = [], 0.0
    retries = train["resources"]["retries"]
    for name in runs:
        res = run_setting(train, name, "resources")
        if name not in hours:
            rows.append(
                _row(
                    "train",
                    1,
                    gpu,
                    f"{name}: jobs of {res['runtime']} min",
                    retries + 1,
                    None,
                    "jobs",
                    "no estimate: no preflight record yet and train.stated_gpu_hours unset",
                    "",
                )
            )
            continue
        gpus = run_processes(train, name)
        measured = hours[name][1].startswith("the preflight")  # on the GPUs it ran on: no H100 bound on top
        run_hours = hours[name][0] * (1.0 if measured else slowdown)
        total += run_hours
        jobs = sizes.slices(run_hours / gpus * 60, res["runtime"])
        rows.append(
            _row(
                "train",
                1,
                gpu,
                f"{name}: jobs of {res['runtime']} min",
                retries + 1,
                jobs,
                "jobs",
                f"{run_hours:,.1f} GPU-hours on {gpus} GPUs ({hours[name][1]}" + (")" if measured else f"; {basis})"),
                f"set train.resources.retries to at least {jobs - 1} (or a longer runtime)",
            )
        )
    budget = train["budget_gpu_hours"]
    if hours:
        rows.append(
            _row(
                "train",
                len(hours),
                gpu,
                "GPU-hours of the matrix",
                budget,
                round(total, 1),
                "GPU-hours",
                f"{basis}; train.budget_gpu_hours" + (" unset" if budget is None else ""),
                "raise train.budget_gpu_hours or train fewer runs",
            )
        )
    return rows


def _model_job_rows(config, vocab, runs, gpu, capacity) -> list[dict]:
    rows = []
    exported = sorted({runs[n].shape for n in _exported_runs(config, runs)})
    for shape in exported:
        job = sizes.export_job(config, shape, vocab)
        rows.append(
            _row(
                "export_hf",
                1,
                gpu,
                f"host memory ({shape})",
                job["mem_mb"],
                job["need_mb"],
                "MB",
                "3 x the fp32 model + the interpreter, x 1.25",
                f"set analysis.export_resources.mem_mb to {job['need_mb']} or null",
            )
        )
        rows.append(
            _row(
                "export_hf",
                1,
                gpu,
                f"runtime ({shape})",
                job["runtime"],
                job["need_min"],
                "min",
                f"the model read and written at plan.disk_mb_per_s {config['plan']['disk_mb_per_s']:g}",
                f"set analysis.export_resources.runtime to {job['need_min']} or null",
            )
        )
    res = config["analysis"]["resources"]
    kinds = ["layer-error", "envelope", "swallowed"]
    kinds += ["loss-difference"] if comparisons(runs) else []
    kinds += ["public"] if sizes.public_shapes(config, runs) else []
    for kind in kinds:
        job = sizes.analysis_job(config, kind, runs, vocab)
        rule = ANALYSIS_RULES[kind]
        rows.append(
            _row(
                rule,
                1,
                gpu,
                "host memory",
                job["mem_mb"],
                job["need_mb"],
                "MB",
                "2 x the largest fp32 model + the interpreter" + ("" if res["gpus"] else " + its tensors"),
                f"set analysis.resources.mem_mb to {job['need_mb']} or null",
            )
        )
        if res["gpus"]:
            limit = int(sizes.GPU_SHARE * capacity / sizes.MB)
            batch = config["analysis"]["batch_size"]
            rows.append(
                _row(
                    rule,
                    1,
                    gpu,
                    "GPU memory",
                    limit,
                    math.ceil(job["gpu_bytes"] / sizes.MB),
                    "MB",
                    f"{sizes.GPU_SHARE:.0%} of {gpu}; the peak estimated from the shapes (streamback/sizes.py)",
                    _smaller_batch(config, kind, runs, vocab, capacity, batch),
                )
            )
            rows.append(
                _row(
                    rule,
                    1,
                    gpu,
                    "runtime",
                    job["runtime"],
                    job["need_min"],
                    "min",
                    f"{job['models']} models, their passes at {sizes.ANALYSIS_TFLOPS:g} TFLOP/s",
                    f"set analysis.resources.runtime to {job['need_min']} or null",
                )
            )
    eval_runs = list(runs)
    if eval_runs:
        shape = max({runs[n].shape for n in eval_runs}, key=lambda s: sizes.shape_of(config["model"], s, vocab).params)
        job = sizes.evaluate_job(config, shape, vocab)
        rows.append(
            _row(
                "evaluate",
                len(eval_runs),
                gpu,
                "host memory",
                job["mem_mb"],
                job["need_mb"],
                "MB",
                "2 x the fp32 model + the interpreter, x 1.25",
                f"set eval.resources.mem_mb to {job['need_mb']} or null",
            )
        )
    return rows


def _exported_runs(config, runs) -> list[str]:
    names = []
    for directory in public_models(config["analysis"]).values():
        run = str(directory).rstrip("/").rsplit("/", 1)[-1]
        if run in runs and Path(directory) == layout.hf_dir(run):
            names.append(run)
    return names


def _smaller_batch(config, kind, runs, vocab, capacity, batch) -> str:
    """The fix of an analysis over the GPU: the largest analysis.batch_size that fits (layer-error, swallowed,
    envelope), or a smaller analysis.micro_batch_size (loss-difference)."""
    key = "micro_batch_size" if kind == "loss-difference" else "batch_size"
    start = config["analysis"][key]
    for smaller in range(start - 1, 0, -1):
        trial = {**config, "analysis": {**config["analysis"], key: smaller}}
        if sizes.analysis_job(trial, kind, runs, vocab)["gpu_bytes"] <= sizes.GPU_SHARE * capacity:
            return f"set analysis.{key} to {smaller} (or run on a larger GPU)"
    return f"no analysis.{key} fits: run it on a larger GPU (analysis.resources)"
