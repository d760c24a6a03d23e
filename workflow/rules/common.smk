# Shared by the stage files: how a job calls the CLI, how its settings are passed, and every
# function the stages' rules use (`snakemake --lint` wants functions and rules in separate files).
# Quoting, by construction: every value in a rule's shell line is either quoted there with
# Snakemake's `:q` (`{input:q}`, `{params.tokens:q}`: paths, names) or a param made shell-quoted
# here (`as_json`, `shell_words`), never interpolated raw; the one exception is train's
# `{params.launch}`, a command line (train_launcher) built from integers of the config.

import json
import shlex
import sys
from pathlib import Path
from types import SimpleNamespace

from snakemake.settings.types import DeploymentMethod

from streamback import jobs, layout, sizes
from streamback.io import read_json_record
from streamback.runs import run_setting

# Jobs run `streamback <stage> ...`, a shell function for `python -m streamback` with the
# repository on PYTHONPATH. With --use-conda that python is the environment's (envs/); otherwise
# it is the interpreter running Snakemake, so an un-activated venv (`.venv/bin/snakemake`) works
# as well as an activated one. A job that fails shows the end of its log (`cmd > log || log_tail
# log`; the CLI's error is its last line), not only Snakemake's "check log file(s)".
if DeploymentMethod.CONDA in workflow.deployment_settings.deployment_method:
    PYTHON = "python"
else:
    PYTHON = shlex.quote(sys.executable)
# Every job runs with the execution environment of the config (jobs.execution_environment: its
# cpu_bf16, how bf16 runs on a CPU, streamback/model/compute.py): each stage that runs model code
# decides its kernels from it once (streamback/model/execution.py); changing it reruns nothing,
# and `streamback <stage> --config FILE` reads the same key from FILE.
EXECUTION_ENV = " ".join(f"{name}={shlex.quote(value)}" for name, value in jobs.execution_environment(config).items())
shell.prefix(
    f"export PYTHONPATH={shlex.quote(workflow.basedir)}${{{{PYTHONPATH:+:$PYTHONPATH}}}} STREAMBACK_PYTHON={PYTHON} "
    f"{EXECUTION_ENV.replace('{', '{{').replace('}', '}}')}; "
    'streamback() {{ "$STREAMBACK_PYTHON" -m streamback "$@"; }}; '
    'log_tail() {{ local status=$?; echo "--- the end of $1:" >&2; tail -n 5 "$1" >&2; return "$status"; }}; set -euo pipefail; '
)



def final_outputs(page: bool = True) -> list[str]:
    """Every stage's final outputs: `rule all` asks for them, the study page (page=False) reads
    them. Called once the stage files are included: it names their rules."""
    outputs = [
        rules.tokenize.output.manifest,
        *rules.drift.output,
        rules.preflight.output.table,
        *expand(list(rules.train.output), run=list(RUNS)),
        *rules.training_curves.output,
        *rules.analyze_layer_error.output,
        *rules.analyze_envelope.output,
        *rules.analyze_swallowed.output,
        # a matrix without a baseline, or without anything beside it, has no loss difference
        *(rules.analyze_loss_difference.output if COMPARED else []),
        *(rules.analyze_public.output if PUBLIC_MODELS else []),  # analysis.public_models
        *rules.benchmark_table.output,
        *rules.seed_variance.output,
        *(rules.depth.output if COMPARED else []),  # every measure against depth, from the analyses' tables
    ]
    return [*outputs, rules.study_report.output[0]] if page else outputs


# ---- what a job is given (streamback/jobs.py) --------------------------------------------------


def as_json(section):
    """A config section as a shell-quoted JSON argument (`--params`, `--execution`)."""
    return shlex.quote(json.dumps(section, sort_keys=True))


def shell_words(words):
    """Several arguments as one param, each shell-quoted (a list of runs, of files)."""
    return " ".join(shlex.quote(str(word)) for word in words)


def untracked(value):
    """A param the job is given but that Snakemake does not compare with the one its outputs were
    made with: Snakemake compares only params not derived from a job's input, output, threads or
    resources, and this is a function of its resources. For how a job runs (execution settings,
    the launcher, threads), never for what it computes. `value` may be a function of wildcards."""
    return lambda wildcards, resources: value(wildcards) if callable(value) else value


# ---- fetch (fetch.smk) -------------------------------------------------------------------------

FETCH_PARTS = jobs.fetch_parts(config)  # what the config reads from the Hub: [], ["data"], ["tasks"] or both


def fetched(part):
    """The record of fetch_<part> (fetch.smk) where the config needs it, else nothing: a job's input."""
    return [str(layout.fetch_record(part))] if part in FETCH_PARTS else []


# ---- drift -----------------------------------------------------------------------------------


