"""The data stage's pieces several test modules share: a small shard size, and training windows read from shards."""

SHARD = 4096  # small shards, so every split spans several


def windows(tokens_dir, count, seq, seed=0):
    """`count` training windows [count, seq + 1] of the data stage's shards, drawn as the trainer draws a batch."""
    from streamback.data.shards import TokenDataset
    from streamback.train.batches import num_windows, read_windows, train_windows

    data = TokenDataset(tokens_dir, "train")
    return read_windows(data, train_windows(seed, 0, count, num_windows(data.num_tokens, seq)), seq)
