"""`streamback tokenize`: text in, token shards and manifest.json out (rule `tokenize`).

The source is a list of files (local files, or the data files of a hub dataset's config, such as
FineWeb's `sample/100BT/*.parquet`). Each file is read and encoded by one worker process (one
tokenizer thread each; `encode_batch_fast` without special tokens, then the end-of-document token
appended), which writes the file's tokens of each split to `parts/` under a temporary name and
renames them when the file is done; `parts/files.json` (written atomically) records the finished
files. The main process cuts each split's stream - the files' tokens in file order - into
fixed-size shards (the validation split's size is scaled by `val_fraction` so both splits finish
shards at a similar pace) and stops at its token budget, cutting the last document, so the
shards do not depend on the number of processes. A file's part is deleted once complete shards
hold all of its tokens, and `parts/` when the manifest is written.

Before any shard, a budget is checked against what the source holds (`budget.py`): one that
cannot fit is refused in seconds. Shards are written under a temporary name and renamed when
complete; each header records where in the stream it ends (file, token of that file's split) and
a fingerprint of what decides its bytes (config, source, tokenizer; not the budgets, so a shard
that lies within a smaller budget is the same shard). A rerun keeps the leading full shards with
that fingerprint that lie within the budget and whose tokens still match their sha256, deletes
the rest, and goes on from where the last kept one ends: files before it are not opened, nor
those whose part is finished; over a complete manifest it hashes every shard before it finds
nothing to do.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from itertools import chain
from pathlib import Path

import numpy as np

from streamback import __version__, layout
from streamback.config import add_config_arguments, section_from_args
from streamback.data import budget, worker_pool
from streamback.data import tokenizer as tk
from streamback.data.settings import DATA_NOT_SETTINGS
from streamback.data.shards import (
    FORMAT,
    HEADER_BYTES,
    SPLITS,
    TokenDataset,
    check_shard,
    file_sha256,
    np_dtype,
    read_manifest,
    shard_name,
    token_dtype,
    write_shard,
)
from streamback.data.sources import FILE_FORMATS, is_validation, open_source, read_file
from streamback.errors import StreambackError
from streamback.io import atomic_path, output_dir, remove, write_json, write_text
from streamback.progress import Progress

HELP = "tokenize the corpus (synthetic, local files or FineWeb) into token shards and manifest.json"

# Keys of the `data` section that do not change a shard's bytes: where they go and how the job
# runs (settings.py), and the budgets, which only say where the streams stop.
_NOT_IN_FINGERPRINT = (*DATA_NOT_SETTINGS, "train_tokens", "val_tokens")
_BUDGETS = ("train_tokens", "val_tokens")
_UNUSED_SOURCES = {"synthetic": ("hub", "local"), "local": ("hub", "synthetic"), "hub": ("local", "synthetic")}
PARTS = "parts"  # the finished files' tokens, under the token directory, until shards hold them
RECORD = "files.json"
RECORD_FORMAT = "streamback-tokenize-files/1"


# -- encoding (runs in the worker processes, or here when processes == 1) -----------------------

_WORKER: dict = {}


def _init_worker(tokenizer_json: str, eos_id: int, val_fraction: float) -> None:
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread per process: `processes` is the parallelism
    from tokenizers import Tokenizer

    _WORKER.update(tokenizer=Tokenizer.from_str(tokenizer_json), eos_id=eos_id, val_fraction=val_fraction)


def _encode(texts: list[str], ids: list) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Encode one batch: (is-validation flags, lengths incl. EOS, tokens) of its non-empty documents."""
    fraction = _WORKER["val_fraction"]
    keep = [i for i, text in enumerate(texts) if text and not text.isspace()]
    flags = [is_validation(ids[i] if ids[i] is not None else texts[i], fraction) for i in keep]
    encodings = _WORKER["tokenizer"].encode_batch_fast([texts[i] for i in keep], add_special_tokens=False)
    ids_lists = [e.ids for e in encodings]
    lengths = np.fromiter(map(len, ids_lists), np.int64, len(ids_lists)) + 1
    ends = np.cumsum(lengths)
    tokens = np.empty(int(ends[-1]) if len(ends) else 0, np.uint32)
    is_eos = np.zeros(tokens.size, bool)
    is_eos[ends - 1] = True
    tokens[~is_eos] = np.fromiter(chain.from_iterable(ids_lists), np.uint32, tokens.size - len(ids_lists))
    tokens[is_eos] = _WORKER["eos_id"]
    return np.asarray(flags, bool), lengths, tokens


