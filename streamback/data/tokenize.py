"""`streamback tokenize`: text in, token shards and manifest.json out (rule `tokenize`).

The source's documents are read in order by this process, encoded by `processes` worker
processes (one tokenizer thread each; `encode_batch_fast` without special tokens, then the
end-of-document token appended), and written back in order, so the shards do not depend on the
number of processes. Each split is cut into fixed-size shards (the validation split's size is
scaled by `val_fraction` so both splits finish shards at a similar pace) and stops at its token
budget, cutting the last document. Shards are written under a temporary name and renamed when
complete; each header records where in the source stream it ends and a fingerprint of what
produced it (config, source, tokenizer). A rerun keeps the leading complete shards with the
same fingerprint whose tokens still match their sha256, deletes the rest and continues from the
recorded position; over a complete manifest it hashes every shard before it finds nothing to do.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from itertools import chain
from pathlib import Path

import numpy as np

from streamback import __version__, layout
from streamback.config import add_config_arguments, section_from_args
from streamback.data import tokenizer as tk
from streamback.data import worker_pool
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
from streamback.data.sources import is_validation, open_source
from streamback.errors import StreambackError
from streamback.io import output_dir, remove, write_json, write_text
from streamback.progress import Progress

HELP = "tokenize the corpus (synthetic, local files or FineWeb) into token shards and manifest.json"

# Keys of the `data` section that do not change what the shards hold.
_RUN_ONLY_KEYS = ("corpus", "dir", "processes", "batch_documents", "mem_mb", "runtime")
_UNUSED_SOURCES = {"synthetic": ("hub", "local"), "local": ("hub", "synthetic"), "hub": ("local", "synthetic")}


# -- encoding (runs in the worker processes, or here when processes == 1) -----------------------

_WORKER: dict = {}


def _init_worker(tokenizer_json: str, eos_id: int, val_fraction: float) -> None:
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread per process: `processes` is the parallelism
    from tokenizers import Tokenizer

    _WORKER.update(tokenizer=Tokenizer.from_str(tokenizer_json), eos_id=eos_id, val_fraction=val_fraction)


def _encode(task: tuple) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Encode one batch: (stream indices, is-validation flags, lengths incl. EOS, tokens) of
    its non-empty documents that belong to a split in `want` (train?, val?)."""
    start, texts, ids, want = task
    fraction = _WORKER["val_fraction"]
    index, flags = [], []
    for i, (text, doc_id) in enumerate(zip(texts, ids)):
        if text and not text.isspace():
            val = is_validation(doc_id if doc_id is not None else text, fraction)
            if want[val]:
                index.append(start + i)
                flags.append(val)
    encodings = _WORKER["tokenizer"].encode_batch_fast([texts[i - start] for i in index], add_special_tokens=False)
    ids_lists = [e.ids for e in encodings]
    lengths = np.fromiter(map(len, ids_lists), np.int64, len(ids_lists)) + 1
    ends = np.cumsum(lengths)
    tokens = np.empty(int(ends[-1]) if len(ends) else 0, np.uint32)
    is_eos = np.zeros(tokens.size, bool)
    is_eos[ends - 1] = True
    tokens[~is_eos] = np.fromiter(chain.from_iterable(ids_lists), np.uint32, tokens.size - len(ids_lists))
    tokens[is_eos] = _WORKER["eos_id"]
    return np.asarray(index, np.int64), np.asarray(flags, bool), lengths, tokens


# -- one split's shards ---------------------------------------------------------------------


