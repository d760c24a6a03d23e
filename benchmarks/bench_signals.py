"""What the live precision signals cost a default tiny run, measured two ways on one thread:

1. steps: the run's model and batch (config's shape, micro-batch and sequence, its corpus), a plain
   training step, the trainer's stream step without the signals (the envelope) and with them,
   round-robin for `--rounds` rounds, each timed in this thread's CPU seconds (a shared machine's
   load disturbs them less than wall time); the signals' share of the run is
   (stream step with - without) / (stream_every x plain step);
2. runs: the whole run trained with `train.log.signals` on and off, alternately, `--pairs` times,
   each from its first step in a fresh directory; the ratio of this process's CPU seconds.

    python benchmarks/bench_signals.py                                   # tiny-skinny-tall-baseline
    python benchmarks/bench_signals.py --run tiny-medium-streamback --rounds 200 --pairs 0

Needs the default study's token shards (`snakemake --cores 2 results/tokens/synthetic/manifest.json`).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from streamback import layout  # noqa: E402
from streamback.config import DEFAULT_CONFIG, load_config, merge_config, validate_config  # noqa: E402
from streamback.data.shards import TokenDataset  # noqa: E402
from streamback.measure.step import training_step  # noqa: E402
from streamback.model.model import ModelArgs, Transformer  # noqa: E402
from streamback.runs import run_matrix  # noqa: E402
from streamback.train.batches import num_windows, read_windows, train_windows  # noqa: E402
from streamback.train.signals import StreamRecord  # noqa: E402
from streamback.train.trainer import train  # noqa: E402


def cpu_seconds(fn) -> float:
    started = time.thread_time()
    fn()
    return time.thread_time() - started


def steps(config: dict, run: str, rounds: int) -> None:
    cfg, spec = config["train"], run_matrix(config["train"])[run]
    data = TokenDataset(layout.tokens_dir(config["data"]), "train")
    model = Transformer(
        ModelArgs.from_config(config["model"], spec.shape, data.vocab_size, block=spec.block, stream=spec.stream)
    )
    model.init_weights(cfg["seed"])
    windows = train_windows(cfg["seed"], 0, cfg["micro_batch_size"], num_windows(data.num_tokens, cfg["seq_len"]))
    tokens = read_windows(data, windows, cfg["seq_len"])

    def stream_step(signals: bool):
        record = StreamRecord(model, signals)
        with record.capture() as stream:
            training_step(model, tokens)
        record.add(stream)

    kinds = {
        "plain": lambda: training_step(model, tokens),
        "envelope": lambda: stream_step(False),
        "signals": lambda: stream_step(True),
    }
    for fn in kinds.values():  # warm-up
        fn()
    times = {name: [] for name in kinds}
    for _ in range(rounds):
        for name, fn in kinds.items():
            times[name].append(cpu_seconds(fn))
    median = {name: statistics.median(t) for name, t in times.items()}
    every = cfg["log"]["stream_every"]
    print(
        f"{run} steps ({cfg['micro_batch_size']} x {cfg['seq_len']} tokens), medians of {rounds} rounds in CPU ms: "
        + ", ".join(f"{name} {1e3 * t:.2f}" for name, t in median.items())
        + f"; signals on a stream step +{100 * (median['signals'] / median['envelope'] - 1):.2f}%, "
        f"at stream_every {every} {100 * (median['signals'] - median['envelope']) / (every * median['plain']):+.3f}% "
        f"of the run's steps",
        flush=True,
    )


def runs(config: dict, run: str, pairs: int) -> None:
    cpu = {True: [], False: []}
    for pair in range(pairs):
        for signals in (True, False):
            cfg = validate_config(merge_config(config, {"train": {"log": {"signals": signals, "tensorboard": False}}}))
            with tempfile.TemporaryDirectory() as root:
                cpu[signals].append(
                    cpu_seconds(
                        lambda: train(
                            cfg["train"],
                            cfg["model"],
                            run,
                            layout.tokens_dir(cfg["data"]),
                            Path(root) / "out",
                            Path(root) / "ckpt",
                        )
                    )
                )
    ratios = np.array(cpu[True]) / np.array(cpu[False])
    print(
        f"{run} whole runs, CPU seconds: on {', '.join(f'{s:.2f}' for s in cpu[True])}; off "
        f"{', '.join(f'{s:.2f}' for s in cpu[False])}; "
        f"on / off {statistics.median(ratios):.4f} (median of {pairs} pairs: {', '.join(f'{r:.4f}' for r in ratios)})",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    parser.add_argument(
        "--run", default="tiny-skinny-tall-baseline", help="a run of the config's matrix (default: its slowest shape)"
    )
    parser.add_argument("--rounds", type=int, default=100, help="round-robin rounds of the three steps (0: none)")
    parser.add_argument("--pairs", type=int, default=2, help="whole runs with signals on and off (0: none)")
    args = parser.parse_args()
    config = load_config(args.config)
    torch.set_num_threads(1)
    if args.rounds:
        steps(config, args.run, args.rounds)
    if args.pairs:
        runs(config, args.run, args.pairs)


if __name__ == "__main__":
    main()
