"""The run matrix of the `train` config section: which models are trained, and their names.

Every shape is trained with every block (`{shape}-{block}`, the study's six runs for three shapes
and two blocks); every extra stream format adds a StreamBack run whose stream is held in that
format (`{shape}-streamback-{format}`, e.g. `medium-streamback-mxfp8`, `fat-short-streamback-bf16_sr`).
Each run may override how it is executed (`per_run`: micro-batch size, activation
checkpointing, torch.compile, Slurm resources), never the recipe, so every run of a matrix is trained the same way. Standard library only: the
Snakemake rules import it to name their jobs.
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


def run_matrix(train_cfg: dict) -> dict[str, RunSpec]:
    """All runs of the validated `train` section, by name, in config order."""
    matrix = train_cfg["runs"]
    runs = {}
    for shape in matrix["shapes"]:
        for block in matrix["blocks"]:
            runs[f"{shape}-{block}"] = RunSpec(f"{shape}-{block}", shape, block, "fp32" if block == "streamback" else "bf16")
        for stream in matrix["streams"]:
            name = f"{shape}-streamback-{stream}"
            runs[name] = RunSpec(name, shape, "streamback", stream)
    unknown = set(train_cfg["per_run"]) - set(runs)
    if unknown:
        raise StreambackError(f"train.per_run names runs that are not in the matrix: {', '.join(sorted(unknown))} (runs: {', '.join(runs)})")
    return runs


def run_setting(train_cfg: dict, run: str, key: str):
    """`key` (micro_batch_size, activation_checkpointing, compile or resources) for `run`: its
    per_run override, else the section's."""
    override = train_cfg["per_run"].get(run, {})
    if key == "resources":
        return {**train_cfg["resources"], **override.get("resources", {})}
    return override.get(key, train_cfg[key])
