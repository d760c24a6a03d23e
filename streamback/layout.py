"""Every path the pipeline reads and writes under `results/`, named once.

Standard library only: the rule files import it to name their inputs and outputs, the CLI for
its defaults and the tests to find what a stage wrote. Paths are relative to the working
directory (Snakemake's `--directory`). A function of a run name also builds the rule's pattern:
`model_file("{run}")` is `results/runs/{run}/model.pt`.

Every name that becomes a path component (a run, task, corpus, table or figure name, a rule's
job) is checked here, by `checked_name`, against the one pattern the schema also gives corpus and task
names: a name can never climb out of its directory (`--run-name ../../x` is refused).
"""

from __future__ import annotations

import glob
import re
from pathlib import Path

from streamback.errors import StreambackError

RESULTS = Path("results")
# config/schema/config.schema.yaml: data.corpus and eval.tasks (a test keeps them equal)
NAME_PATTERN = "^[A-Za-z0-9][A-Za-z0-9._-]*$"
_NAME = re.compile(NAME_PATTERN)
_WILDCARD = re.compile(r"^\{[A-Za-z_]\w*\}$")  # `{run}`: a rule's pattern, filled by Snakemake with a checked name


def checked_name(value: str, what: str = "name") -> str:
    """`value`, if it can be a path component of its own: letters, digits, '.', '_' and '-',
    beginning with a letter or digit (so never '..', a '/' or a hidden name), or a Snakemake
    wildcard such as `{run}`; StreambackError naming `what` (e.g. "run name") otherwise."""
    if not isinstance(value, str) or not (_NAME.match(value) or _WILDCARD.match(value)):
        raise StreambackError(
            f"{what} {value!r} cannot name a file or directory: a name is letters, digits, '.', '_' and '-', "
            "beginning with a letter or digit"
        )
    return value


# -- data (rules corpus, tokenize) ------------------------------------------------------------


def tokens_dir(data: dict) -> Path:
    """The shard directory: `data.dir`, or results/tokens/<corpus>/."""
    return Path(data["dir"]) if data.get("dir") else RESULTS / "tokens" / checked_name(data["corpus"], "corpus name")


def corpus_dir(data: dict) -> Path:
    """Where the synthetic corpus's parquet files go: results/corpus/<corpus>/."""
    return RESULTS / "corpus" / checked_name(data["corpus"], "corpus name")


def corpus_files(data: dict) -> list[Path]:
    """The synthetic corpus's parquet files, part-00000-of-0000N.parquet."""
    files = data["synthetic"]["files"]
    return [corpus_dir(data) / f"part-{k:05d}-of-{files:05d}.parquet" for k in range(files)]


def local_files(data: dict) -> list[Path]:
    """`data.local.files` with glob patterns expanded (each pattern's matches sorted)."""
    paths: list[Path] = []
    for pattern in data["local"]["files"]:
        matches = sorted(glob.glob(pattern, recursive=True)) if glob.has_magic(pattern) else [pattern]
        paths += [Path(m) for m in matches if Path(m) not in paths]
    return paths


def input_files(data: dict) -> list[Path]:
    """The files the tokenize stage reads for this config (none for a hub dataset)."""
    if data["source"] == "synthetic":
        return corpus_files(data)
    if data["source"] == "local":
        return local_files(data)
    return []


# -- training (rule train) --------------------------------------------------------------------


MODEL_FILE, METRICS_FILE, SUMMARY_FILE = "model.pt", "metrics.jsonl", "summary.json"  # in a run's directory
METRICS_HEADER_FILE = "metrics.header.json"  # beside metrics.jsonl: what holds for the whole log (its kernels)


def run_dir(run: str) -> Path:
    """A trained run's outputs: model.pt, metrics.jsonl (and its metrics.header.json), summary.json."""
    return RESULTS / "runs" / checked_name(run, "run name")


def model_file(run: str) -> Path:
    """The trained model (`streamback.model.weights`)."""
    return run_dir(run) / MODEL_FILE


def metrics_file(run: str) -> Path:
    """One record per optimizer step (`streamback.train.metrics`); the live copy is in the recipe's checkpoint
    directory."""
    return run_dir(run) / METRICS_FILE