def part_paths(parts: Path, index: int, split: str) -> tuple[Path, Path]:
    """(tokens, lengths) of file `index`'s part of `split`."""
    return parts / f"{index:06d}.{split}.tokens", parts / f"{index:06d}.{split}.lengths.npy"


def _encode_file(task: tuple) -> tuple[int, dict]:
    """Read and encode one whole file into its parts (renamed into place when complete); returns
    (its index, {split: [tokens, documents]})."""
    index, path, file_format, columns, batch_size, parts, dtype = task
    text_column, id_column, text_unit = columns
    counts = {}
    with (
        atomic_path(part_paths(parts, index, "train")[0]) as train_tmp,
        atomic_path(part_paths(parts, index, "val")[0]) as val_tmp,
    ):
        lengths = {"train": [], "val": []}
        with open(train_tmp, "wb") as train_out, open(val_tmp, "wb") as val_out:
            out = {"train": train_out, "val": val_out}
            empty = Path(path).is_file() and Path(path).stat().st_size == 0  # no rows: nothing to read
            for batch in [] if empty else read_file(path, file_format, text_column, id_column, text_unit, batch_size):
                flags, doc_lengths, tokens = _encode(batch.texts, batch.ids)
                for split, select in (("train", ~flags), ("val", flags)):
                    if select.any():
                        out[split].write(tokens[np.repeat(select, doc_lengths)].astype(np_dtype(dtype)).tobytes())
                        lengths[split].append(doc_lengths[select])
        for split in SPLITS:
            joined = np.concatenate(lengths[split]) if lengths[split] else np.zeros(0, np.int64)
            with atomic_path(part_paths(parts, index, split)[1]) as tmp, open(tmp, "wb") as f:
                np.save(f, joined)
            counts[split] = [int(joined.sum()), int(joined.size)]
    return index, counts


