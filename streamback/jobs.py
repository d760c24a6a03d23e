"""What each job of the workflow is given: the resolved settings it reads, and nothing else.

Snakemake reruns a job whose params differ from those it last ran with, so a rule's params hold
only what its job's outputs depend on: a train job gets its shape's model arguments and its run's
recipe, not the whole `model` and `train` sections (else adding a shape, or the tiny shapes that
config/paper.yaml is merged over, would mark every run as changed). Each function returns config
sections in the config's own form, naming just this job's part (one shape, a one-run matrix), so
the stage's CLI validates them as any config and computes what `--config FILE` would; keys left
out take schema defaults that the job never reads.

Execution settings say how a job runs, not what it writes: a run's micro-batch size, activation
checkpointing and torch.compile (the schema's `per_run` keys), its checkpoint cadence and whether
it writes TensorBoard event files (`train.log.tensorboard`) or logs to W&B (`train.log.wandb`), and the tokenizer's
reading batch. The rules pass them to the CLI (`--execution`) as params that
Snakemake does not compare (common.smk's `untracked`), so changing one reruns nothing; a run
resumed later continues with the new value. Resources (threads, GPUs, memory) are not settings.
Standard library only: the rule files import it.
"""

from __future__ import annotations

import math
from pathlib import Path

from streamback.data import hubcache
from streamback.data.hubcache import ENV as HUB_CACHE_ENV
from streamback.data.settings import shard_settings
from streamback.eval.taskdata import LOCAL_TASKS
from streamback.runs import is_reversible, run_matrix, run_setting

# how a run executes, resolved per run (train.per_run may override them)
RUN_EXECUTION = ("micro_batch_size", "activation_checkpointing", "compile")
# train keys that the preflight reads and training does not (so that setting one reruns no train job)
PREFLIGHT_SETTINGS = ("preflight", "budget_gpu_hours", "stated_gpu_hours")
# the keys each analysis reads from the analysis section
ANALYSIS_SETTINGS = {
    "layer-error": ("batch_size", "reference", "variants", "seed"),
    "envelope": ("batch_size", "curve_points"),
    "swallowed": ("batch_size", "variants", "seed"),
    "loss-difference": (
        "loss_windows",
        "micro_batch_size",
        "confidence",
        "smooth_steps",
        "curve_points",
        "band",
        "power",
        "target",
    ),
    "public": ("public_models", "public_sequences", "public_seq_len", "reference", "variants", "seed", "confidence"),
}
# the keys `streamback evaluate` reads from the eval section (eval_tasks: local; benchmark_table: pairs)
EVALUATE_SETTINGS = ("tasks", "include_path", "batch_size", "max_length", "bootstrap_iters")


def _pick(section: dict, keys) -> dict:
    return {key: section[key] for key in keys}


def hub_reads(config: dict) -> list[str]:
    """What the config's jobs read from the Hugging Face Hub (rules fetch_data and fetch_tasks download it; hubcache.hub_reads)."""
    return hubcache.hub_reads(config, LOCAL_TASKS)


def execution_environment(config: dict) -> dict[str, str]:
    """The environment every job runs in, from the config: how bf16 computes on a CPU (`cpu_bf16`,
    as STREAMBACK_CPU_BF16, which streamback.model.execution reads) and, where the config reads
    from the Hub, its cache (`hub_cache`, as STREAMBACK_HUB_CACHE, absolute: each process then
    reads it offline but `fetch`, streamback.data.hubcache). Execution settings: changing one
    reruns nothing; train's launcher hands them to each of its processes."""
    env = {"STREAMBACK_CPU_BF16": config["cpu_bf16"]}
    if hub_reads(config):
        env[HUB_CACHE_ENV] = str(Path(config["hub_cache"]).resolve())
    return env


def fetch_parts(config: dict) -> list[str]:
    """The fetch rules the config needs (layout.FETCH_PARTS): `data` where its dataset or tokenizer
    is on the Hub (tokenize waits for it), `tasks` where an eval task is not local (evaluate waits
    for it); none for the default config."""
    reads = hubcache.hub_reads(config, LOCAL_TASKS)
    parts = ["data"] if any(r.startswith(("hub dataset", "tokenizer")) for r in reads) else []
    return parts + (["tasks"] if any(r.startswith("eval tasks") for r in reads) else [])


def fetch(config: dict, part: str) -> dict:
    """Rule fetch_<part>: what it downloads. data: the hub dataset and the tokenizer (a changed one
    retokenizes anyway); tasks: eval.tasks and where lm-eval finds them (a changed one reruns every
    evaluate anyway). The cache is given apart (untracked)."""
    data = config["data"]
    if part == "data":
        return {
            "data": {
                "source": data["source"],
                **({"hub": data["hub"]} if data["source"] == "hub" else {}),
                "tokenizer": data["tokenizer"],
            }
        }
    return {"eval": _pick(config["eval"], ("tasks", "include_path"))}