def metrics_header_file(run: str) -> Path:
    """What holds for the whole of a run's metrics.jsonl: the kernels it computed on, and their changes."""
    return run_dir(run) / METRICS_HEADER_FILE


def recipe_file(run: str) -> Path:
    """The settings a run trains with (its recipe and model arguments, rule train_recipe), which its
    train job takes as input: a changed recipe retrains the run even in a call that reruns preflights."""
    return run_dir(run) / "recipe.json"


def summary_file(run: str) -> Path:
    """The completion record of a run (final losses, tokens, time, GPU-hours)."""
    return run_dir(run) / SUMMARY_FILE


# in a run's directory: its models at the earlier steps of eval.last_checkpoints
SNAPSHOTS_DIR, SNAPSHOT_FILE = "last", "step_{step:09d}.pt"


def snapshot_file(run: str, step: int) -> Path:
    """A run's model at an earlier step (eval.last_checkpoints), in model.pt's format: last/step_<N>.pt."""
    return run_dir(run) / SNAPSHOTS_DIR / SNAPSHOT_FILE.format(step=step)


def snapshot_stash(recipe: str | Path, step: int) -> Path:
    """Where the trainer keeps the model of snapshot step `step` until the run ends: snapshots/ in
    its recipe directory, beside the checkpoints (not a rule output, so a failed job keeps it)."""
    return Path(recipe) / "snapshots" / SNAPSHOT_FILE.format(step=step)


CHECKPOINTS_DIR = RESULTS / "checkpoints"


def checkpoint_dir(run: str) -> Path:
    """Resumable training state (not a rule output, so a failed job never loses it)."""
    return CHECKPOINTS_DIR / checked_name(run, "run name")


# in a run's checkpoint directory, beside its recipe directories (streamback.train.checkpoint):
TRAINER_LOCK = "trainer.lock"  # the live trainer's: its Slurm job, host and PID (streamback.train.runlock)
VERIFIED_SHARDS = "verified-shards.json"  # the token shards this run has hashed (streamback.data.shards)
TRAIN_LOG = "train.log"  # every attempt's log, appended (rule train links logs/train/<run>.log to it)


def train_log(run: str) -> Path:
    """The whole story of a run over all its attempts (Snakemake replaces logs/train/<run>.log)."""
    return checkpoint_dir(run) / TRAIN_LOG


RECIPE_PREFIX = "recipe-"  # in a run's checkpoint directory, one directory per recipe the run was trained with


def recipe_dir(checkpoints: str | Path, fingerprint: str) -> Path:
    """One recipe's step_* checkpoints and live metrics.jsonl, in a run's checkpoint directory
    (`checkpoint_dir(run)` or the trainer's --checkpoints): a changed recipe trains in its own."""
    return Path(checkpoints) / checked_name(f"{RECIPE_PREFIX}{fingerprint}", "recipe directory")


def recipe_dirs(checkpoints: str | Path) -> list[Path]:
    """The recipe directories in a run's checkpoint directory, by name."""
    return sorted(p for p in Path(checkpoints).glob(f"{RECIPE_PREFIX}*") if p.is_dir())


PREFLIGHT_DIR = RESULTS / "preflight"
PREFLIGHT_TABLE = "preflights"  # table(name): every arm's checks, and the matrix's projected cost
PLAN_TABLE = "plan"  # table(name) of `streamback plan`: every job kind's resources against its estimated need


def preflight_file(arm: str) -> Path:
    """The passed preflight of a run arm (`{shape}-{block}` or `{shape}-streamback-{stream}`): every
    check with its figure, device, versions (its runs' train jobs wait for its `preflight_gate`)."""
    return PREFLIGHT_DIR / f"{checked_name(arm, 'run arm')}.json"


def preflight_gate(arm: str) -> Path:
    """The verdict of a run arm's preflight (`passed`), which its runs' train jobs wait for (as an
    ancient() input: a preflight run again on other resources reruns no training)."""
    return preflight_gate_of(preflight_file(arm))


def preflight_gate_of(record: str | Path) -> Path:
    """The gate beside a preflight record (`preflight_file`, or a record written elsewhere by hand):
    its name with the suffix .pass."""
    return Path(record).with_suffix(".pass")


