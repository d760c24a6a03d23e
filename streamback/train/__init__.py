"""The training stage: the trainer and its parts (batches, checkpoints, schedule, metrics log, parallelisation)."""
