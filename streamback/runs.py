"""The run matrix of the `train` config section: which models are trained, and their names.

Every shape is trained with every block (`{shape}-{block}`, the paper's six runs for three shapes
and two blocks); every extra stream format adds, per shape of `stream_shapes` (default: every
shape; a mapping gives each format its own shapes), a StreamBack run whose stream is held in
that format (`{shape}-streamback-{format}`, e.g. `medium-streamback-mxfp8`,
`fat-short-streamback-bf16_sr`). These are the run *arms*; each is trained once per training
seed of `seeds` (`stream_seeds` for the stream formats' arms; default: train.seed alone). A seed
fixes the initial weights and the batch order (`seeds_vary`: both, or only one of them, the
other staying train.seed's), so within a seed every run of a
shape starts from the same weights and sees the same batches: the comparisons stay paired. The
run of train.seed keeps the arm's name; another seed k adds `-seed<k>` (`tiny-medium-baseline-seed1`),
so adding seeds renames nothing and trains only the new runs.
Each run may override how it is executed (`per_run`: micro-batch size, activation
checkpointing, torch.compile, Slurm resources), never the recipe, so every run of a matrix is trained the same way.
Standard library only: the
Snakemake rules import it to name their jobs.

`check_runs` is the one cross-key check of the model, train and data sections: every run of the
matrix can be built (its shape exists and its heads fit its width) and trained (the sequence
fits the model, the batch splits into micro-batches on every process, the schedule fits the
steps, the data holds the token budget: data.train_tokens, or the tokenized data's own count
once it is tokenized). The Snakefile calls it before any job starts (so `snakemake -n` fails on
it) and `streamback train` before it touches anything.
"""

from __future__ import annotations

from dataclasses import dataclass

from streamback.errors import StreambackError


@dataclass(frozen=True)
class RunSpec:
    name: str
    shape: str
    block: str
    stream: str  # a StreamFormat label (the schema lists them); the baseline's is "bf16", its compute dtype's
    seed: int = 0  # the run's training seed (train.runs.seeds)
    init_seed: int = 0  # seeds the initial weights
    data_seed: int = 0  # seeds the batch order and stochastic rounding
    arm: str = ""  # the name less its seed: `{shape}-{block}` or `{shape}-streamback-{stream}`


def seed_suffix(seed: int, base_seed: int) -> str:
    """What a run of `seed` adds to its arm's name: nothing for train.seed, `-seed<k>` for the others."""
    return "" if seed == base_seed else f"-seed{seed}"


def run_matrix(train_cfg: dict) -> dict[str, RunSpec]:
    """All runs of the validated `train` section, by name, in config order (each arm, then its seeds)."""
    matrix = train_cfg["runs"]
    stream_shapes = streams_shapes(matrix)
    outside = list(dict.fromkeys(s for shapes in stream_shapes.values() for s in shapes if s not in matrix["shapes"]))
    if outside and matrix["streams"]:
        raise StreambackError(
            f"train.runs.stream_shapes names shapes that are not in train.runs.shapes: {', '.join(outside)} "
            "(name some of train.runs.shapes, null for every shape, or set train.runs.streams: [])"
        )
    base = train_cfg["seed"]
    seeds = matrix["seeds"] if matrix["seeds"] is not None else [base]
    stream_seeds = matrix["stream_seeds"] if matrix["stream_seeds"] is not None else seeds
    vary = matrix["seeds_vary"]
    runs = {}

    def add(arm, shape, block, stream, arm_seeds):
        for seed in arm_seeds:
            name = arm + seed_suffix(seed, base)
            runs[name] = RunSpec(
                name,
                shape,
                block,
                stream,
                seed,
                base if vary == "data" else seed,
                base if vary == "init" else seed,
                arm,
            )

    for shape in matrix["shapes"]:
        for block in matrix["blocks"]:
            add(f"{shape}-{block}", shape, block, "fp32" if block == "streamback" else "bf16", seeds)
        for stream in (s for s in matrix["streams"] if shape in stream_shapes[s]):
            add(f"{shape}-streamback-{stream}", shape, "streamback", stream, stream_seeds)
    unknown = set(train_cfg["per_run"]) - set(runs)
    if unknown:
        raise StreambackError(
            f"train.per_run names runs that are not in the matrix: {', '.join(sorted(unknown))} (runs: "
            f"{', '.join(runs)})"
        )
    return runs