def _read_part(parts: Path, index: int, split: str, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    tokens_path, lengths_path = part_paths(parts, index, split)
    lengths = np.load(lengths_path)
    if tokens_path.stat().st_size == 0:
        return np.zeros(0, np_dtype(dtype)), lengths
    return np.memmap(tokens_path, dtype=np_dtype(dtype), mode="r"), lengths


class PartRecord:
    """`parts/files.json`: the files whose parts are complete ({index: {path, split: [tokens,
    documents]}}), the fingerprint they were made with, and the budgets the source was checked for."""

    def __init__(self, parts: Path, fingerprint: str):
        self.parts, self.path, self.fingerprint = parts, parts / RECORD, fingerprint
        self.files: dict[int, dict] = {}
        self.checked: list | None = None
        try:
            held = json.loads(self.path.read_text())
        except (OSError, ValueError):
            held = None
        if isinstance(held, dict) and held.get("format") == RECORD_FORMAT and held.get("fingerprint") == fingerprint:
            self.checked = held.get("checked")
            for key, entry in held.get("files", {}).items():
                if all(p.is_file() for split in SPLITS for p in part_paths(parts, int(key), split)):
                    self.files[int(key)] = entry
        for path in sorted(parts.glob("[0-9]*")):  # parts this record does not vouch for: written again
            if int(path.name.split(".")[0]) not in self.files:
                remove(path, parts)

    def save(self) -> None:
        write_json(
            self.path,
            {
                "format": RECORD_FORMAT,
                "fingerprint": self.fingerprint,
                "checked": self.checked,
                "files": {str(k): v for k, v in sorted(self.files.items())},
            },
        )

    def add(self, index: int, path: str, counts: dict) -> None:
        self.files[index] = {"path": path, **counts}
        self.save()

    def drop_before(self, index: int) -> None:
        """Delete the parts of files before `index` (shards hold all their tokens)."""
        gone = [k for k in self.files if k < index]
        for k in gone:
            del self.files[k]
        if gone:
            self.save()
        for path in sorted(self.parts.glob("[0-9]*")):
            if int(path.name.split(".")[0]) < index:
                remove(path, self.parts)


# -- one split's shards ---------------------------------------------------------------------


class SplitWriter:
    """Cuts one split's token stream into shards of `capacity` tokens, up to `budget` tokens."""

    def __init__(self, out_dir: Path, split: str, capacity: int, budget: int | None, meta: dict):
        self.out_dir, self.split, self.capacity, self.budget, self.meta = out_dir, split, capacity, budget, meta
        self.buffer = np.empty(capacity, np_dtype(meta["dtype"]))
        self.fill = self.total = self.documents = 0
        self.shards: list[dict] = []
        self.position: tuple[int, int] = (0, 0)  # (file, token of its split) where the next token comes from
        self.flushed: int = 0  # the file the last complete shard ends in: parts before it are not needed
        self.done = False

    def resume(self, say, threads: int = 1) -> None:
        """Keep the leading full shards made with the same fingerprint that lie within the budget
        and whose tokens still match the sha256 in their header (hashed `threads` at a time);
        delete the rest."""
        expect = {**self.meta, "split": self.split}
        headers = []
        while (path := self.out_dir / shard_name(self.split, len(headers))).exists():
            if self.budget is not None and (len(headers) + 1) * self.capacity > self.budget:
                break  # beyond a (lowered) budget: written again, cut where the budget ends
            try:
                header = check_shard(path, {**expect, "index": len(headers)})
            except StreambackError as err:
                say(f"not resuming from {path.name}: {err}")
                break
            if header["tokens"] != self.capacity:
                break  # the short last shard of a finished split: written again if the split goes on
            headers.append((path, header))
        with ThreadPoolExecutor(max(1, threads)) as pool:
            digests = pool.map(lambda path: file_sha256(path, HEADER_BYTES), [path for path, _ in headers])
            for (path, header), digest in zip(headers, digests):
                if digest != header["sha256"]:
                    say(
                        f"not resuming from {path.name}: the sha256 of its tokens differs from its header's (the file "
                        "changed after it was written); it and the shards after it are written again"
                    )
                    break
                self.shards.append({"file": path.name, "tokens": header["tokens"], "sha256": header["sha256"]})
                self.total += header["tokens"]
                self.documents = header["documents"]
                self.position = (header["next_file"], header["next_offset"])
        self.flushed = self.position[0]
        for stale in sorted(self.out_dir.glob(f"{self.split}-*.bin")):
            if stale.name not in {s["file"] for s in self.shards}:
                remove(stale, self.out_dir)
        self.done = self.budget is not None and self.total >= self.budget
        if self.shards:
            say(
                f"{self.split}: kept {len(self.shards)} complete shards ({self.total} tokens), resuming at file "
                f"{self.position[0]}, token {self.position[1]} of its {self.split} split"
            )

    def add_file(self, index: int, tokens: np.ndarray, lengths: np.ndarray) -> None:
        """File `index`'s tokens of this split (its documents of `lengths` tokens each, concatenated)."""
        if self.done or index < self.position[0]:
            return
        pos = self.position[1] if index == self.position[0] else 0
        n = int(tokens.size)
        starts = np.cumsum(lengths) - lengths
        while pos < n and not self.done:
            take = min(self.capacity - self.fill, n - pos)
            if self.budget is not None:
                take = min(take, self.budget - self.total)
            self.buffer[self.fill : self.fill + take] = tokens[pos : pos + take]
            self.documents += int(np.searchsorted(starts, pos + take) - np.searchsorted(starts, pos))
            self.fill, self.total, pos = self.fill + take, self.total + take, pos + take
            self.done = self.budget is not None and self.total >= self.budget
            if self.fill == self.capacity or self.done:
                self._flush(*((index, pos) if pos < n else (index + 1, 0)))
        self.position = (index + 1, 0)

    def finish(self, files: int) -> None:
        """The source is exhausted: write what is left as the last (short) shard."""
        if self.fill:
            self._flush(files, 0)

    def _flush(self, next_file: int, next_offset: int) -> None:
        name = shard_name(self.split, len(self.shards))
        meta = {
            **self.meta,
            "split": self.split,
            "index": len(self.shards),
            "documents": self.documents,
            "next_file": next_file,
            "next_offset": next_offset,
        }
        digest = write_shard(self.out_dir / name, self.buffer[: self.fill], meta)
        self.shards.append({"file": name, "tokens": self.fill, "sha256": digest})
        self.fill = 0
        self.flushed = next_file

    def entry(self) -> dict:
        return {"shards": self.shards, "tokens": self.total, "documents": self.documents, "shard_tokens": self.capacity}


# -- the stage ------------------------------------------------------------------------------


def identity(data: dict, source) -> dict:
    """What decides the shards' bytes: the `data` keys that matter and the source, with files
    named by content (sha256, size), not path, so moving a corpus keeps its shards. Not the
    budgets: they say where each split stops, and a shard within a budget is the same shard."""
    skip = set(_NOT_IN_FINGERPRINT) | set(_UNUSED_SOURCES[data["source"]])
    config = {k: v for k, v in data.items() if k not in skip}
    if "local" in config:
        config["local"] = {k: v for k, v in config["local"].items() if k != "files"}
    described = dict(source.description)
    if "files" in described:
        described["files"] = [{"bytes": f["bytes"], "sha256": f["sha256"]} for f in described["files"]]
    return {"format": FORMAT, "config": config, "source": described}


def val_shard_tokens(data: dict) -> int:
    """Validation shards: shard_tokens scaled by val_fraction, at least 65536 (or shard_tokens)."""
    return min(data["shard_tokens"], max(1 << 16, math.ceil(data["shard_tokens"] * data["val_fraction"])))


def _tokenizer(data: dict, source, say):
    """(tokenizer JSON, eos token, eos id, manifest entry, vocabulary size): the tokenizer trained
    on the training split (kind bpe) or loaded (hub, file)."""
    spec = data["tokenizer"]
    if spec["kind"] == "bpe":
        limit = spec["train_documents"]

        def training_texts():
            taken = 0
            for batch in source.batches(data["batch_documents"]):
                for text, doc_id in zip(batch.texts, batch.ids):
                    if (
                        text
                        and not text.isspace()
                        and not is_validation(doc_id if doc_id is not None else text, data["val_fraction"])
                    ):
                        yield text
                        taken += 1
                        if limit is not None and taken >= limit:
                            return

        t0 = time.monotonic()
        tokenizer = tk.train_bpe(training_texts(), spec["vocab_size"], spec["eos_token"] or tk.BPE_EOS)
        say(f"trained a byte-level BPE of {tokenizer.get_vocab_size()} tokens in {time.monotonic() - t0:.1f} s")
        entry = {"kind": "bpe", "vocab_size_asked": spec["vocab_size"], "train_documents": limit}
        where = "(trained BPE)"
    elif spec["kind"] == "hub":
        tokenizer, commit = tk.load_hub(spec["name"], spec["revision"])
        entry, where = (
            {"kind": "hub", "name": spec["name"], "revision": spec["revision"], "commit": commit},
            spec["name"],
        )
    else:
        if not spec["file"]:
            raise StreambackError("data.tokenizer.kind is 'file' but data.tokenizer.file is not set")
        tokenizer = tk.load_file(spec["file"])
        entry, where = {"kind": "file", "path": spec["file"]}, spec["file"]
    eos_token, eos = tk.eos_id(tokenizer, spec["eos_token"] or (tk.BPE_EOS if spec["kind"] == "bpe" else None), where)
    text = tokenizer.to_str()
    return (
        text,
        eos_token,
        eos,
        {**entry, "file": "tokenizer.json", "sha256": tk.sha256_text(text)},
        tokenizer.get_vocab_size(),
    )


def _clear_temporaries(out_dir: Path, say) -> None:
    """Remove, naming them, the temporary files a killed run left behind (never taken as complete, only clutter)."""
    for tmp in sorted(out_dir.glob(".*.tmp")):
        remove(tmp, out_dir)
        say(f"removed {tmp}, a temporary file of a tokenize that was killed")


def tokenize(
    data: dict,
    out_dir: str | Path,
    inputs: list[Path] | None = None,
    processes: int | None = None,
    progress: bool = True,
) -> dict:
    """Run the stage; returns the manifest (also written to `out_dir`/manifest.json)."""
    out_dir = Path(out_dir)
    processes = data["processes"] if processes is None else processes
    if processes < 1:
        raise StreambackError(f"processes must be at least 1, got {processes}")
    os.environ.setdefault("RAYON_NUM_THREADS", str(processes))  # BPE training threads

    def say(message: str) -> None:
        if progress:
            print(f"tokenize: {message}", file=sys.stderr, flush=True)

    source = open_source(data, inputs)
    with output_dir(
        out_dir, "token directory"
    ):  # checked before any work; removed if this run fails and leaves it empty
        return _tokenize(data, source, out_dir, processes, progress, say)


def source_files(source) -> list[tuple[str, str]]:
    """(path or URL, format) of every file of the source, in reading order: a local or synthetic
    source's files; a hub dataset's data files of its config and split, as `datasets` resolves
    them (a local copy's paths, or hf:// URLs at the resolved commit)."""
    if hasattr(source, "files"):
        return [(str(path), file_format) for path, file_format in source.files]
    import datasets  # imported here: only a hub source needs it to list its files

    revision = source.description.get("commit", source.revision)
    where = f"hub dataset {source.dataset} ({source.name}, split {source.split})"
    try:
        builder = datasets.load_dataset_builder(source.dataset, name=source.name, revision=revision)
    except Exception as err:  # datasets raises many types for a repository it cannot read
        raise StreambackError(f"{where} cannot be opened: {err}") from None
    files = [str(f) for f in builder.config.data_files.get(source.split, [])] if builder.config.data_files else []
    if not files:
        raise StreambackError(f"{where} has no data files for split {source.split!r} (data.hub.split)")
    formats = [FILE_FORMATS.get(Path(f).suffix.lower()) for f in files]
    if None in formats:
        raise StreambackError(f"{where}: data file {files[formats.index(None)]} has a format tokenize cannot read")
    return list(zip(files, formats))


def _check_budgets(data: dict, source, files, tokenizer_json: str, record: PartRecord, say) -> None:
    """Refuse budgets the source cannot hold (budget.py), before any shard; once a check passed
    for these budgets (recorded in parts/files.json), a resume does not open the files again."""
    budgets = [data[k] for k in _BUDGETS]
    if budgets == [None, None] or record.checked == budgets:
        return
    paths = [Path(p) for p, file_format in files]
    if not all(file_format == "parquet" and p.is_file() for p, (_, file_format) in zip(paths, files)):
        say("budgets not checked against the source before the work: it is not local parquet files")
        return
    from tokenizers import Tokenizer

    spec, t0 = data["budget_check"], time.monotonic()
    found = budget.estimate(
        paths,
        Tokenizer.from_str(tokenizer_json),
        data,
        spec["row_groups"],
        spec["documents_per_group"],
        spec["confidence"],
    )
    budget.check(data, found, _describe(source))
    say(
        f"the budgets fit ({time.monotonic() - t0:.1f} s): "
        + ", ".join(f"{s} {found.splits[s][0]:,.0f} tokens (at least {found.splits[s][1]:,.0f})" for s in SPLITS)
        + f" by {found.basis()}"
    )
    record.checked = budgets
    record.save()


def _tokenize(data: dict, source, out_dir: Path, processes: int, progress: bool, say) -> dict:
    _clear_temporaries(out_dir, say)
    files = source_files(source)
    tokenizer_json, eos_token, eos, tokenizer_entry, vocab_size = _tokenizer(data, source, say)
    dtype = token_dtype(vocab_size)
    fingerprint = tk.sha256_text(
        json.dumps(
            {**identity(data, source), "tokenizer_sha256": tokenizer_entry["sha256"], "eos_id": eos, "dtype": dtype},
            sort_keys=True,
        )
    )

    manifest_path = out_dir / "manifest.json"
    if manifest_path.exists():
        try:
            manifest = read_manifest(out_dir)
            asked = {k: data[k] for k in _BUDGETS}
            if manifest["fingerprint"] == fingerprint and {k: manifest["config"].get(k) for k in _BUDGETS} == asked:
                for split in SPLITS:  # every shard hashed against the manifest
                    dataset = TokenDataset(out_dir, split)
                    problems = dataset.accept(dataset.scan(dataset.unverified(), processes))
                    if problems:
                        raise StreambackError("; ".join(problems))
                say(
                    f"{manifest_path} is complete, matches the config and every shard matches its sha256: nothing to do"
                )
                return manifest
        except StreambackError as err:
            say(f"redoing {manifest_path}: {err}")
        remove(manifest_path, out_dir)

    parts = out_dir / PARTS  # made by the first file finished, so a refused budget leaves nothing
    for tmp in sorted(parts.glob(".*.tmp")):
        remove(tmp, parts)
        say(f"removed {tmp}, a temporary file of a tokenize that was killed")
    record = PartRecord(parts, fingerprint)
    _check_budgets(data, source, files, tokenizer_json, record, say)

    meta = {"dtype": dtype, "tokenizer_sha256": tokenizer_entry["sha256"], "fingerprint": fingerprint}
    writers = {
        "train": SplitWriter(out_dir, "train", data["shard_tokens"], data["train_tokens"], meta),
        "val": SplitWriter(out_dir, "val", val_shard_tokens(data), data["val_tokens"], meta),
    }
    for writer in writers.values():
        writer.resume(say, processes)
    budgets = [data["train_tokens"], data["val_tokens"]]
    left = sum(budgets) - sum(w.total for w in writers.values()) if None not in budgets else None
    meter = Progress("tokenize", left, unit="tokens", active=progress)
    documents = opened = 0
    try:
        documents, opened = _run(files, record, writers, data, tokenizer_json, eos, dtype, processes, meter)
    finally:
        meter.close()
    say(f"done: {documents:,} documents, {opened} of {len(files)} files read, {meter.line()}")

    if documents == 0 and not any(w.shards for w in writers.values()):
        remove(record.parts, out_dir)  # nothing to resume
        raise StreambackError(f"empty corpus: {_describe(source)} holds no document with text")
    for split, writer in writers.items():
        asked = writer.budget
        if asked is not None and writer.total < asked:
            raise StreambackError(
                f"{_describe(source)} ran out after {writer.total} {split} tokens, but data.{split}_tokens "
                f"asks for {asked}: lower the budget or add data"
            )
    for writer in writers.values():
        writer.finish(len(files))
        if not writer.total:
            raise StreambackError(
                f"the {writer.split} split of {_describe(source)} is empty: "
                f"no document hashed into it (data.val_fraction = {data['val_fraction']})"
            )
    manifest = {
        "format": FORMAT,
        "created_by": f"streamback {__version__}",
        "vocab_size": vocab_size,
        "eos_id": eos,
        "eos_token": eos_token,
        "dtype": dtype,
        "header_bytes": HEADER_BYTES,
        "tokenizer": tokenizer_entry,
        "splits": {split: writer.entry() for split, writer in writers.items()},
        "source": source.description,
        "config": data,
        "fingerprint": fingerprint,
    }
    write_text(
        out_dir / "tokenizer.json", tokenizer_json
    )  # with the manifest: a run that fails before leaves no stray files
    write_json(manifest_path, manifest)
    remove(parts, out_dir)
    say(
        f"wrote {manifest_path}: "
        + ", ".join(f"{s} {w.total} tokens in {len(w.shards)} shards" for s, w in writers.items())
    )
    return manifest


def _describe(source) -> str:
    d = source.description
    if d["kind"] == "hub":
        return f"hub dataset {d['dataset']} ({d['name']}, split {d['split']})"
    return f"{d['kind']} corpus {', '.join(f['path'] for f in d['files'])}"


def _run(
    files: list, record: PartRecord, writers: dict, data: dict, tokenizer_json: str, eos: int, dtype: str,
    processes: int, meter: Progress,
) -> tuple[int, int]:  # fmt: skip
    """Encode files (`processes` at a time, each by one worker) and cut their tokens into shards
    in file order until both splits are done or the files end; returns (documents taken, files
    opened). A file before the resume point, or whose part is finished, is not opened."""
    active = [w for w in writers.values() if not w.done]
    if not active:
        return 0, 0
    first = min(w.position[0] for w in active)
    record.drop_before(first)
    parts = record.parts
    columns = (data["text_column"], data["id_column"], data["local"]["text_unit"])
    todo = [k for k in range(first, len(files)) if k not in record.files]

    def task(k: int) -> tuple:
        return k, files[k][0], files[k][1], columns, data["batch_documents"], parts, dtype

    initargs = (tokenizer_json, eos, data["val_fraction"])
    pool = worker_pool(min(processes, max(1, len(todo))), _init_worker, initargs) if processes > 1 and todo else None
    if pool is None:
        _init_worker(*initargs)
    pending: dict = {}
    queue = iter(todo)
    documents = opened = 0

    def submit() -> None:
        nonlocal opened
        while pool is not None and len(pending) < 2 * processes and (k := next(queue, None)) is not None:
            pending[k] = pool.apply_async(_encode_file, (task(k),))
            opened += 1

    try:
        submit()
        for k in range(first, len(files)):
            if all(w.done for w in writers.values()):
                break
            if k not in record.files:
                if pool is None:
                    _, counts = _encode_file(task(k))
                    opened += 1
                else:
                    _, counts = pending.pop(k).get()
                record.add(k, files[k][0], counts)
            submit()
            for split, writer in writers.items():
                if writer.done:
                    continue
                tokens, lengths = _read_part(parts, k, split, dtype)
                before = writer.total
                writer.add_file(k, tokens, lengths)
                meter.update(writer.total - before, status=f"file {k + 1} of {len(files)}")
                documents += int(lengths.size)
                del tokens
            active = [w for w in writers.values() if not w.done]
            record.drop_before(min((w.flushed for w in active), default=len(files)))
    finally:
        if pool is not None:
            pool.terminate()
            pool.join()
    return documents, opened


def add_arguments(parser) -> None:
    add_config_arguments(parser, "data")
    parser.add_argument(
        "--out", type=Path, default=None, help="shard directory (default: data.dir or results/tokens/<corpus>)"
    )
    parser.add_argument(
        "--inputs",
        type=Path,
        nargs="*",
        default=None,
        help="corpus files to read instead of those the config names (synthetic or local source)",
    )
    parser.add_argument("--processes", type=int, default=None, help="encoding processes (default: data.processes)")
    parser.add_argument("--quiet", action="store_true", help="no progress output")


def run(args) -> int:
    data = section_from_args(args, "data")
    if args.processes is not None and args.processes < 1:
        raise StreambackError(f"--processes must be at least 1, got {args.processes}")
    tokenize(
        data, args.out or layout.tokens_dir(data), inputs=args.inputs, processes=args.processes, progress=not args.quiet
    )
    return 0