class SplitWriter:
    """Cuts one split's token stream into shards of `capacity` tokens, up to `budget` tokens."""

    def __init__(self, out_dir: Path, split: str, capacity: int, budget: int | None, meta: dict):
        self.out_dir, self.split, self.capacity, self.budget, self.meta = out_dir, split, capacity, budget, meta
        self.buffer = np.empty(capacity, np_dtype(meta["dtype"]))
        self.fill = self.total = self.documents = 0
        self.shards: list[dict] = []
        self.resume_at: tuple[int, int] | None = None  # (stream index, tokens of it already written)
        self.done = False

    def resume(self, say, threads: int = 1) -> None:
        """Keep the leading complete shards made with the same fingerprint whose tokens still
        match the sha256 in their header (hashed `threads` at a time); delete the rest."""
        expect = {**self.meta, "split": self.split, "tokens": self.capacity}
        headers = []
        while (path := self.out_dir / shard_name(self.split, len(headers))).exists():
            try:
                headers.append((path, check_shard(path, {**expect, "index": len(headers)})))
            except StreambackError as err:
                say(f"not resuming from {path.name}: {err}")
                break
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
                self.resume_at = (header["next_document"], header["next_offset"])
        for stale in sorted(self.out_dir.glob(f"{self.split}-*.bin")):
            if stale.name not in {s["file"] for s in self.shards}:
                remove(stale, self.out_dir)
        self.done = self.budget is not None and self.total >= self.budget
        if self.shards:
            say(
                f"{self.split}: kept {len(self.shards)} complete shards ({self.total} tokens), resuming at document "
                f"{self.resume_at[0]}"
            )

    @property
    def start(self) -> int:
        return self.resume_at[0] if self.resume_at else 0

    def append(self, index: np.ndarray, lengths: np.ndarray, tokens: np.ndarray) -> None:
        """Documents `index` (stream order) with `lengths` tokens each, concatenated in `tokens`."""
        if self.done or not index.size:
            return
        skipped = np.zeros(index.size, np.int64)  # leading tokens of each document already in a kept shard
        if self.resume_at is not None:
            first, offset = self.resume_at
            if index[-1] < first:
                return
            keep = index >= first
            index, tokens, lengths = index[keep], tokens[np.repeat(keep, lengths)], lengths[keep].copy()
            skipped = skipped[keep]
            if index[0] == first and offset:
                tokens, lengths[0], skipped[0] = tokens[offset:], lengths[0] - offset, offset
            self.resume_at = None
        ends = np.cumsum(lengths)
        starts = ends - lengths
        pos, n = 0, int(ends[-1])
        while pos < n and not self.done:
            take = min(self.capacity - self.fill, n - pos)
            if self.budget is not None:
                take = min(take, self.budget - self.total)
            self.buffer[self.fill : self.fill + take] = tokens[pos : pos + take]
            begun = np.flatnonzero((starts >= pos) & (starts < pos + take) & (skipped == 0))
            self.documents += begun.size
            self.fill, self.total, pos = self.fill + take, self.total + take, pos + take
            self.done = self.budget is not None and self.total >= self.budget
            if self.fill == self.capacity or self.done:
                k = int(np.searchsorted(ends, pos, side="right"))
                self._flush(
                    *((int(index[k]), int(pos - starts[k] + skipped[k])) if k < index.size else (int(index[-1]) + 1, 0))
                )

    def finish(self, stream_end: int) -> None:
        """The source is exhausted: write what is left as the last (short) shard."""
        if self.fill:
            self._flush(stream_end, 0)

    def _flush(self, next_document: int, next_offset: int) -> None:
        name = shard_name(self.split, len(self.shards))
        meta = {
            **self.meta,
            "split": self.split,
            "index": len(self.shards),
            "documents": self.documents,
            "next_document": next_document,
            "next_offset": next_offset,
        }
        digest = write_shard(self.out_dir / name, self.buffer[: self.fill], meta)
        self.shards.append({"file": name, "tokens": self.fill, "sha256": digest})
        self.fill = 0

    def entry(self) -> dict:
        return {"shards": self.shards, "tokens": self.total, "documents": self.documents, "shard_tokens": self.capacity}


# -- the stage ------------------------------------------------------------------------------


def identity(data: dict, source) -> dict:
    """What decides the shards' content: the `data` keys that matter and the source, with
    files named by content (sha256, size), not path, so moving a corpus keeps its shards."""
    skip = set(_RUN_ONLY_KEYS) | set(_UNUSED_SOURCES[data["source"]])
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


def _tokenize(data: dict, source, out_dir: Path, processes: int, progress: bool, say) -> dict:
    _clear_temporaries(out_dir, say)
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
            if manifest["fingerprint"] == fingerprint:
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
    stream_end = nonempty = 0
    try:
        stream_end, nonempty = _run(source, writers, data, tokenizer_json, eos, processes, meter)
    finally:
        meter.close()
    say(f"done: {nonempty:,} documents, {meter.line()}")

    if nonempty == 0 and not any(w.shards for w in writers.values()):
        raise StreambackError(f"empty corpus: {_describe(source)} holds no document with text")
    for split, writer in writers.items():
        budget = writer.budget
        if budget is not None and writer.total < budget:
            raise StreambackError(
                f"{_describe(source)} ran out after {writer.total} {split} tokens, but data.{split}_tokens "
                f"asks for {budget}: lower the budget or add data"
            )
    for writer in writers.values():
        writer.finish(stream_end)
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
    source, writers: dict, data: dict, tokenizer_json: str, eos: int, processes: int, meter: Progress
) -> tuple[int, int]:
    """Stream, encode and write until both splits are done or the source ends; returns
    (stream index after the last document read, non-empty documents encoded)."""
    start = min(w.start for w in writers.values() if not w.done) if not all(w.done for w in writers.values()) else None
    if start is None:
        return 0, 0
    initargs = (tokenizer_json, eos, data["val_fraction"])
    pool = worker_pool(processes, _init_worker, initargs) if processes > 1 else None
    if pool is None:
        _init_worker(*initargs)
    batches = source.batches(data["batch_documents"])
    pending: deque = deque()
    stream_end = nonempty = 0

    def submit() -> bool:
        nonlocal stream_end
        for batch in batches:
            stream_end = batch.start + len(batch.texts)
            if stream_end <= start:
                continue  # before the resume point: read, not encoded
            task = (batch.start, batch.texts, batch.ids, (not writers["train"].done, not writers["val"].done))
            pending.append(pool.apply_async(_encode, (task,)) if pool else task)
            return True
        return False

    try:
        while len(pending) < 2 * processes and submit():
            pass
        while pending:
            item = pending.popleft()
            index, is_val, lengths, tokens = item.get() if pool else _encode(item)
            nonempty += index.size
            for split, select in (("train", ~is_val), ("val", is_val)):
                if select.any():
                    writers[split].append(index[select], lengths[select], tokens[np.repeat(select, lengths)])
            meter.update(int(tokens.size), status=f"{nonempty:,} documents")
            if all(w.done for w in writers.values()):
                break
            submit()
    finally:
        if pool is not None:
            pool.terminate()
            pool.join()
    return stream_end, nonempty


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
