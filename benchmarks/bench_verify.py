"""What verification costs (prints figures; no assertions).

1. Token shards: the sha256 and largest id of uint32 shards (`TokenDataset.scan`, one read per
   shard) in MB/s with 1 and more threads, and what that means for the paper's 100B tokens
   (400 GB of uint32 shards) when a run first starts, shared by its ranks. The shards are read
   from the page cache, so this is the CPU's cost; a parallel filesystem may deliver less.
2. A resume: `unverified(record)` over 1,000 shards (the paper's count) that the run's
   verification record vouches for - a stat per shard, no hashing.
3. Checkpoints: sha256 of a checkpoint's files in MB/s, and the paper's ~12 GB checkpoint (fp32
   weights + AdamW moments of a ~1B model) split over 8 ranks, on every save and resume.

    python benchmarks/bench_verify.py [--shards 4] [--mb 256] [--threads 1 2 4]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from streamback.data import shards
from streamback.data.shards import FORMAT, TokenDataset, file_sha256, read_record, shard_name, write_record, write_shard
from streamback.io import write_json

PAPER_BYTES = 100e9 * 4  # 100B uint32 tokens
PAPER_SHARDS = 1000  # data.shard_tokens 100M
PAPER_CHECKPOINT = 12e9
VOCAB = 128256  # Llama 3


def token_dir(root: Path, count: int, tokens_each: int, seed: int = 0) -> Path:
    """A tokenized corpus of `count` uint32 train shards of random ids (and one val shard)."""
    rng = np.random.default_rng(seed)
    meta = {"dtype": "uint32", "tokenizer_sha256": "0" * 64, "fingerprint": "bench"}
    splits = {}
    for split, n in (("train", count), ("val", 1)):
        entries = []
        for k in range(n):
            ids = rng.integers(0, VOCAB, tokens_each, dtype=np.uint32)
            digest = write_shard(root / shard_name(split, k), ids, {**meta, "split": split, "index": k})
            entries.append({"file": shard_name(split, k), "tokens": tokens_each, "sha256": digest})
        splits[split] = {"shards": entries, "tokens": n * tokens_each}
    write_json(
        root / "manifest.json",
        {
            "format": FORMAT,
            "vocab_size": VOCAB,
            "eos_id": 0,
            "dtype": "uint32",
            "tokenizer": {"sha256": "0" * 64},
            "fingerprint": "bench",
            "splits": splits,
        },
    )
    return root


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=4, help="train shards to hash")
    parser.add_argument("--mb", type=int, default=256, help="MB per shard")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-verify-") as tmp:
        data = token_dir(Path(tmp) / "big", args.shards, args.mb * (1 << 20) // 4)
        ds = TokenDataset(data, "train", verify=False)
        total = sum(p.stat().st_size for p in ds.paths)
        file_sha256(ds.paths[0])  # warm the page cache
        print(f"1. token shards: {args.shards} x {args.mb} MB of uint32 ids (page cache)")
        rates = {}
        for threads in args.threads:
            best = min(
                _timed(lambda threads=threads: ds.scan(range(len(ds.paths)), threads)) for _ in range(args.repeats)
            )
            rates[threads] = total / best / 1e6
            print(f"   sha256 + largest id, {threads} thread(s): {rates[threads]:,.0f} MB/s")
        one = rates[min(rates)]
        print(
            f"   the paper's 100B tokens = {PAPER_BYTES / 1e9:.0f} GB: {PAPER_BYTES / one / 1e6 / 60:.1f} min on one "
            f"thread; "
            f"shared by 8 ranks of one thread each {PAPER_BYTES / one / 1e6 / 8:.0f} s, by 16 "
            f"{PAPER_BYTES / one / 1e6 / 16:.0f} s "
            "(if the filesystem keeps up) - once per run; a resume re-hashes only shards whose files changed"
        )

        small = token_dir(Path(tmp) / "many", PAPER_SHARDS, 16)
        ds = TokenDataset(small, "train", verify=False)
        ds.verify()
        write_record(Path(tmp) / "record.json", ds.verified_record())
        record = read_record(Path(tmp) / "record.json")
        shards._VERIFIED.clear()  # as a new process
        seconds = min(
            _timed(lambda: (shards._VERIFIED.clear(), TokenDataset(small, "train", verify=False).unverified(record)))
            for _ in range(args.repeats)
        )
        print(
            f"2. a resume of {PAPER_SHARDS} recorded shards: {seconds * 1e3:.0f} ms (manifest, headers and a stat per "
            f"shard)"
        )

        first = data / shard_name("train", 0)
        best = min(_timed(lambda: file_sha256(first)) for _ in range(args.repeats))
        rate = first.stat().st_size / best / 1e6
        print(
            f"3. checkpoint files: sha256 {rate:,.0f} MB/s; the paper's {PAPER_CHECKPOINT / 1e9:.0f} GB checkpoint on "
            f"8 ranks: "
            f"{PAPER_CHECKPOINT / 8 / rate / 1e6:.1f} s per save and per resume (one checkpoint every 25-35 min)"
        )


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


if __name__ == "__main__":
    main()
