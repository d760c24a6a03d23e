"""What the analyses read: the trained runs (or imported models) by name, and one batch of validation windows.

A `Subject` is one model the analyses look at: a run of the `train.runs` matrix (its model file,
its metrics.jsonl, its shape) or a model file named on the command line (e.g. one converted by
`streamback import-hf`), which has no training metrics and is its own "shape" in per-shape figures.
Every name asked for must exist: a run outside the matrix, or one not trained yet, is an error
naming it, before any work starts. Each model is read with the check that it belongs with the
tokens analysed (`read_subject`: `weights.check_corpus`, the check evaluate and export-hf make).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from streamback import layout
from streamback.data.shards import TokenDataset
from streamback.errors import StreambackError
from streamback.model.weights import TrainedModel, check_corpus, read_model
from streamback.runs import run_matrix
from streamback.train.batches import num_windows, read_windows, val_windows


@dataclass(frozen=True)
class Subject:
    name: str  # the run's name, or the name given to an imported model
    shape: str  # model shape (an imported model: its name)
    model: Path
    metrics: Path | None  # metrics.jsonl of a run; None for an imported model
    seed: int | None = None  # the run's training seed; None for an imported model


def subjects(train_cfg: dict, runs: list[str] | None = None, models: list[str] = ()) -> list[Subject]:
    """The runs named (default: every run of the matrix) and the `NAME=PATH` model files, checked to exist."""
    matrix = run_matrix(train_cfg)
    out = []
    for name in matrix if runs is None else runs:
        if name not in matrix:
            raise StreambackError(f"run {name!r} is not in the train.runs matrix: {', '.join(matrix)}")
        out.append(
            Subject(name, matrix[name].shape, layout.model_file(name), layout.metrics_file(name), matrix[name].seed)
        )
    for item in models:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise StreambackError(
                f"--model {item!r}: expected NAME=PATH, e.g. llama-3.2-1b=results/imported/llama-3.2-1b/model.pt"
            )
        layout.checked_name(name, "--model name")  # it names the model's figures
        out.append(Subject(name, name, Path(path), None))
    names = [s.name for s in out]
    if len(set(names)) < len(names):
        raise StreambackError(f"a model is named twice: {', '.join(sorted({n for n in names if names.count(n) > 1}))}")
    for s in out:
        if not s.model.is_file():
            raise StreambackError(
                f"run {s.name} has not been trained: {s.model} does not exist (rule train: "
                f"snakemake {layout.summary_file(s.name)})"
                if s.metrics
                else f"model {s.name}: {s.model} does not exist"
            )
        if s.metrics is not None and not s.metrics.is_file():
            raise StreambackError(f"run {s.name}: {s.metrics} does not exist (the run did not finish: rule train)")
    return out


def validation_batch(tokens_dir: str | Path, seq_len: int, size: int) -> torch.Tensor:
    """The first `size` windows of the validation split, [size, seq_len + 1] int64 (inputs and next-token targets)."""
    dataset = TokenDataset(tokens_dir, "val")
    n = num_windows(dataset.num_tokens, seq_len)
    if n < size:
        raise StreambackError(
            f"{tokens_dir}: the val split holds {n} windows of {seq_len} tokens, "
            f"fewer than the {size} asked for (analysis.batch_size or analysis.loss_windows)"
        )
    return read_windows(dataset, val_windows(n, size, 0, 1), seq_len)


def read_subject(subject: Subject, tokens_dir: str | Path) -> TrainedModel:
    """The subject's model file (`weights.read_model`), checked to belong with the tokenized
    corpus in `tokens_dir` (`weights.check_corpus`: its tokenizer and corpus, as the file records
    them, and a vocabulary that fits the embedding)."""
    trained = read_model(subject.model)
    check_corpus(trained, subject.model, tokens_dir)
    return trained