def corpus(config: dict) -> dict:
    """Rule corpus: the synthetic corpus's settings (seed, documents, files)."""
    return {"data": {"synthetic": config["data"]["synthetic"]}}


def tokenize(config: dict) -> dict:
    """Rule tokenize: every data key that decides the shards; the file list is the rule's input,
    the other sources' settings are left out."""
    return {"data": shard_settings(config["data"])}


def tokenize_execution(config: dict) -> dict:
    return {"data": _pick(config["data"], ("batch_documents", "budget_check"))}


def _one_run_matrix(spec, cfg: dict) -> dict:
    """A train.runs matrix whose only run is `spec`. Its seed appears only if it is not train.seed
    (and what a seed varies only if not both), so a run of train.seed has the params it had before
    seeds existed, and adding seeds reruns none of them."""
    stream_run = spec.arm != f"{spec.shape}-{spec.block}"
    matrix = {
        "shapes": [spec.shape],
        "blocks": [] if stream_run else [spec.block],
        "streams": [spec.stream] if stream_run else [],
        "stream_shapes": None,
    }
    if spec.seed != cfg["seed"]:
        matrix["seeds"] = [spec.seed]
        if cfg["runs"]["seeds_vary"] != "both":
            matrix["seeds_vary"] = cfg["runs"]["seeds_vary"]
    return matrix


def train(config: dict, run: str) -> dict:
    """Rule train, one run: its recipe (seed, token budget, batch, optimizer, schedule, logging,
    the reversible stream where it applies) with a matrix of this run alone, and its shape's model
    arguments. The data is the rule's input (tokenize's manifest)."""
    cfg, model = config["train"], config["model"]
    spec = run_matrix(cfg)[run]
    skip = (*RUN_EXECUTION, *PREFLIGHT_SETTINGS, "checkpoint", "resources", "per_run")
    recipe = {k: v for k, v in cfg.items() if k not in skip}
    # shadow_every off (the schema's default) leaves the rule's params as before the key existed: nothing reruns
    recipe["log"] = {
        k: v for k, v in cfg["log"].items() if k not in ("tensorboard", "wandb") and not (k == "shadow_every" and not v)
    }
    recipe["runs"] = _one_run_matrix(spec, cfg)
    recipe["reversible"] = is_reversible(cfg, spec)
    shape = model["shapes"][spec.shape]
    arguments = {k: v for k, v in model.items() if k != "shapes"}
    arguments["shapes"] = {spec.shape: shape}
    if "multiple_of" in shape:  # the section's is not this shape's
        arguments["multiple_of"] = shape["multiple_of"]
    return {"train": recipe, "model": arguments}


def train_execution(config: dict, run: str) -> dict:
    cfg = config["train"]
    return {
        "train": {
            **{key: run_setting(cfg, run, key) for key in RUN_EXECUTION},
            "checkpoint": cfg["checkpoint"],
            "log": {"tensorboard": cfg["log"]["tensorboard"], "wandb": cfg["log"]["wandb"]},
        }
    }


def preflight_arms(config: dict) -> dict[str, str]:
    """Rule preflight: arm -> the run its preflight checks, the arm's first (its train.seed run when
    it has one). The seeds of an arm train the same shape, block, stream and execution, so one
    preflight serves them all."""
    arms = {}
    for name, spec in run_matrix(config["train"]).items():
        arms.setdefault(spec.arm, name)
    return arms


def preflight(config: dict, arm: str) -> dict:
    """Rule preflight, one arm: what its run's train job is given (recipe, model arguments,
    execution; tracked here, since the checks hold for them) and the preflight's own keys."""
    run = preflight_arms(config)[arm]
    settings = train(config, run)
    cfg = config["train"]
    execution = {key: run_setting(cfg, run, key) for key in RUN_EXECUTION}
    settings["train"] = {
        **settings["train"],
        **execution,
        "checkpoint": cfg["checkpoint"],
        **_pick(cfg, PREFLIGHT_SETTINGS),
        # its runtime is the job's resource (preflight_runtime in common.smk), not a setting it checks
        "preflight": {k: v for k, v in cfg["preflight"].items() if k != "runtime"},
    }
    return settings


def preflight_table(config: dict) -> dict:
    """Rule preflight_table: the run matrix, the budget and the stated cost."""
    return {"train": {**_matrix(config), **_pick(config["train"], ("budget_gpu_hours", "stated_gpu_hours"))}}


def preflight_disk(config: dict) -> dict:
    """Rule preflight_table's disk check of the whole matrix (streamback.preflight.table.matrix_disk_needs): the
    matrix and its checkpoints, the shapes, the data's size and place, the snapshots, the exports and the
    vocabulary the sizes assume."""
    data = {k: config["data"][k] for k in ("corpus", "dir", "train_tokens", "val_tokens", "tokenizer")}
    # the shapes the matrix trains alone (train.runs.stream_shapes lies within them): a shape no run uses, such as
    # the default's tiny ones under a GPU tier, changes no disk
    used = set(config["train"]["runs"]["shapes"])
    model = {**config["model"], "shapes": {k: v for k, v in config["model"]["shapes"].items() if k in used}}
    return {
        "train": {**_matrix(config), "checkpoint": config["train"]["checkpoint"]},
        "model": model,
        "data": data,
        "eval": {"last_checkpoints": config["eval"]["last_checkpoints"]},
        "analysis": {"public_models": config["analysis"]["public_models"]},
        "plan": config["plan"],
    }


