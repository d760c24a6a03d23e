"""Token shards and their manifest: the data stage's output, the trainer's input.

A shard `<split>-<index:05d>.bin` is a 1024-byte header followed by its tokens, little-endian
uint16 when the vocabulary fits (else uint32). The header is the magic b"SBTOKv1\\n", a JSON
object (dtype, tokens, split, index, tokenizer_sha256, fingerprint, and where in the source
stream the shard ends, for resuming, and the sha256 of the token bytes), padded with spaces and
ended by a newline. `manifest.json` beside the shards lists every shard with its token count and
that sha256 (check one with `tail -c +1025 train-00000.bin | sha256sum`), the vocabulary size,
the end-of-document id, the dtype, the tokenizer file, the exact source and the config.

`TokenDataset(data_dir, split)` checks the shards against the manifest and reads any token
range as int64 through memory maps. Verification - the sha256 of every shard's tokens against the
manifest and every token id against the vocabulary - lives here and nowhere else: a process
hashes a shard once (`_VERIFIED` remembers it by path and file stamp), and the trainer shares the
work among its ranks and keeps a verification record so that a resume re-hashes only shards whose
file changed since (`unverified`, `scan`, `accept`, `read_record`/`write_record`).
"""

from __future__ import annotations

import bisect
import hashlib
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from streamback.errors import StreambackError
from streamback.io import atomic_path, read_json, write_json

MAGIC = b"SBTOKv1\n"
HEADER_BYTES = 1024
FORMAT = "streamback-tokens/1"
RECORD_FORMAT = "streamback-verified-shards/1"
SPLITS = ("train", "val")
_BLOCK = 1 << 24  # bytes read at a time when hashing (a multiple of every token size)

# Shards this process has hashed and found good: resolved path -> (file stamp, sha256, largest id).
_VERIFIED: dict[str, tuple[list[int], str, int]] = {}


def token_dtype(vocab_size: int) -> str:
    """'uint16' when every id fits, else 'uint32'."""
    return "uint16" if vocab_size <= 1 << 16 else "uint32"


def np_dtype(name: str) -> np.dtype:
    """The numpy dtype of a shard's tokens: `name` ('uint16' or 'uint32'), little-endian."""
    return np.dtype(name).newbyteorder("<")


def shard_name(split: str, index: int) -> str:
    return f"{split}-{index:05d}.bin"


def encode_header(meta: dict) -> bytes:
    body = json.dumps(meta, sort_keys=True, separators=(",", ":")).encode()
    room = HEADER_BYTES - len(MAGIC) - 1
    if len(body) > room:
        raise ValueError(f"shard header of {len(body)} bytes exceeds {room}")
    return MAGIC + body + b" " * (room - len(body)) + b"\n"


def read_header(path: str | Path) -> dict:
    """A shard's header as a dict; StreambackError naming the file if it is not a shard."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            raw = f.read(HEADER_BYTES)
    except OSError as err:
        raise StreambackError(f"shard {path} cannot be read: {err}") from None
    if len(raw) < HEADER_BYTES or not raw.startswith(MAGIC):
        raise StreambackError(f"shard {path} has no streamback header (truncated or not a token shard)")
    try:
        return json.loads(raw[len(MAGIC) :].decode())
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise StreambackError(f"shard {path} has a corrupt header") from None


def write_shard(path: str | Path, tokens: np.ndarray, meta: dict) -> str:
    """Write header + tokens atomically (temporary name, renamed when complete) and return the
    sha256 of the token bytes, which the header records too. `meta` gives the dtype."""
    data = np.ascontiguousarray(tokens, dtype=np_dtype(meta["dtype"])).tobytes()
    digest = hashlib.sha256(data).hexdigest()
    header = encode_header({**meta, "tokens": int(tokens.size), "sha256": digest})
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(header)
            f.write(data)
    return digest


def file_sha256(path: str | Path, offset: int = 0) -> str:
    """sha256 of a file's bytes from `offset` on."""
    digest, block = hashlib.sha256(), bytearray(_BLOCK)
    view = memoryview(block)
    with open(path, "rb", buffering=0) as f:
        f.seek(offset)
        while n := f.readinto(block):
            digest.update(view[:n])
    return digest.hexdigest()