def streams_shapes(matrix: dict) -> dict[str, list[str]]:
    """The shapes each stream of train.runs.streams is trained on, from train.runs.stream_shapes: null
    (every shape), a list (the same shapes for every stream) or a mapping from each stream to its
    own list (the dose tier's bf16_sr at the large dose, mxfp8 and nvfp4 at dose 1). A mapping names
    exactly the streams of train.runs.streams (StreambackError otherwise)."""
    streams, chosen = matrix["streams"], matrix["stream_shapes"]
    if not isinstance(chosen, dict):
        return {stream: list(matrix["shapes"] if chosen is None else chosen) for stream in streams}
    missing, extra = [s for s in streams if s not in chosen], [s for s in chosen if s not in streams]
    if missing or extra:
        raise StreambackError(
            "train.runs.stream_shapes, a mapping, must name exactly the streams of train.runs.streams "
            f"({', '.join(streams) or 'none'}): "
            + "; ".join(
                ([f"missing {', '.join(missing)}"] if missing else [])
                + ([f"{', '.join(extra)} not in train.runs.streams"] if extra else [])
            )
        )
    return {stream: list(chosen[stream]) for stream in streams}


def comparisons(runs: dict[str, RunSpec]) -> list[tuple[str, str, str]]:
    """(shape, baseline run, other run) for every other run that has a baseline run of its shape and
    seed (the two started from the same weights and saw the same batches), in matrix order; the
    comparison's name is the other run's arm less its shape (`streamback`, `streamback-mxfp8`).
    The analyses compare each such pair (baseline minus other)."""
    baselines = {(spec.shape, spec.seed): name for name, spec in runs.items() if spec.block == "baseline"}
    return [
        (spec.shape, baselines[spec.shape, spec.seed], name)
        for name, spec in runs.items()
        if spec.block != "baseline" and (spec.shape, spec.seed) in baselines
    ]


def comparison_name(spec: RunSpec) -> str:
    """The comparison a non-baseline run stands for, the same for all its seeds: its arm less its shape."""
    return spec.arm.removeprefix(f"{spec.shape}-")


def run_setting(train_cfg: dict, run: str, key: str):
    """`key` (micro_batch_size, activation_checkpointing, compile or resources) for `run`: its
    per_run override, else the section's."""
    override = train_cfg["per_run"].get(run, {})
    if key == "resources":
        return {**train_cfg["resources"], **override.get("resources", {})}
    return override.get(key, train_cfg[key])


def is_reversible(train_cfg: dict, spec: RunSpec) -> bool:
    """Does this run keep its stream reversibly? train.reversible applies to fp32-stream StreamBack runs only."""
    return bool(train_cfg["reversible"]) and spec.block == "streamback" and spec.stream == "fp32"


def run_processes(train_cfg: dict, run: str) -> int:
    """How many training processes the rule starts for `run`: per node one per GPU, or
    `processes` on the CPU; times the nodes."""
    res = run_setting(train_cfg, run, "resources")
    return (res["gpus"] or res["processes"]) * res["nodes"]


