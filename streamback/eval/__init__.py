"""The evaluation stage: lm-evaluation-harness on every trained run (`scoring` is the model's own
batched scoring, `decode` its key/value cache for generation, `lm` its lm-eval adapter, `taskload`
finds tasks and checks their data as lm-eval loads them), the offline default's local tasks, and
the statistics that say whether a benchmark difference between two runs is real."""