def drift_file(name, suffix=None):
    """A drift output: a file of layout.DRIFT_FILES, or figure `name` as .`suffix`."""
    return str(layout.DRIFT_DIR / (f"{name}.{suffix}" if suffix else layout.DRIFT_FILES[name]))


# ---- train -------------------------------------------------------------------------------------

RENDEZVOUS_PORT = 29500
TORCHRUN_ENV = "PET_SIGNALS_TO_HANDLE=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1 TORCH_ELASTIC_SHUTDOWN_TIMEOUT=300"


def of_arm(job_function):
    """A train-job function of `wildcards.run` as one of a preflight's `wildcards.arm`: the same
    resources and launcher for the run the arm's preflight checks (workflow/rules/preflight.smk)."""
    return lambda wildcards: job_function(SimpleNamespace(run=PREFLIGHT_ARMS[wildcards.arm]))


def train_resources(run):
    return run_setting(config["train"], run, "resources")


def processes_per_node(res):
    """Training processes on each node: one per GPU, or train.resources.processes on the CPU."""
    return res["gpus"] or res["processes"]


def train_gates(wildcards):
    """What a train job waits for (workflow/rules/preflight.smk): its arm's preflight verdict and the
    whole matrix's against train.budget_gpu_hours and train.stated_gpu_hours (rule preflight), which
    passes at once where neither is set (preflight_unbounded). Snakemake records the set of a
    job's inputs, so setting a budget must not change it, only which rule writes that gate.
    ancient(): a preflight or table run again (other resources, compile, software, a budget, another
    arm) reruns no training; a changed recipe retrains through the run's recipe file (rule
    train_recipe), the train job's other input."""
    gates = [layout.preflight_gate(RUNS[wildcards.run].arm), layout.PREFLIGHT_MATRIX_GATE]
    return [ancient(str(gate)) for gate in gates]


def preflight_runtime(wildcards):
    """A preflight job's time limit in minutes: train.preflight.runtime, else 15 plus 2 per step,
    at most its train job's runtime (a job of minutes need not queue for a slot of hours)."""
    preflight = config["train"]["preflight"]
    if preflight["runtime"] is not None:
        return preflight["runtime"]
    return min(train_resources(PREFLIGHT_ARMS[wildcards.arm])["runtime"], 15 + 2 * preflight["steps"])


def train_threads(wildcards):
    """Snakemake threads of a train job (per node): threads per process x processes per node."""
    res = train_resources(wildcards.run)
    return res["threads"] * processes_per_node(res)


def train_settings(section):
    """A train job's `section` (train or model) of its settings, as a param of its run."""
    return lambda wildcards: as_json(jobs.train(config, wildcards.run)[section])


def train_launcher(wildcards):
    """The command line that starts `streamback` for this run: python (one CPU process), torchrun
    (one node: a process per GPU, or `processes` on the CPU with gloo) or srun + torchrun (nodes).

    Several nodes: Snakemake's Slurm job step keeps only SLURM_JOB_ID of the job's SLURM_*
    variables, so the job's nodes come from squeue and srun is given its geometry (a task per
    node, each with its node's CPUs and GPUs). The c10d rendezvous is on the first node, at the
    address Slurm reaches it by (its NodeAddr; by default its name).
    """
    res = train_resources(wildcards.run)
    per_node, nodes, threads, gpus = processes_per_node(res), res["nodes"], res["threads"], res["gpus"]
    if not gpus and per_node * nodes == 1:
        return f'OMP_NUM_THREADS={threads} "$STREAMBACK_PYTHON" -m streamback'
    cpu = "" if gpus else f"OMP_NUM_THREADS={threads} "
    torchrun = f'{cpu}{TORCHRUN_ENV} "$STREAMBACK_PYTHON" -m torch.distributed.run --nproc-per-node {per_node}'
    if nodes == 1:
        return f"{torchrun} --standalone -m streamback"
    # `sed -n 1p` reads all the names (under pipefail, `head -n1` could end scontrol with SIGPIPE on a long node list)
    task = f"--cpus-per-task {threads * per_node}" + (f" --gpus-per-task {gpus}" if gpus else "")
    return (
        'nodes=$(squeue -h -o %N -j "${SLURM_JOB_ID:?runs on several nodes under Slurm only (--profile slurm)}"); '
        'head=$(scontrol show hostnames "$nodes" | sed -n 1p); '
        'head=$(scontrol -o show node "$head" | sed -n "s/.* NodeAddr=\\([^ ]*\\).*/\\1/p"); '
        f"srun --nodes {nodes} --ntasks {nodes} --ntasks-per-node 1 {task} --kill-on-bad-exit=1 env {torchrun} --nnodes {nodes} "
        f'--rdzv-backend c10d --rdzv-endpoint "$head:{RENDEZVOUS_PORT}" --rdzv-id "$SLURM_JOB_ID" -m streamback'
    )