def num_windows(num_tokens: int, seq_len: int) -> int:
    """How many windows of seq_len + 1 tokens (overlapping by one) a split of num_tokens holds."""
    return max(0, (num_tokens - 1) // seq_len)


def train_steps(train_cfg: dict) -> int:
    """Optimizer steps of a run: train.tokens // (batch_size x seq_len)."""
    return train_cfg["tokens"] // (train_cfg["batch_size"] * train_cfg["seq_len"])


def snapshot_steps(train_cfg: dict, eval_cfg: dict) -> list[int]:
    """The earlier steps whose models a run writes for `eval.last_checkpoints` (ascending; none for
    k = 1): the final step minus 1, 2, ... k-1 times `eval.checkpoint_spacing`. StreambackError,
    naming both keys, when they do not all lie after step 0."""
    k, spacing, steps = eval_cfg["last_checkpoints"], eval_cfg["checkpoint_spacing"], train_steps(train_cfg)
    if (k - 1) * spacing >= steps:
        raise StreambackError(
            f"eval.last_checkpoints ({k}) and eval.checkpoint_spacing ({spacing}) reach back "
            f"(k-1) x spacing = {(k - 1) * spacing} steps, but a run has {steps}: lower one of them"
        )
    return [steps - j * spacing for j in range(k - 1, 0, -1)]


def data_passes(train_cfg: dict, split_tokens: int) -> float:
    """How many times a run reads a train split of `split_tokens` tokens: its steps x batch_size
    windows over the windows the split holds (inf if it holds none)."""
    windows = num_windows(split_tokens, train_cfg["seq_len"])
    needed = train_steps(train_cfg) * train_cfg["batch_size"]
    return needed / windows if windows else float("inf")


def token_budget_problem(train_cfg: dict, split_tokens: int, where: str) -> str | None:
    """Why a run cannot train on a train split of `split_tokens` tokens (`where` names it), or
    None: it would read some windows more than once and train.repeat_data does not allow it."""
    passes = data_passes(train_cfg, split_tokens)
    if passes <= 1 or (train_cfg["repeat_data"] and passes < float("inf")):
        return None
    steps, batch, seq_len = train_steps(train_cfg), train_cfg["batch_size"], train_cfg["seq_len"]
    if passes == float("inf"):
        return (
            f"{where} holds {split_tokens:,} tokens, less than one window of train.seq_len + 1 = {seq_len + 1} tokens"
        )
    return (
        f"train.tokens ({train_cfg['tokens']:,}) takes {steps:,} steps x {batch} windows of {seq_len + 1} tokens = "
        f"{steps * batch:,} windows, but {where} holds {split_tokens:,} tokens = "
        f"{num_windows(split_tokens, seq_len):,} "
        f"windows: the run would read its data {passes:.2f} times. Lower train.tokens, tokenize more data "
        "(data.train_tokens), or set train.repeat_data: true to repeat it on purpose"
    )


def check_wsd(total_steps: int, warmup_steps: int, decay_steps: int) -> None:
    """Raise if the phases do not fit in the run (`train.schedule` in the config)."""
    if total_steps < 1:
        raise StreambackError(f"train: the run has {total_steps} steps; it needs at least one (raise train.tokens)")
    if warmup_steps + decay_steps > total_steps:
        raise StreambackError(
            f"train.schedule: warmup_steps ({warmup_steps}) + decay_steps ({decay_steps}) exceed the run's "
            f"{total_steps} steps (train.tokens / tokens per step)"
        )


def shape_problems(dim: int, n_heads: int, n_kv_heads: int, head_dim: int | None = None) -> list[str]:
    """Why a model of this width and these heads cannot be built (empty if it can): grouped-query
    attention needs n_kv_heads to divide n_heads; RoPE rotates pairs, so head_dim (given, e.g. by an
    imported model, or dim // n_heads) must be even and at least 2. `ModelArgs` raises the same."""
    problems = []
    if n_heads % n_kv_heads:
        problems.append(
            f"n_heads ({n_heads}) must be a multiple of n_kv_heads ({n_kv_heads}) (grouped-query attention)"
        )
    if head_dim is not None:
        if head_dim < 2 or head_dim % 2:
            problems.append(f"head_dim {head_dim} must be even and at least 2 (RoPE rotates pairs)")
        return problems
    head_dim = dim // n_heads
    if head_dim < 2:
        problems.append(
            f"head_dim = dim // n_heads = {dim} // {n_heads} = {head_dim} is too small: RoPE rotates pairs, "
            "so it must be at least 2; raise dim or lower n_heads"
        )
    elif head_dim % 2:
        problems.append(
            f"head_dim = dim // n_heads = {dim} // {n_heads} = {head_dim} is odd: RoPE rotates pairs, so it must be "
            f"even"
        )
    return problems


def check_runs(
    train_cfg: dict,
    model_cfg: dict,
    data_cfg: dict | None = None,
    processes: int | None = None,
    only: str | None = None,
    tokenized: tuple[int, str] | None = None,
) -> None:
    """Raise StreambackError listing, one line each, every reason a run of the matrix (or only the
    run `only`) cannot be built or trained with these validated sections. `processes`: the number
    of training processes (default: each run's from train.resources); `data_cfg` adds the static
    data checks (token budgets given in it; the trainer checks the tokenized counts itself), and
    `tokenized`, the (train tokens, where) of data already tokenized with these settings
    (`data.settings.tokenized_train_split`), the token budget against that count."""
    problems = []
    try:
        runs = run_matrix(train_cfg)
    except StreambackError as err:
        problems.append(str(err))
        runs = {}
    if only is not None:
        if only not in runs and runs:
            problems.append(f"run {only!r} is not in the train.runs matrix: {', '.join(runs)}")
        runs = {name: spec for name, spec in runs.items() if name == only}
    shapes = model_cfg["shapes"]
    for shape in dict.fromkeys(spec.shape for spec in runs.values()):
        if shape not in shapes:
            problems.append(f"train.runs.shapes: {shape!r} is not a shape of model.shapes ({', '.join(shapes)})")
            continue
        s = shapes[shape]
        problems += [f"model.shapes.{shape}: {p}" for p in shape_problems(s["dim"], s["n_heads"], s["n_kv_heads"])]
        dose = s.get("embedding_init_std", model_cfg["embedding_init_std"])
        if model_cfg["tied_embeddings"] and dose != 1.0:
            problems.append(
                f"model.shapes.{shape}: embedding_init_std {dose} has no effect with model.tied_embeddings (the "
                "shared matrix gets the output projection's init): leave it at 1 or untie the embeddings"
            )
    seq_len, batch = train_cfg["seq_len"], train_cfg["batch_size"]
    if seq_len > model_cfg["max_seq_len"]:
        problems.append(
            f"train.seq_len ({seq_len}) exceeds model.max_seq_len ({model_cfg['max_seq_len']}), the length of "
            "RoPE's table: raise model.max_seq_len or lower train.seq_len"
        )
    try:
        check_wsd(train_steps(train_cfg), train_cfg["schedule"]["warmup_steps"], train_cfg["schedule"]["decay_steps"])
    except StreambackError as err:
        problems.append(str(err))
    gpu_processes = [
        name for name in runs if (res := run_setting(train_cfg, name, "resources"))["gpus"] and res["processes"] > 1
    ]
    if gpu_processes:
        problems.append(
            "train.resources.processes is for CPU runs (gpus = 0); a GPU run starts one process per GPU, so "
            f"leave processes at 1 for {', '.join(gpu_processes)}"
        )
    split = {}  # (micro-batch size, processes) -> runs whose batch does not split that way
    for name in runs:
        micro, procs = run_setting(train_cfg, name, "micro_batch_size"), processes or run_processes(train_cfg, name)
        if batch % (micro * procs):
            split.setdefault((micro, procs), []).append(name)
    for (micro, procs), names in split.items():
        problems.append(
            f"train.batch_size ({batch}) must be a multiple of micro_batch_size ({micro}) x processes ({procs}) "
            f"= {micro * procs}; it is not for {', '.join(names)}"
        )
    if data_cfg is not None and runs:
        split_tokens, where = tokenized or (data_cfg["train_tokens"], "data.train_tokens")
        if split_tokens is not None:
            problem = token_budget_problem(train_cfg, split_tokens, where)
            problems += [problem] if problem else []
        most = max(processes or run_processes(train_cfg, name) for name in runs)
        if data_cfg["val_tokens"] is not None and num_windows(data_cfg["val_tokens"], seq_len) < most:
            problems.append(
                f"data.val_tokens ({data_cfg['val_tokens']}) holds fewer than one validation sequence of "
                f"train.seq_len + 1 = {seq_len + 1} tokens per process ({most})"
            )
    if problems:
        raise StreambackError("the runs cannot be trained as configured:\n  " + "\n  ".join(problems))
