"""Evaluation speed: the `streamback` lm-eval backend against lm-eval's own `hf` backend
(transformers) on the same model, exported with `streamback export-hf` (prints figures; no
assertions). Goals: scoring at least 1.0x hf's items/s; generation within 1.5x of hf's generated
tokens/s (a ratio of at least 0.67).

- Scoring: a local task's items through `lm_eval.simple_evaluate`, items/s.
- Generation: greedy continuations of the first words of held-out stories (the perplexity task's,
  written to a temporary `generate_until` task: no stop string but the end-of-text token,
  `--gen-tokens` new tokens at most) through `lm_eval.simple_evaluate`, generated tokens/s (each
  backend's continuations re-encoded with the run's tokenizer) and how many continuations the two
  backends agree on; and the same prompts through the scoring core alone, with the key/value cache
  (`Scorer.generate`) and without it (the whole sequence through the model at every step, as before
  the cache), to show what the cache buys.
- bf16 and batches: the largest relative difference of a per-item log-likelihood between batch 1
  and `--batch-size`, in bf16 compute (fp32 for comparison), and whether any accuracy changed.

Each backend is timed in bf16 (the streamback backend as trained: bf16 compute with the run's own
stream; hf in bf16) and in fp32, on items loaded beforehand, `--repeats` times (the fastest
counts; wall and CPU seconds, as the machine may be shared). Ratios come from the same run. Run
after the default study (`snakemake --cores 2`), from the repository root:

    python benchmarks/bench_eval.py [--run tiny-medium-baseline] [--task streamback_pairs_agreement] [--threads 1]
    [--gen-tokens 64]
"""

from __future__ import annotations

import argparse
import json
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

GENERATE_TASK = """task: bench_generate
dataset_path: json
dataset_kwargs:
  data_files:
    test: {items}
test_split: test
output_type: generate_until
doc_to_text: context
doc_to_target: text
generation_kwargs:
  until: []
  max_gen_toks: {tokens}
  do_sample: false
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def timed(fn, repeats: int, setup=lambda: None):
    """(best wall s, its CPU s, its result) of `repeats` calls of fn(setup()), setup untimed."""
    best = None
    for _ in range(repeats):
        prepared = setup()
        t0, c0 = time.perf_counter(), cpu_seconds()
        result = fn(prepared)
        wall, cpu = time.perf_counter() - t0, cpu_seconds() - c0
        if best is None or wall < best[0]:
            best = (wall, cpu, result)
    return best


def evaluate(model, manager, tasks: dict, log_samples: bool = False) -> dict:
    """lm-eval's simple_evaluate of `model` on `tasks` (loaded by `load_tasks`)."""
    import lm_eval

    return lm_eval.simple_evaluate(
        model=model, tasks=list(tasks.values()), task_manager=manager, log_samples=log_samples, bootstrap_iters=0
    )


