"""The evaluation stage: lm-evaluation-harness on every trained run (`scoring` is the model's own
batched scoring, `lm` its lm-eval adapter), the offline default's local tasks, and the statistics
that say whether a benchmark difference between two runs is real."""
