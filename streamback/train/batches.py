"""Training and validation batches as pure functions of (seed, step) over memory-mapped tokens.

A split of N tokens is cut into n = (N - 1) // L windows of L + 1 tokens (inputs and their
next-token targets), window w starting at token w * L. Windows cross document boundaries (the
end-of-document token separates them), as in TorchTitan's packed pretraining data.

The global batch of step s holds the B windows at global positions g = s * B + j, j < B. Position
g falls in epoch g // n, and within the epoch it is mapped through a pseudo-random permutation of
the n windows keyed by (seed, epoch): a 4-round Feistel network on the next even power of two,
restricted to [0, n) by cycle walking. It needs no stored permutation (the paper's 100B tokens
are ~49M windows), and every window is seen once per epoch. Nothing depends on the run's
history, so a resumed run reads exactly the batches an uninterrupted one would.

Rank r of R takes the contiguous slice j in [r * B / R, (r + 1) * B / R) of the global batch and
cuts it into micro-batches; the loss is the mean over the global batch whatever R is.

`open_splits` opens a run's train and val splits, checks them against its recipe and verifies
their shards.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from streamback.data.shards import TokenDataset, verify_datasets
from streamback.errors import StreambackError
from streamback.runs import data_passes, num_windows, token_budget_problem

_ROUNDS = 4
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def _mix(x: np.ndarray, key: np.uint64) -> np.ndarray:
    """SplitMix64's finaliser of x + key * golden (uint64 arithmetic wraps)."""
    with np.errstate(over="ignore"):
        z = x + key * _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _MIX1
        z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


def permute(positions: np.ndarray, n: int, seed: int, epoch: int) -> np.ndarray:
    """The image of `positions` (ints in [0, n)) under the permutation of [0, n) keyed by (seed, epoch)."""
    half = max(1, (max(n - 1, 1).bit_length() + 1) // 2)
    mask = np.uint64((1 << half) - 1)
    keys = np.random.SeedSequence([seed, epoch]).generate_state(_ROUNDS, dtype=np.uint64)

    def feistel(x: np.ndarray) -> np.ndarray:
        left, right = x >> np.uint64(half), x & mask
        for key in keys:
            left, right = right, left ^ (_mix(right, key) & mask)
        return (left << np.uint64(half)) | right

    out = feistel(np.asarray(positions, dtype=np.uint64))
    outside = out >= np.uint64(n)
    while outside.any():  # cycle walking: the cycle through a position < n returns below n
        out[outside] = feistel(out[outside])
        outside = out >= np.uint64(n)
    return out.astype(np.int64)


def train_windows(seed: int, step: int, batch_size: int, n: int) -> np.ndarray:
    """Window ids of the global batch of `step` (0-based): `batch_size` ids in [0, n)."""
    if n < 1:
        raise StreambackError("the train split holds no complete window: it needs more tokens than train.seq_len")
    positions = step * batch_size + np.arange(batch_size, dtype=np.int64)
    epochs, within = np.divmod(positions, n)
    out = np.empty(batch_size, dtype=np.int64)
    for epoch in np.unique(epochs):
        sel = epochs == epoch
        out[sel] = permute(within[sel], n, seed, int(epoch))
    return out


def read_windows(dataset, windows, seq_len: int) -> torch.Tensor:
    """A [len(windows), seq_len + 1] int64 tensor of the windows' tokens from `dataset` (TokenDataset)."""
    rows = [dataset.read(int(w) * seq_len, seq_len + 1) for w in windows]
    return torch.from_numpy(np.stack(rows).astype(np.int64, copy=False))


def rank_micro_batches(windows: np.ndarray, rank: int, world_size: int, micro_batch_size: int) -> list[np.ndarray]:
    """This rank's share of a global batch's window ids, cut into micro-batches in order."""
    share = len(windows) // world_size
    mine = windows[rank * share : (rank + 1) * share]
    return [mine[i : i + micro_batch_size] for i in range(0, share, micro_batch_size)]


def val_windows(n: int, count: int, rank: int, world_size: int) -> np.ndarray:
    """This rank's contiguous share of the first `count` windows of the validation split.

    `count` (at most n) is rounded down to a multiple of world_size, so every rank runs as many
    forward passes: under FSDP2 each forward pass is a collective.
    """
    share = min(count, n) // world_size
    return np.arange(rank * share, (rank + 1) * share, dtype=np.int64)


@dataclasses.dataclass
class Splits:
    """A run's data: its train and val splits, the train split's window count and this rank's val windows."""

    train: TokenDataset
    val: TokenDataset
    n_train: int
    val_windows: np.ndarray


def open_splits(
    data_dir: Path, cfg: dict, steps: int, env, verified: Path, say: Callable[[str], None], verify_all: bool = True
) -> Splits:
    """The train and val splits of `data_dir` for a run of `steps` steps of the `train` section `cfg`
    on `env` (a `Distributed`), checked against its token budget and val_sequences, and their
    shards verified against the manifest (the ranks share the hashing), bar those the record
    `verified` vouches for; `say`: a line in the run's log. `verify_all=False` (the preflight's)
    hashes none up front: each shard is checked as its tokens are first read (`TokenDataset`), so
    only the shards that the steps read are hashed."""
    seq_len = cfg["seq_len"]
    train, val = TokenDataset(data_dir, "train"), TokenDataset(data_dir, "val")
    n_train = num_windows(train.num_tokens, seq_len)
    if n_train < 1:
        raise StreambackError(
            f"{data_dir}: the train split has {train.num_tokens} tokens, fewer than train.seq_len + 1"
        )
    problem = token_budget_problem(cfg, train.num_tokens, f"the train split of {data_dir}")
    if problem:
        raise StreambackError(problem)
    passes = data_passes(cfg, train.num_tokens)
    if passes > 1:
        say(
            f"train.repeat_data is on: the run reads its train split {passes:.2f} times "
            f"({steps * cfg['batch_size']:,} windows of the {n_train:,} it holds), each pass in a new order"
        )
    n_val = num_windows(val.num_tokens, seq_len)
    windows = val_windows(n_val, cfg["log"]["val_sequences"], env.rank, env.world_size)
    if len(windows) < 1:
        raise StreambackError(
            f"{data_dir}: the val split has {val.num_tokens} tokens, too few for one sequence per process"
        )
    if verify_all:
        say(verify_datasets([train, val], verified, env.rank, env.world_size, env.gather, torch.get_num_threads()))
    else:
        say(
            f"token shards: each of the {len(train.paths) + len(val.paths)} in {data_dir} is checked against "
            "manifest.json (sha256, vocabulary) when its tokens are first read, so only those read are hashed"
        )
    return Splits(train, val, n_train, windows)