def no_cache_generate(scorer, contexts: list[list[int]], max_new_tokens: int) -> int:
    """Greedy generation without a cache (the whole sequence through the model at every step, rows
    right-padded, the running ones only): the path before the key/value cache. Returns the tokens generated."""
    generated = 0
    with torch.inference_mode():
        for start in range(0, len(contexts), scorer.batch_size):
            batch = contexts[start : start + scorer.batch_size]
            lengths = torch.tensor([len(c) for c in batch])
            buffer = torch.zeros((len(batch), int(lengths.max()) + max_new_tokens), dtype=torch.long)
            for b, c in enumerate(batch):
                buffer[b, : len(c)] = torch.tensor(c)
            running = list(range(len(batch)))
            for _ in range(max_new_tokens):
                logits = scorer.model(buffer[running, : int(lengths[running].max())])
                next_ids = logits[torch.arange(len(running)), lengths[running] - 1].argmax(-1).tolist()
                still = []
                for b, token in zip(running, next_ids):
                    if token != scorer.eos_id:
                        buffer[b, lengths[b]] = token
                        lengths[b] += 1
                        generated += 1
                        still.append(b)
                running = still
                if not running:
                    break
    return generated


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--run", default="tiny-medium-baseline", help="a trained run of the default study (results/runs/<run>/model.pt)"
    )
    parser.add_argument(
        "--task", default="streamback_pairs_agreement", help="a local task whose items exist (results/eval/tasks/)"
    )
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=32, help="generation prompts (held-out stories' first words)")
    parser.add_argument("--gen-tokens", type=int, default=64, help="new tokens per prompt at most")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    from lm_eval.models.huggingface import HFLM

    from streamback.eval.lm import StreambackLM

    model_file, tokens = layout.model_file(args.run), layout.tokens_dir(load_config()["data"])
    stories = layout.eval_task_file("streamback_perplexity")
    for needed in (model_file, layout.eval_task_file(args.task), stories):
        if not needed.is_file():
            sys.exit(f"bench_eval: needs {needed}: run the default study first (snakemake --cores 2)")
    with tempfile.TemporaryDirectory(prefix="bench_eval-") as work:
        work = Path(work)
        prompts = [
            {"context": " ".join(json.loads(line)["text"].split()[:12]), "text": ""}
            for line in stories.read_text().splitlines()
        ]
        (work / "prompts.jsonl").write_text("".join(json.dumps(p) + "\n" for p in prompts[: args.prompts]))
        (work / "tasks").mkdir()
        (work / "tasks" / "bench_generate.yaml").write_text(
            GENERATE_TASK.format(items=work / "prompts.jsonl", tokens=args.gen_tokens)
        )
        export(model_file, work / "hf", tokens)
        manager = task_manager([args.task], [])
        gen_manager = task_manager(["bench_generate"], [str(work / "tasks")])

        def streamback(dtype, batch=args.batch_size):
            return StreambackLM(
                pretrained=str(model_file), tokens=str(tokens), dtype=dtype, batch_size=batch, device="cpu"
            )

        def hf(dtype):
            return HFLM(pretrained=str(work / "hf"), dtype=dtype, batch_size=args.batch_size, device="cpu")

        scoring, generation = {}, {}
        for dtype, name in (("bfloat16", "bf16"), ("float32", "fp32")):
            for backend, make in (("streamback", streamback), ("hf", hf)):
                model = make(dtype)
                scoring[backend, name] = timed(
                    lambda tasks: evaluate(model, manager, tasks),
                    args.repeats,
                    lambda: load_tasks(manager, [args.task]),
                )
                generation[backend, name] = timed(
                    lambda tasks: evaluate(model, gen_manager, tasks, log_samples=True),
                    args.repeats,
                    lambda: load_tasks(gen_manager, ["bench_generate"]),
                )
        sb = streamback("float32")
        contexts = [sb.tok_encode(p["context"]) for p in prompts[: args.prompts]]
        core = {
            "kv cache": timed(
                lambda _: sum(len(sb.tok_encode(t)) for t in sb.scorer.generate(contexts, [], args.gen_tokens)),
                args.repeats,
            ),
            "no cache": timed(lambda _: no_cache_generate(sb.scorer, contexts, args.gen_tokens), args.repeats),
        }
        dependence = {}
        for dtype, name in (("bfloat16", "bf16"), ("float32", "fp32")):
            one, many = (
                evaluate(streamback(dtype, batch), manager, load_tasks(manager, [args.task]), log_samples=True)[
                    "samples"
                ][args.task]
                for batch in (1, args.batch_size)
            )
            ll = [
                (float(r1[0][0]), float(r2[0][0]))
                for s1, s2 in zip(one, many)
                for r1, r2 in zip(s1["resps"], s2["resps"])
            ]
            dependence[name] = (
                max(abs(a - b) / abs(a) for a, b in ll),
                sum(s1["acc"] != s2["acc"] for s1, s2 in zip(one, many)),
                len(one),
            )

    print(f"\nbench_eval: {args.run}, batch {args.batch_size}, {args.threads} thread(s), best of {args.repeats}")
    print(f"\nscoring {args.task}:")
    print(f"{'backend':<12}{'dtype':<7}{'items':>7}{'wall s':>9}{'items/s':>10}{'items/CPU-s':>13}  acc")
    for (backend, dtype), (wall, cpu, results) in scoring.items():
        items = results["n-samples"][args.task]["effective"]
        print(
            f"{backend:<12}{dtype:<7}{items:>7}{wall:>9.2f}{items / wall:>10.1f}{items / cpu:>13.1f}  "
            f"{results['results'][args.task].get('acc,none')}"
        )
    for dtype in ("bf16", "fp32"):
        (sw, sc, _), (hw, hc, _) = scoring[("streamback", dtype)], scoring[("hf", dtype)]
        print(
            f"{dtype}: streamback / hf = {hw / sw:.2f}x items/s (wall), {hc / sc:.2f}x items per CPU-second (goal >= "
            f"1.0x)"
        )

    print(f"\ngeneration: {args.prompts} prompts, up to {args.gen_tokens} new tokens each, greedy")
    print(f"{'backend':<12}{'dtype':<7}{'tokens':>8}{'wall s':>9}{'tokens/s':>10}{'tokens/CPU-s':>14}")
    texts = {}
    for (backend, dtype), (wall, cpu, results) in generation.items():
        texts[backend, dtype] = [s["resps"][0][0] for s in results["samples"]["bench_generate"]]
        count = sum(len(sb.tok_encode(t)) for t in texts[backend, dtype])
        generation[backend, dtype] = (wall, cpu, count)
        print(f"{backend:<12}{dtype:<7}{count:>8}{wall:>9.2f}{count / wall:>10.1f}{count / cpu:>14.1f}")
    for dtype in ("bf16", "fp32"):
        (sw, sc, sn), (hw, hc, hn) = generation[("streamback", dtype)], generation[("hf", dtype)]
        same = sum(a == b for a, b in zip(texts[("streamback", dtype)], texts[("hf", dtype)]))
        print(
            f"{dtype}: streamback / hf = {(sn / sw) / (hn / hw):.2f}x generated tokens/s (wall), "
            f"{(sn / sc) / (hn / hc):.2f}x per CPU-second "
            f"(goal >= 0.67x, within 1.5x); {same}/{len(texts[('hf', dtype)])} continuations identical"
        )
    print(
        "scoring core, fp32, the same prompts: "
        f"{', '.join(f'{k} {n / w:.1f} tokens/s' for k, (w, _, n) in core.items())}; "
        "the cache is "
        f"{(core['kv cache'][2] / core['kv cache'][0]) / (core['no cache'][2] / core['no cache'][0]):.1f}x faster"
    )

    print(
        f"\nbatch 1 against batch {args.batch_size}, {args.task}, per-item log-likelihoods of the streamback backend:"
    )
    for dtype, (worst, changed, n) in dependence.items():
        print(f"{dtype}: largest relative difference {worst:.2e}; accuracy changed on {changed} of {n} items")
    return 0


if __name__ == "__main__":
    sys.exit(main())