# The verdict of the whole matrix's projected cost against the budget and the stated cost (rule
# preflight; passed at once where neither is set), which every train job waits for. No arm is named
# `matrix` (an arm has a `-`).
PREFLIGHT_MATRIX_GATE = PREFLIGHT_DIR / "matrix.pass"
PASSED = "passed\n"  # a gate's content once its check passed


def preflight_failed_file(record: str | Path) -> Path:
    """Where a failed preflight's record goes instead of `record` (a `preflight_file`), so that
    nothing takes it as passed: failed/ beside it."""
    return Path(record).parent / "failed" / Path(record).name


def preflight_scratch(record: str | Path) -> Path:
    """The preflight's own checkpoint (removed when it ends), beside its record: on the
    filesystem every node of the run sees."""
    return Path(record).parent / f".scratch-{Path(record).stem}"


TENSORBOARD_DIR = RESULTS / "tensorboard"  # `tensorboard --logdir results/tensorboard`: every run side by side


def tensorboard_dir(run: str) -> Path:
    """A run's TensorBoard event files, a directory per recipe
    (`recipe-<fingerprint>`, as in its checkpoint directory)."""
    return TENSORBOARD_DIR / run


TRAINING_TABLE = "training_curves"  # table(name): every run's loss, validation loss, grad norm per step
TRAINING_FIGURES = ("training_loss", "training_grad_norm")  # figure(name, suffix)


def hf_dir(run: str) -> Path:
    """A run exported to Hugging Face format (`streamback export-hf`; rule export_hf)."""
    return RESULTS / "hf" / checked_name(run, "run name")


HF_FILES = (
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "config.json",
)  # config.json last


def hf_files(run: str) -> list[Path]:
    """What export-hf writes for a trained run (with its corpus's tokenizer), config.json last."""
    return [hf_dir(run) / name for name in HF_FILES]


# -- drift (rule drift) -----------------------------------------------------------------------

DRIFT_DIR = RESULTS / "drift"
DRIFT_FILES = {
    "summary": "summary.csv",
    "trajectories": "trajectories.parquet",
    "spacing": "spacing.csv",
    "report": "report.html",
}
DRIFT_FIGURES = ("drift_ratio", "trajectories", "spacing")  # each as .svg and .png

# -- measurement (streamback bench, streamback memory) ----------------------------------------

FETCH_DIR = RESULTS / "fetch"
FETCH_PARTS = ("data", "tasks")  # rules fetch_data (the dataset, the tokenizer) and fetch_tasks (eval.tasks' data)


def fetch_record(part: str) -> Path:
    """What rule fetch_<part> put in hub_cache, at which commits: results/fetch/<part>.json."""
    if part not in FETCH_PARTS:
        raise ValueError(f"fetch part {part!r} is not one of {', '.join(FETCH_PARTS)}")
    return FETCH_DIR / f"{part}.json"

BENCH_DIR = RESULTS / "bench"
BENCH_FILE = BENCH_DIR / "bench.json"  # and bench.md beside it
MEMORY_FILE = BENCH_DIR / "memory.json"  # and memory.md beside it

# -- evaluation, analyses and the study page --------------------------------------------------

EVAL_DIR = RESULTS / "eval"
TABLES_DIR = RESULTS / "tables"
ALL_SEEDS = "all"  # a table's seed column in a row over every seed (loss_difference, benchmark_pairs, seed_variance)
FIGURES_DIR = RESULTS / "figures"
STUDY_PAGE = RESULTS / "study.html"
TIMING_DIR = RESULTS / "timing"  # Snakemake's benchmark records: timing/<rule>/<job>.tsv
REPORT_PAGE = RESULTS / "report.html"  # Snakemake's report (snakemake --report)


def eval_dir(run: str) -> Path:
    """lm-eval's outputs for a run: results.json and the per-item samples."""
    return EVAL_DIR / checked_name(run, "run name")


EVAL_RESULTS_FILE, EVAL_SAMPLES_FILE = "results.json", "samples_{task}.jsonl"  # in a run's eval directory


def eval_results(run: str) -> Path:
    """lm-eval's results JSON for a run, as lm-eval writes it (written last: the run's completion record)."""
    return eval_dir(run) / EVAL_RESULTS_FILE


