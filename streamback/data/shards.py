"""Token shards and their manifest: the data stage's output, the trainer's input.

A shard `<split>-<index:05d>.bin` is a 1024-byte header followed by its tokens, little-endian
uint16 when the vocabulary fits (else uint32). The header is the magic b"SBTOKv1\\n", a JSON
object (dtype, tokens, split, index, tokenizer_sha256, fingerprint, and where in the source
stream the shard ends, for resuming, and the sha256 of the token bytes), padded with spaces and
ended by a newline. `manifest.json` beside the shards lists every shard with its token count and
that sha256 (check one with `tail -c +1025 train-00000.bin | sha256sum`), the vocabulary size,
the end-of-document id, the dtype, the tokenizer file, the exact source and the config.

`TokenDataset(data_dir, split)` checks the shards against the manifest and reads any token
range as int64 through memory maps.
"""

from __future__ import annotations

import bisect
import hashlib
import json
from pathlib import Path

import numpy as np

from streamback.errors import StreambackError
from streamback.io import atomic_path

MAGIC = b"SBTOKv1\n"
HEADER_BYTES = 1024
FORMAT = "streamback-tokens/1"
SPLITS = ("train", "val")


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
        return json.loads(raw[len(MAGIC):].decode())
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
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        f.seek(offset)
        for block in iter(lambda: f.read(1 << 24), b""):
            digest.update(block)
    return digest.hexdigest()


def check_shard(path: Path, expect: dict) -> dict:
    """The header of `path` after checking its size and every field in `expect` against it."""
    header = read_header(path)
    for key, value in expect.items():
        if header.get(key) != value:
            raise StreambackError(f"shard {path}: header says {key}={header.get(key)!r}, expected {value!r}")
    size = HEADER_BYTES + header["tokens"] * np_dtype(header["dtype"]).itemsize
    actual = path.stat().st_size
    if actual != size:
        raise StreambackError(f"shard {path} is {actual} bytes, its header promises {size} ({header['tokens']} tokens of {header['dtype']})")
    return header


def read_manifest(data_dir: str | Path) -> dict:
    """The manifest.json of a tokenized corpus."""
    path = Path(data_dir) / "manifest.json"
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise StreambackError(f"{path} does not exist: run `streamback tokenize` (rule tokenize) first") from None
    except json.JSONDecodeError as err:
        raise StreambackError(f"{path} is not valid JSON: {err}") from None
    if manifest.get("format") != FORMAT:
        raise StreambackError(f"{path}: format {manifest.get('format')!r} is not {FORMAT!r}")
    return manifest


class TokenDataset:
    """One split of a tokenized corpus, read through memory maps.

    Opening checks every shard against the manifest (header fields and file size; with
    verify=True also the sha256 of each file) and raises StreambackError naming the file that
    does not match.
    """

    def __init__(self, data_dir: str | Path, split: str, verify: bool = False):
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
            check_shard(path, {"dtype": self.manifest["dtype"], "tokens": entry["tokens"], "sha256": entry["sha256"],
                               "split": split, "index": index,
                               "tokenizer_sha256": self.manifest["tokenizer"]["sha256"],
                               "fingerprint": self.manifest["fingerprint"]})
            if verify and file_sha256(path, HEADER_BYTES) != entry["sha256"]:
                raise StreambackError(f"shard {path}: the sha256 of its tokens differs from {self.data_dir / 'manifest.json'}")
        sizes = [entry["tokens"] for entry in entries]
        self.starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64).tolist()
        self.num_tokens: int = self.starts[-1]
        if self.num_tokens != self.manifest["splits"][split]["tokens"]:
            raise StreambackError(f"{self.data_dir / 'manifest.json'}: {split} shards hold {self.num_tokens} tokens, "
                                  f"the manifest says {self.manifest['splits'][split]['tokens']}")
        self._maps: list[np.memmap | None] = [None] * len(self.paths)

    def _map(self, k: int) -> np.memmap:
        if self._maps[k] is None:
            self._maps[k] = np.memmap(self.paths[k], dtype=self.dtype, mode="r", offset=HEADER_BYTES,
                                      shape=(self.starts[k + 1] - self.starts[k],))
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
            out[done:done + take] = self._map(k)[start:start + take]
            done += take
            k += 1
        return out

    def __len__(self) -> int:
        return self.num_tokens