def scan_tokens(path: str | Path, dtype: np.dtype) -> tuple[str, int]:
    """(sha256 of a shard's token bytes, its largest token id, -1 if it has none), in one read."""
    digest, top = hashlib.sha256(), -1
    block = bytearray(_BLOCK)
    view = memoryview(block)
    with open(path, "rb", buffering=0) as f:
        f.seek(HEADER_BYTES)
        while n := f.readinto(block):
            digest.update(view[:n])  # hashlib and numpy release the GIL: threads scan shards in parallel
            whole = n - n % dtype.itemsize
            if whole:
                top = max(top, int(np.frombuffer(view[:whole], dtype=dtype).max()))
    return digest.hexdigest(), top


def file_stamp(path: str | Path) -> list[int]:
    """[size, mtime_ns, ctime_ns, inode]: what the filesystem says about a file's contents. Any
    write changes it (ctime cannot be set back), and so does a copy or a restore."""
    st = os.stat(path)
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def read_record(path: str | Path) -> dict:
    """A verification record (`write_record`): {resolved shard path: {"stamp", "sha256", "max_id"}};
    empty if it is missing or unreadable (then everything is hashed again)."""
    try:
        record = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    return record.get("shards", {}) if isinstance(record, dict) and record.get("format") == RECORD_FORMAT else {}


def write_record(path: str | Path, shards: dict) -> None:
    write_json(path, {"format": RECORD_FORMAT, "shards": shards})


def check_shard(path: Path, expect: dict, manifest: Path | None = None) -> dict:
    """The header of `path` after checking its size and every field in `expect` against it.
    `manifest`: the manifest.json `expect` comes from, which a disagreement then names beside the
    shard, saying which of the two was written later (else `expect` is what this config gives)."""
    header = read_header(path)
    for key, value in expect.items():
        if header.get(key) == value:
            continue
        if manifest is None:
            raise StreambackError(f"shard {path}: header says {key}={header.get(key)!r}, this config gives {value!r}")
        newer, older = (manifest, path) if manifest.stat().st_mtime > path.stat().st_mtime else (path, manifest)
        raise StreambackError(
            f"shard {path} and {manifest} disagree on its {key}: the shard's header records {_short(header.get(key))}, "
            f"the "
            f"manifest {_short(value)}; {newer.name} was written after {older.name} (so {newer.name} is the one that "
            f"changed, or "
            "the other is a copy from another tokenize): rerun tokenize (`snakemake --forcerun tokenize`) to write "
            "both again"
        )
    size = HEADER_BYTES + header["tokens"] * np_dtype(header["dtype"]).itemsize
    actual = path.stat().st_size
    if actual != size:
        raise StreambackError(
            f"shard {path} is {actual} bytes, its header promises {size} ({header['tokens']} tokens of "
            f"{header['dtype']})"
        )
    return header


# what a manifest must hold (section -> keys; None: the top level), as tokenize writes it
MANIFEST_KEYS = {
    None: ("vocab_size", "eos_id", "dtype", "tokenizer", "splits", "fingerprint"),
    "tokenizer": ("file", "sha256"),
    "splits": SPLITS,
}


def _short(value) -> str:
    """A header or manifest value for a message: a hash by its first 16 digits."""
    return f"{value[:16]}..." if isinstance(value, str) and len(value) > 20 else repr(value)


def read_manifest(data_dir: str | Path) -> dict:
    """The manifest.json of a tokenized corpus, checked to hold every key MANIFEST_KEYS names."""
    path = Path(data_dir) / "manifest.json"
    remedy = "rerun tokenize (`streamback tokenize`, or `snakemake --forcerun tokenize`) to write it again"
    manifest = read_json(path, "run `streamback tokenize` (rule tokenize) first")
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise StreambackError(
            f"{path}: format {manifest.get('format') if isinstance(manifest, dict) else None!r} is not {FORMAT!r}"
        )
    for section, keys in MANIFEST_KEYS.items():
        held = manifest if section is None else manifest.get(section)
        missing = [key for key in keys if not isinstance(held, dict) or key not in held]
        if missing:
            where = "" if section is None else f"'s {section}"
            raise StreambackError(
                f"{path}{where} lacks {', '.join(map(repr, missing))} (edited, or not written by tokenize): {remedy}"
            )
    return manifest


