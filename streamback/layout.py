"""Where the data stage reads and writes, from the config's `data` section (stdlib only: the
Snakemake rules import it to name their inputs and outputs, the CLI to find its defaults)."""

from __future__ import annotations

import glob
from pathlib import Path


def tokens_dir(data: dict) -> Path:
    """The shard directory: `data.dir`, or results/tokens/<corpus>/."""
    return Path(data["dir"]) if data.get("dir") else Path("results") / "tokens" / data["corpus"]


def corpus_dir(data: dict) -> Path:
    """Where the synthetic corpus's parquet files go: results/corpus/<corpus>/."""
    return Path("results") / "corpus" / data["corpus"]


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
