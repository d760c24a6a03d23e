"""The preflight's shared test config: the micro model and a short training recipe with five preflight steps."""

MODEL = {
    "shapes": {"micro": {"n_layers": 2, "dim": 32, "n_heads": 2, "n_kv_heads": 1, "multiple_of": 16}},
    "max_seq_len": 64,
}
TRAIN = {
    "runs": {"shapes": ["micro"], "blocks": ["baseline", "streamback"], "streams": ["bf16_sr"], "seeds": [0, 1]},
    "tokens": 30 * 8 * 32,
    "seq_len": 32,
    "batch_size": 8,
    "micro_batch_size": 4,
    "optimizer": {"lr": 3e-3},
    "schedule": {"warmup_steps": 1, "decay_steps": 8},
    "checkpoint": {"every": 5, "keep": 2},
    "log": {"every": 10, "stream_every": 4, "val_every": 10, "val_sequences": 16, "tensorboard": False},
    "preflight": {"steps": 5},
}