class TokenDataset:
    """One split of a tokenized corpus, read through memory maps.

    Opening checks every shard against the manifest (header fields and file size). Before a
    shard's tokens are first read, the sha256 of its tokens is checked against the manifest and
    every token id against the vocabulary (once per process, so reading a few windows costs only
    the shards they touch); a StreambackError names the shard that does not match. `verify()`
    checks every shard up front (`threads` at a time) and names every bad one; the trainer does
    the same with `unverified`, `scan` and `accept`, sharing the hashing among its ranks.
    `verify=False` reads without checking (for tests of the checks themselves).
    """

    def __init__(self, data_dir: str | Path, split: str, verify: bool = True):
        if split not in SPLITS:
            raise StreambackError(f"unknown split {split!r}; a tokenized corpus has {', '.join(SPLITS)}")
        self.data_dir = Path(data_dir)
        self.manifest = read_manifest(self.data_dir)
        self.vocab_size: int = self.manifest["vocab_size"]
        self.eos_id: int = self.manifest["eos_id"]
        self.dtype = np_dtype(self.manifest["dtype"])
        entries = self.manifest["splits"][split]["shards"]
        self.paths = [self.data_dir / entry["file"] for entry in entries]
        for index, (path, entry) in enumerate(zip(self.paths, entries)):
            if not path.is_file():
                raise StreambackError(f"shard {path} listed in {self.data_dir / 'manifest.json'} is missing")
            check_shard(
                path,
                {
                    "dtype": self.manifest["dtype"],
                    "tokens": entry["tokens"],
                    "sha256": entry["sha256"],
                    "split": split,
                    "index": index,
                    "tokenizer_sha256": self.manifest["tokenizer"]["sha256"],
                    "fingerprint": self.manifest["fingerprint"],
                },
                manifest=self.data_dir / "manifest.json",
            )
        self.sha256 = [entry["sha256"] for entry in entries]
        sizes = [entry["tokens"] for entry in entries]
        self.starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64).tolist()
        self.num_tokens: int = self.starts[-1]
        if self.num_tokens != self.manifest["splits"][split]["tokens"]:
            raise StreambackError(
                f"{self.data_dir / 'manifest.json'}: {split} shards hold {self.num_tokens} tokens, "
                f"the manifest says {self.manifest['splits'][split]['tokens']}"
            )
        self._maps: list[np.memmap | None] = [None] * len(self.paths)
        self._verify_on_read = verify

    # ---- verification -----------------------------------------------------------------------

    def verify(self, threads: int = 1, shards=None) -> None:
        """Hash the shards (default: all) not yet verified by this process, `threads` at a time;
        StreambackError naming every bad one."""
        problems = self.accept(self.scan(self.unverified(shards=shards), threads))
        if problems:
            raise StreambackError(self.explain(problems))

    def unverified(self, record: dict | None = None, shards=None) -> list[int]:
        """Indices of the shards (default: all) this process has not verified, leaving out those
        that `record` (`read_record`) vouches for: same file stamp, the manifest's sha256, ids in
        the vocabulary."""
        todo = []
        for k in range(len(self.paths)) if shards is None else shards:
            path = self.paths[k]
            key, stamp = str(path.resolve()), file_stamp(path)
            known = _VERIFIED.get(key) or (record or {}).get(key)
            if known is not None:
                known = (known["stamp"], known["sha256"], known["max_id"]) if isinstance(known, dict) else known
                if list(known[0]) == stamp and known[1] == self.sha256[k] and known[2] < self.vocab_size:
                    _VERIFIED[key] = (stamp, known[1], known[2])
                    continue
            todo.append(k)
        return todo

    def scan(self, shards, threads: int = 1) -> dict[str, dict]:
        """Hash and bound-scan the shards with these indices, `threads` at a time: per resolved
        path {"index", "stamp", "sha256", "max_id"} (the stamp is taken before reading)."""

        def one(k):
            stamp = file_stamp(self.paths[k])
            digest, top = scan_tokens(self.paths[k], self.dtype)
            return str(self.paths[k].resolve()), {"index": k, "stamp": stamp, "sha256": digest, "max_id": top}

        shards = list(shards)
        if threads > 1 and len(shards) > 1:
            with ThreadPoolExecutor(min(threads, len(shards))) as pool:
                return dict(pool.map(one, shards))
        return dict(map(one, shards))

    def accept(self, scans: dict[str, dict]) -> list[str]:
        """Check scans (`scan`, possibly from several processes) against the manifest and the
        vocabulary: one line per bad shard; the good ones are remembered as verified."""
        problems, manifest = [], self.data_dir / "manifest.json"
        for key, result in sorted(scans.items(), key=lambda item: item[1]["index"]):
            path, want = self.paths[result["index"]], self.sha256[result["index"]]
            wrong = []
            if result["sha256"] != want:
                wrong.append(
                    f"the sha256 of its tokens is {result['sha256'][:16]}..., {manifest} records {want[:16]}... "
                    "(the file changed after tokenize wrote it)"
                )
            if result["max_id"] >= self.vocab_size:
                wrong.append(
                    f"it holds token id {result['max_id']}, outside the vocabulary of {self.vocab_size} ids in "
                    f"{manifest}"
                )
            if wrong:
                problems.append(f"shard {path}: " + "; ".join(wrong))
            else:
                _VERIFIED[key] = (result["stamp"], result["sha256"], result["max_id"])
        return problems

    def explain(self, problems: list[str]) -> str:
        """The error for shards that failed verification: each one, then what to do."""
        return (
            f"{len(problems)} token shard(s) in {self.data_dir} do not match manifest.json:\n  "
            + "\n  ".join(problems)
            + "\nRepair them by rerunning the data stage with the same config (`streamback tokenize`, or "
            "`snakemake --forcerun tokenize`): it keeps the shards that pass and rewrites from the first that fails."
        )

    def verified_record(self) -> dict:
        """The verification record entries of this split's shards that this process has verified."""
        entries = {}
        for path in self.paths:
            key = str(path.resolve())
            if key in _VERIFIED:
                stamp, digest, top = _VERIFIED[key]
                entries[key] = {"stamp": stamp, "sha256": digest, "max_id": top}
        return entries

    def _map(self, k: int) -> np.memmap:
        if self._maps[k] is None:
            if self._verify_on_read:
                self.verify(shards=[k])
            self._maps[k] = np.memmap(
                self.paths[k],
                dtype=self.dtype,
                mode="r",
                offset=HEADER_BYTES,
                shape=(self.starts[k + 1] - self.starts[k],),
            )
        return self._maps[k]

    def read(self, offset: int, length: int) -> np.ndarray:
        """Tokens [offset, offset + length) as int64, across shard boundaries."""
        if offset < 0 or length < 0 or offset + length > self.num_tokens:
            raise ValueError(f"read({offset}, {length}) outside the split's {self.num_tokens} tokens")
        out = np.empty(length, dtype=np.int64)
        k, done = bisect.bisect_right(self.starts, offset) - 1, 0
        while done < length:
            start = offset + done - self.starts[k]
            take = min(length - done, self.starts[k + 1] - self.starts[k] - start)
            out[done : done + take] = self._map(k)[start : start + take]
            done += take
            k += 1
        return out

    def __len__(self) -> int:
        return self.num_tokens


