"""Evaluation speed: items/s of the `streamback` lm-eval backend against lm-eval's own `hf` backend
(transformers) on the same model, exported with `streamback export-hf`, and the same local task,
both through `lm_eval.simple_evaluate` (prints figures; no assertions). Goal: at least 1.0x.

Each backend is timed in bf16 (the streamback backend as trained: bf16 compute with the run's own
stream; hf in bf16) and in fp32, on the task's items (loaded beforehand, outside the timing),
`--repeats` times (the fastest counts; wall and CPU seconds, as the machine may be shared). Run
after the default study (`snakemake --cores 2`), from the repository root:

    python benchmarks/bench_eval.py [--run tiny-medium-baseline] [--task streamback_pairs_agreement] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no hub lookups of the exported model's name

import torch  # noqa: E402

from streamback import layout  # noqa: E402
from streamback.config import load_config  # noqa: E402
from streamback.eval.taskload import load_tasks, task_manager  # noqa: E402
from streamback.model.export_hf import export  # noqa: E402


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def timed_evaluate(make_model, manager, task: str, repeats: int) -> tuple[float, float, int, dict]:
    """(best wall s, its CPU s, items, results) of simple_evaluate on a freshly loaded `task`."""
    import lm_eval

    model, best = make_model(), None
    for _ in range(repeats):
        tasks = load_tasks(manager, [task])
        t0, c0 = time.perf_counter(), cpu_seconds()
        results = lm_eval.simple_evaluate(model=model, tasks=list(tasks.values()), task_manager=manager, log_samples=False, bootstrap_iters=0)
        wall, cpu = time.perf_counter() - t0, cpu_seconds() - c0
        if best is None or wall < best[0]:
            best = (wall, cpu, results["n-samples"][task]["effective"], results)
    return best


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", default="tiny-medium-baseline", help="a trained run of the default study (results/runs/<run>/model.pt)")
    parser.add_argument("--task", default="streamback_pairs_agreement", help="a local task whose items exist (results/eval/tasks/)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    from lm_eval.models.huggingface import HFLM

    import streamback.eval.lm  # noqa: F401  (registers the `streamback` model)
    from streamback.eval.lm import StreambackLM

    model_file, tokens = layout.model_file(args.run), layout.tokens_dir(load_config()["data"])
    if not model_file.is_file() or not layout.eval_task_file(args.task).is_file():
        sys.exit(f"bench_eval: needs {model_file} and {layout.eval_task_file(args.task)}: run the default study first (snakemake --cores 2)")
    manager = task_manager([args.task], [])
    with tempfile.TemporaryDirectory(prefix="bench_eval-") as hf_dir:
        export(model_file, hf_dir, tokens)
        makers = {
            ("streamback", "bf16"): lambda: StreambackLM(pretrained=str(model_file), tokens=str(tokens), batch_size=args.batch_size, device="cpu"),
            ("hf", "bf16"): lambda: HFLM(pretrained=hf_dir, dtype="bfloat16", batch_size=args.batch_size, device="cpu"),
            ("streamback", "fp32"): lambda: StreambackLM(pretrained=str(model_file), tokens=str(tokens), dtype="float32",
                                                         batch_size=args.batch_size, device="cpu"),
            ("hf", "fp32"): lambda: HFLM(pretrained=hf_dir, dtype="float32", batch_size=args.batch_size, device="cpu"),
        }
        figures = {key: timed_evaluate(make, manager, args.task, args.repeats) for key, make in makers.items()}
    print(f"\nbench_eval: {args.run} on {args.task}, batch {args.batch_size}, {args.threads} thread(s), best of {args.repeats}")
    print(f"{'backend':<12}{'dtype':<7}{'items':>7}{'wall s':>9}{'items/s':>10}{'items/CPU-s':>13}  acc")
    for (backend, dtype), (wall, cpu, items, results) in figures.items():
        acc = results["results"][args.task].get("acc,none")
        print(f"{backend:<12}{dtype:<7}{items:>7}{wall:>9.2f}{items / wall:>10.1f}{items / cpu:>13.1f}  {acc}")
    for dtype in ("bf16", "fp32"):
        (sw, sc, n, _), (hw, hc, _, _) = figures[("streamback", dtype)], figures[("hf", dtype)]
        print(f"{dtype}: streamback / hf = {hw / sw:.2f}x items/s (wall), {hc / sc:.2f}x items per CPU-second (goal >= 1.0x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