def train_slurm(key):
    """A Slurm resource of this run; None leaves it unset (CPU runs have no GPU keys).

    One node: the job asks for G GPUs (--gpus) and Snakemake's job step (srun -n1) gets them
    all; on the CPU, its threads (threads x processes) as --cpus-per-task. N nodes: as
    TorchTitan's multi-node Slurm script, N tasks (one per node) with G GPUs each
    (--gpus-per-task) and the node's CPUs; the `mpi` resource makes the job run this shell in
    its batch step, whose srun then starts the N torchruns.
    """

    def get(wildcards):
        res = train_resources(wildcards.run)
        gpus, nodes, extra = res["gpus"], res["nodes"], res["slurm_extra"]
        single = nodes == 1
        return {
            "gpu": gpus if gpus and single else None,
            "cpus_per_gpu": res["threads"] if gpus and single else None,
            "cpus_per_task": None if single else res["threads"] * processes_per_node(res),
            "tasks": None if single else nodes,
            "mpi": None if single else "srun",
            "slurm_extra": (extra if single or not gpus else f"--gpus-per-task={gpus} {extra}".strip()) or None,
        }[key]

    return get


def train_slurm_extra(wildcards):
    """A train job's extra sbatch options: the run's, and `--signal=URG@<seconds>`, the lead before
    its time limit at which Slurm signals it to save and stop (jobs.signal_lead: from its arm's
    preflight record; before that preflight passed, as in a dry run of a new study, the lead of an
    unmeasured run: Snakemake evaluates a job's resources again when it is about to submit it,
    the preflight then done). SIGURG, not SIGUSR1: Slurm sends it to every process of the job's
    steps, the Snakemake process that runs the rule among them, which a SIGUSR1 would kill (its
    default action) and SIGURG leaves alone (ignored by default)."""
    record = read_json_record(layout.preflight_file(RUNS[wildcards.run].arm))
    lead = jobs.signal_lead(train_resources(wildcards.run), record)
    return " ".join(filter(None, [train_slurm("slurm_extra")(wildcards), f"--signal=URG@{lead}"]))


# ---- analyses ----------------------------------------------------------------------------------

ANALYSIS_CAPTIONS = {  # table or figure name (less its run or shape) -> caption file
    "layer_error": "analysis_layer_error", "envelope": "analysis_envelope", "envelope_training": "analysis_envelope_training",
    "swallowed": "analysis_swallowed", "loss_difference": "analysis_loss_difference", "loss_curves": "analysis_loss_curves",
    "primary": "primary",
    "loss_accumulation": "analysis_loss_accumulation",
    "public_layer_error": "analysis_public_layer_error", "public_swallowed": "analysis_public_swallowed",
    "public_flip_ratio": "analysis_public_flip_ratio", "public_activations": "analysis_public_activations",
    "public_gradients": "analysis_public_gradients",
}


def analysis_output(kind, runs, shapes):
    """The kind's outputs (layout.analysis_outputs), each table and SVG marked for the report with its caption."""
    marked = []
    for path in layout.analysis_outputs(kind, runs, shapes):
        name, _, key = path.stem.partition("-")
        figure = "figure" if path.suffix != ".csv" else "table"
        if path.suffix == ".png":
            marked.append(str(path))
            continue
        labels = {"analysis": kind, figure: name, **({"run or shape": key} if key else {})}
        marked.append(report(str(path), caption=f"../report/{ANALYSIS_CAPTIONS[name]}{'_figure' if figure == 'figure' else ''}.rst",
                             category="Analyses", subcategory=kind, labels=labels))
    return marked


def analysis_inputs(runs, metrics):
    inputs = {"manifest": rules.tokenize.output.manifest, "models": [str(layout.model_file(r)) for r in runs]}
    if metrics:
        inputs["metrics"] = [str(layout.metrics_file(r)) for r in runs]
    return inputs


def analysis_params(kind, runs):
    settings = jobs.analysis(config, kind)
    resources = config["analysis"]["resources"]
    return {
        "kind": kind,
        "analysis": as_json(settings["analysis"]),
        "train": as_json(settings["train"]),
        "tokens": lambda wildcards, input: Path(input.manifest).parent,
        "runs": shell_words(runs),
        "device": untracked("cuda" if resources["gpus"] else "cpu"),
    }


def analysis_resources(kind):
    """An analysis job's resources: memory and time limit from its size (streamback/sizes.py) or the config's."""
    resources = config["analysis"]["resources"]
    job = sizes.analysis_job(config, kind, RUNS, SIZE_VOCAB)
    return {
        "mem_mb": job["mem_mb"],
        "runtime": job["runtime"],
        "gpu": resources["gpus"] or None,
        "cpus_per_gpu": resources["threads"] if resources["gpus"] else None,
    }