def _matrix(config: dict) -> dict:
    """The train section's run matrix alone: which runs exist, their shapes, blocks, streams and
    seeds (train.seed names them: its runs carry no seed suffix)."""
    return {"runs": config["train"]["runs"], "seed": config["train"]["seed"]}


def training_curves(config: dict) -> dict:
    """Rule training_curves: the run matrix (the curves are the runs' metrics, its input)."""
    return {"train": _matrix(config)}


def analysis(config: dict, kind: str) -> dict:
    """Rule analyze_<kind>: the analysis keys it reads, and of the train section the run matrix and
    the window length (loss-difference: also the logged validation's window count, its default;
    public: nothing)."""
    cfg = config["analysis"]
    if kind == "public":  # its models are its own, its windows public_seq_len long: nothing of train
        return {"analysis": _pick(cfg, ANALYSIS_SETTINGS[kind]), "train": {}}
    train = {**_matrix(config), "seq_len": config["train"]["seq_len"]}
    if kind == "loss-difference" and cfg["loss_windows"] is None:
        train["log"] = {"val_sequences": config["train"]["log"]["val_sequences"]}
    return {"analysis": _pick(cfg, ANALYSIS_SETTINGS[kind]), "train": train}


def eval_tasks(config: dict) -> dict:
    """Rule eval_tasks: the local tasks asked for and how their items are drawn."""

    cfg = config["eval"]
    return {"eval": {"tasks": [t for t in cfg["tasks"] if t in LOCAL_TASKS], "local": cfg["local"]}}


def evaluate(config: dict) -> dict:
    """Rule evaluate, per run: the tasks and how lm-eval scores them (the model is its input)."""
    return {"eval": _pick(config["eval"], EVALUATE_SETTINGS)}


def benchmark_table(config: dict) -> dict:
    """Rule benchmark_table: the tasks, the paired statistics and the run matrix; eval.last_checkpoints
    only where it is over 1 (so that its default leaves the job's params as before the key existed)."""
    eval_cfg = config["eval"]
    keys = ("tasks", "pairs", "last_checkpoints") if eval_cfg["last_checkpoints"] > 1 else ("tasks", "pairs")
    return {"eval": _pick(eval_cfg, keys), "train": _matrix(config)}


def seed_variance(config: dict) -> dict:
    """Rule seed_variance: the run matrix (the scores, and the runs' last checkpoints', are its inputs)."""
    return {"train": _matrix(config)}


def drift(config: dict) -> dict:
    """Rule drift: the whole drift section (every key shapes the simulation)."""
    return {"drift": config["drift"]}


def depth(config: dict) -> dict:
    """Rule depth: the run matrix, its shapes (their depth and width), and the analysis keys it reads
    (its intervals' confidence, the paper's band it marks)."""
    shapes = dict.fromkeys(config["train"]["runs"]["shapes"])
    return {
        "train": _matrix(config),
        "model": {"shapes": {s: config["model"]["shapes"][s] for s in shapes}},
        "analysis": _pick(config["analysis"], ("confidence", "band")),
    }


# ---- a train job's stop signal -----------------------------------------------------------------

SIGNAL_MARGIN = 2  # x the preflight's save and step: measured once, in minutes; a busy file system at hour 47 is slower
SIGNAL_SLACK_S = 30  # the signal's way through srun, torchrun and the launcher, the metrics' sync, the processes' exit
SIGNAL_UNMEASURED_S = 300  # a preflight record without the figures (written before they were measured)
SIGNAL_MAX_S = 65535  # the largest --signal lead Slurm takes


def signal_lead(resources: dict, record: dict | None) -> int:
    """Seconds before a train job's time limit at which Slurm sends it SIGURG (`--signal=URG@<s>`): the run's
    `resources.signal_lead`, else from its arm's preflight `record` (its resume check's `save_s`
    and `step_s`: SIGNAL_MARGIN x (step + save) + SIGNAL_SLACK_S, rounded up), else
    SIGNAL_UNMEASURED_S."""
    if resources.get("signal_lead") is not None:
        return resources["signal_lead"]
    values = next((c["values"] for c in (record or {}).get("checks", []) if c["name"] == "resume"), {})
    if "save_s" not in values or "step_s" not in values:
        return SIGNAL_UNMEASURED_S
    return min(SIGNAL_MAX_S, math.ceil(SIGNAL_MARGIN * (values["save_s"] + values["step_s"])) + SIGNAL_SLACK_S)