def verify_datasets(datasets: list, record_path: Path, rank: int, world_size: int, gather, threads: int) -> str:
    """Hash every token shard of `datasets` (TokenDatasets of one token directory) that the
    verification record at `record_path` does not vouch for, this process taking every
    `world_size`-th from `rank` (`gather`: every process's results, a collective), check sha256 and
    vocabulary bound against the manifest, and record the good ones (rank 0). Returns the line
    that says what was verified; a StreambackError names each bad shard."""
    started, record = time.perf_counter(), read_record(record_path)
    problems, hashed, count, total = [], 0, 0, 0
    for dataset in datasets:
        todo = dataset.unverified(record)
        scans = {}
        for part in gather(dataset.scan(todo[rank::world_size], threads)):
            scans.update(part)
        problems += dataset.accept(scans)
        hashed += sum(dataset.paths[k].stat().st_size for k in todo)
        count, total = count + len(todo), total + len(dataset.paths)
    first = datasets[0]
    if problems:
        raise StreambackError(first.explain(problems))
    verified = {k: v for dataset in datasets for k, v in dataset.verified_record().items()}
    if verified != record and rank == 0:
        write_record(record_path, verified)
    seconds = time.perf_counter() - started
    kept = f"; {total - count} unchanged since this run verified them ({record_path})" if count < total else ""
    return (
        f"token shards verified: all {total} in {first.data_dir} match manifest.json (sha256, every id "
        f"below the vocabulary of {first.vocab_size}); hashed {count} ({hashed / 1e6:,.1f} MB) in "
        f"{seconds:.1f} s on {world_size} process(es){kept}"
    )