def eval_samples(run: str, task: str) -> Path:
    """lm-eval's per-item samples of one task for a run (`log_samples`), one JSON object a line."""
    return eval_dir(run) / EVAL_SAMPLES_FILE.format(task=checked_name(task, "task name"))


EVAL_CHECKPOINTS_FILE = "checkpoints.csv"  # in a run's eval directory, with eval.last_checkpoints > 1


def eval_checkpoints(run: str) -> Path:
    """The scores of a run's last checkpoints (eval.last_checkpoints > 1): step, task, filter, metric, value."""
    return eval_dir(run) / EVAL_CHECKPOINTS_FILE


EVAL_TASKS_DIR = EVAL_DIR / "tasks"  # not a run: run names are <shape>-<block>...
BENCHMARK_TABLES = ("benchmarks", "benchmark_pairs")  # table(name): scores per run, and run vs baseline
SEED_TABLE, SEED_FIGURE = (
    "seed_variance",
    "seed_differences",
)  # table(name) and figure(name, suffix) of rule seed_variance
CHECKPOINT_TABLE = "benchmark_checkpoints"  # table(name) of rule benchmark_table with eval.last_checkpoints > 1
TASK_SNR_TABLE = "task_snr"  # table(name) of rule seed_variance: each task's signal-to-noise over the run arms
# table(name) and figure(name, suffix) of rule depth: every measure per depth, and its trend against log2(depth)
DEPTH_TABLES, DEPTH_FIGURE = ("depth", "depth_trend"), "depth"


def eval_task_file(task: str) -> Path:
    """The items of a local lm-eval task (`streamback eval-tasks`); its YAML reads this path."""
    return EVAL_TASKS_DIR / f"{checked_name(task, 'task name')}.jsonl"


def table(name: str) -> Path:
    """A table of the study: results/tables/<name>.csv."""
    return TABLES_DIR / f"{checked_name(name, 'table name')}.csv"


def figure(name: str, suffix: str) -> Path:
    """A figure of the study: results/figures/<name>.<suffix> (svg or png)."""
    return FIGURES_DIR / f"{checked_name(name, 'figure name')}.{suffix}"


# -- analyses (rules in workflow/rules/analysis.smk; `streamback analyze <kind>`) --------------

PRIMARY_TABLE = "primary"  # table(name) of rule analyze_loss_difference: the tier's one primary test
ANALYSIS_TABLES = {  # kind -> the tables it writes, table(name)
    "layer-error": ("layer_error",),
    "envelope": ("envelope", "envelope_training"),
    "swallowed": ("swallowed",),
    "loss-difference": ("loss_difference", "loss_curves", PRIMARY_TABLE, "loss_accumulation"),
    "public": (
        "public_layer_error",
        "public_swallowed",
        "public_flip_ratio",
    ),  # the public models of analysis.public_models
}
FIGURE_SUFFIXES = ("svg", "png")


def analysis_figures(kind: str, runs: list[str], shapes: list[str]) -> list[str]:
    """The figure names `kind` draws for these runs (layer error, envelope over training: one per
    run; public: `runs` are the public models, two each) and shapes (swallowed updates, loss
    difference: one per shape; envelope: one for all)."""
    return {
        "layer-error": [f"layer_error-{run}" for run in runs],
        "envelope": ["envelope"] + [f"envelope_training-{run}" for run in runs],
        "swallowed": [f"swallowed-{shape}" for shape in shapes],
        "loss-difference": [f"loss_difference-{shape}" for shape in shapes],
        "public": [f"{figure}-{model}" for model in runs for figure in ("public_activations", "public_gradients")],
    }[kind]


def analysis_outputs(kind: str, runs: list[str], shapes: list[str]) -> list[Path]:
    """Every file `streamback analyze <kind>` writes: its tables, then each figure as .svg and .png."""
    return [table(name) for name in ANALYSIS_TABLES[kind]] + [
        figure(name, suffix) for name in analysis_figures(kind, runs, shapes) for suffix in FIGURE_SUFFIXES
    ]


def timing_file(rule: str, job: str = "all") -> Path:
    """The benchmark record (wall-clock, CPU time, memory) of one job of `rule` (`job`: e.g. the run)."""
    return TIMING_DIR / checked_name(rule, "rule name") / f"{checked_name(job, 'job name')}.tsv"
