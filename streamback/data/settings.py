"""Which settings of the `data` section decide the token shards (what rule tokenize is given), and
whether the token directory already holds shards made with them.

Standard library only: the rule files import it through `streamback.jobs`, and the Snakefile and
`streamback check` ask it for the tokenized data's count before any job starts.
"""

from __future__ import annotations

import json

from streamback import layout

# the data section's keys that change no shard: where the shards go, processes, reading batch,
# resources, the budget check's sample
DATA_NOT_SETTINGS = ("corpus", "dir", "processes", "batch_documents", "mem_mb", "runtime", "budget_check")


def shard_settings(data: dict) -> dict:
    """Every key of the validated `data` section that decides the shards: the file list is the
    rule's input, the other sources' settings are left out."""
    settings = {k: v for k, v in data.items() if k not in DATA_NOT_SETTINGS}
    settings["local"] = {k: v for k, v in settings["local"].items() if k != "files"}  # files sources read text_unit too
    for source in ("hub", "synthetic"):
        if settings["source"] != source:
            del settings[source]
    return settings


def tokenized_train_split(data: dict) -> tuple[int, str] | None:
    """(train tokens, where) of the shards in the token directory of `data` when they are current:
    their manifest.json was made with these shard settings, from the input files `data` names,
    none of them newer than it (so Snakemake will not tokenize again); None before the data is
    tokenized, or when it will be again."""
    path = layout.tokens_dir(data) / "manifest.json"
    try:
        manifest = json.loads(path.read_text())
        made_with, read = shard_settings(manifest["config"]), [f["path"] for f in manifest["source"].get("files", [])]
        tokens, written = int(manifest["splits"]["train"]["tokens"]), path.stat().st_mtime
        inputs = layout.input_files(data)
        current = (
            made_with == shard_settings(data)
            and read == [str(f) for f in inputs]
            and all(f.stat().st_mtime <= written for f in inputs)
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return (tokens, f"the train split of {path.parent}") if current else None
