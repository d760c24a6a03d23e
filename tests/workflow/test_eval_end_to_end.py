"""The end-to-end half of test_eval.py (commands run as processes, compiled or multi-process runs, Snakemake): the same
subjects, at the pace of whole runs."""

import json
import os
import subprocess
import sys

import pandas as pd
import pytest
import torch
import yaml

from streamback import layout
from streamback.errors import StreambackError
from streamback.eval import taskload
from streamback.model.export_hf import export

from conftest import ROOT

# evaluated, no_scoring, runs: fixtures
from helpers.eval import MODEL, RUNS, SMALL, TEXTS, TRAIN, evaluated, no_scoring, run_stage, runs, scorer  # noqa: F401


@pytest.mark.parametrize(
    "run, dtype",
    [
        ("micro-baseline", torch.float32),
        ("micro-streamback", torch.float32),
        ("micro-baseline", torch.bfloat16),
        ("micro-streamback", torch.bfloat16),
    ],
)
def test_cached_generation_equals_the_no_cache_loop(runs, tokens, run, dtype):
    """Generation with the key/value cache gives exactly the tokens of the plain greedy loop that
    runs the whole sequence through the model at every step (the path without a cache), in every
    batch size, as trained (bf16) and in fp32, with rows ending at different steps (end-of-text,
    a stop string, max_new_tokens)."""
    sc, opened = scorer(runs, tokens, run=run, dtype=dtype, batch_size=3)
    prompts = [
        [opened.eos_id, *sc.encode(t)][-(64 - 30) :]
        for t in ("Mia counts to five: one,", "The dog", 'Ben says, "The', "A", *TEXTS)
    ]

    def loop(prompt, steps, eos):
        ids = list(prompt)
        with torch.inference_mode():
            for _ in range(steps):
                nxt = int(sc.model(torch.tensor([ids]))[0, -1].argmax())
                if nxt == eos:
                    break
                ids.append(nxt)
        return ids[len(prompt) :]

    plain = [loop(p, 30, opened.eos_id) for p in prompts]
    for batch_size in (1, 3, 64):
        sc.batch_size = batch_size
        assert sc.generate(prompts, stop=[], max_new_tokens=30) == [sc.decode(ids) for ids in plain]
    stop = sc.decode(plain[0][4:6])  # ends the first row early, others perhaps too
    assert sc.generate(prompts, stop=[stop], max_new_tokens=30) == [sc.decode(ids).split(stop)[0] for ids in plain]
    sc.eos_id = plain[0][5]  # a token the model generates, as the end-of-text token: rows end at different steps
    ended = [loop(p, 30, sc.eos_id) for p in prompts]
    assert len({len(ids) for ids in ended}) > 2
    assert sc.generate(prompts, stop=[], max_new_tokens=30) == [sc.decode(ids) for ids in ended]


def test_a_tasks_numbers_do_not_depend_on_the_other_tasks(evaluated, runs, tokens, tmp_path, monkeypatch):
    """Batches never mix tasks: a task evaluated alone gives, in bf16 compute, bit for bit the per-item
    log-likelihoods it gave beside the four other local tasks (whose requests, sorted by length
    together, would pad it into other batch shapes)."""
    monkeypatch.chdir(evaluated["root"])
    for task in ("streamback_pairs_counting", "streamback_cloze"):
        run_stage({"tasks": [task]}, runs["micro-streamback"], tokens, tmp_path / task)
        alone = [
            json.loads(line)["resps"] for line in (tmp_path / task / f"samples_{task}.jsonl").read_text().splitlines()
        ]
        beside = [
            json.loads(line)["resps"] for line in layout.eval_samples("micro-streamback", task).read_text().splitlines()
        ]
        assert alone == beside


@pytest.mark.slow
def test_hf_backend_agrees_with_the_streamback_backend(runs, tokens, evaluated, tmp_path, monkeypatch):
    """The peer cross-check: a baseline run exported with export-hf, scored by lm-eval's `hf` backend
    (transformers, fp32) and by the `streamback` backend (fp32 compute) on the local tasks: equal
    per-item log-likelihoods within |diff| <= 1e-6 |ll| + 1e-5 nats (transformers sums the token
    log-probabilities in fp32, we in fp64), the same greedy flags, the same accuracies."""
    import lm_eval
    from lm_eval.models.huggingface import HFLM
    from transformers import AutoTokenizer

    from streamback.eval.lm import StreambackLM

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    export(runs["micro-baseline"], tmp_path / "hf", tokens)
    hf_tokenizer = AutoTokenizer.from_pretrained(tmp_path / "hf")
    sc, run = scorer(runs, tokens)
    for text in TEXTS:
        assert hf_tokenizer.encode(text) == sc.encode(text)
    assert hf_tokenizer.eos_token_id == run.eos_id and hf_tokenizer.bos_token_id is None
    monkeypatch.chdir(evaluated["root"])
    names = evaluated["cfg"]["tasks"]
    manager = taskload.task_manager(names, [])
    samples = {}
    for backend, model in (
        ("hf", HFLM(pretrained=str(tmp_path / "hf"), dtype="float32", batch_size=8, device="cpu")),
        (
            "streamback",
            StreambackLM(pretrained=str(runs["micro-baseline"]), tokens=str(tokens), dtype="float32", batch_size=8),
        ),
    ):
        results = lm_eval.simple_evaluate(
            model=model,
            tasks=list(taskload.load_tasks(manager, names).values()),
            task_manager=manager,
            log_samples=True,
            bootstrap_iters=0,
        )
        samples[backend] = results["samples"]
    compared = 0
    for name in names:
        for a, b in zip(samples["hf"][name], samples["streamback"][name], strict=True):
            assert a["doc_id"] == b["doc_id"]
            for ra, rb in zip(a["resps"], b["resps"], strict=True):
                va, vb = (r[0] if isinstance(r[0], (list, tuple)) else r for r in (ra, rb))
                assert float(va[0]) == pytest.approx(float(vb[0]), rel=1e-6, abs=1e-5)
                if len(va) > 1:
                    assert va[1] == vb[1]
                compared += 1
            for metric in a["metrics"]:
                assert a[metric] == pytest.approx(b[metric], rel=1e-6, abs=1e-5)
    assert compared == 2 * (5 * 6 + 6 + 6) + 8 + 8


@pytest.mark.slow
def test_the_eval_command_line_lists_the_model_arguments_and_names_errors_in_one_line(tmp_path):
    """`python -m streamback.eval --help` ends with the model's arguments; a truncated model file is
    the project's one-line error (status 2) under lm-eval's own command line, no traceback."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    shown = subprocess.run(
        [sys.executable, "-m", "streamback.eval", "--help"], env=env, capture_output=True, text=True, timeout=120
    )
    assert shown.returncode == 0 and "the streamback model's arguments" in shown.stdout
    from streamback.eval.lm import MODEL_ARGUMENTS

    for name in MODEL_ARGUMENTS:
        assert f"\n  {name} " in shown.stdout
    truncated = tmp_path / "model.pt"
    truncated.write_bytes(b"PK\x03\x04" + b"\0" * 200)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "streamback.eval",
            "--model",
            "streamback",
            "--model_args",
            f"pretrained={truncated}",
            "--include_path",
            str(taskload.TASKS_DIR),
            "--tasks",
            "streamback_cloze",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert (
        proc.stderr.strip()
        .splitlines()[-1]
        .startswith(
            f"python -m streamback.eval: error: streamback model: model file {truncated} cannot be read by torch.load"
        )
    )


def test_unknown_tasks_groups_and_missing_or_empty_items_are_named(
    evaluated, runs, tokens, tmp_path, monkeypatch, no_scoring
):
    monkeypatch.chdir(evaluated["root"])
    with pytest.raises(
        StreambackError, match="knows no task 'streamback_pairs_agreemnt'.*close names: streamback_pairs_agreement"
    ):
        run_stage({"tasks": ["streamback_pairs_agreemnt"]}, runs["micro-baseline"], tokens, tmp_path / "out")
    with pytest.raises(StreambackError, match="'streamback_local' is a group or tag"):
        run_stage({"tasks": ["streamback_local"]}, runs["micro-baseline"], tokens, tmp_path / "out")
    monkeypatch.chdir(tmp_path)  # no items written here
    with pytest.raises(
        StreambackError,
        match=r"task streamback_cloze, split test: no data file matches results/eval/tasks/streamback_cloze.jsonl "
        r"\(local tasks: run `streamback eval-tasks` \(rule eval_tasks\)\)",
    ):
        run_stage({"tasks": ["streamback_cloze"]}, runs["micro-baseline"], tokens, tmp_path / "out")
    layout.eval_task_file("streamback_cloze").parent.mkdir(parents=True)
    layout.eval_task_file("streamback_cloze").write_text("")
    with pytest.raises(
        StreambackError,
        match=r"task streamback_cloze has no items: results/eval/tasks/streamback_cloze.jsonl \(split test\) is empty",
    ):
        run_stage({"tasks": ["streamback_cloze"]}, runs["micro-baseline"], tokens, tmp_path / "out")


@pytest.mark.slow
def test_a_hub_task_offline_stops_before_scoring_naming_task_and_dataset(runs, tokens, tmp_path):
    """config/paper.yaml's tasks need the hub: offline, with an empty cache, `streamback evaluate`
    exits 2 naming the task and its dataset (the model was loaded and checked first)."""
    params = json.dumps({**SMALL, "tasks": ["arc_easy", "winogrande"]})
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "HF_HOME": str(tmp_path / "hf-home"),
        "HF_DATASETS_OFFLINE": "1",
        "HF_HUB_OFFLINE": "1",
    }
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "streamback",
            "evaluate",
            "--params",
            params,
            "--run-name",
            "micro-baseline",
            "--model",
            str(runs["micro-baseline"]),
            "--tokens",
            str(tokens),
            "--outdir",
            str(tmp_path / "out"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "task arc_easy: cannot load its dataset allenai/ai2_arc (ARC-Easy)" in proc.stderr, proc.stderr[-2000:]
    assert "offline, a hub dataset is read from the datasets cache" in proc.stderr, proc.stderr[-2000:]
    assert "`snakemake fetch`" in proc.stderr and not (tmp_path / "out" / "results.json").exists()


@pytest.mark.slow
def test_rules_evaluate_every_run_and_write_the_tables(run_snakemake, tmp_path):
    """eval_tasks, evaluate (one job per run) and benchmark_table through Snakemake on a small config:
    a 600-story corpus, the two micro runs (12 steps), the local tasks at a few items each, and each
    run's last 3 checkpoints (eval.last_checkpoints: steps 8, 10 and 12, scored in its one evaluate job)."""
    small = tmp_path / "small.yaml"
    small.write_text(
        yaml.safe_dump(
            {
                "data": {
                    "synthetic": {"documents": 600, "files": 1},
                    "tokenizer": {"vocab_size": 300, "train_documents": 600},
                    "shard_tokens": 20000,
                    "processes": 1,
                },
                "model": MODEL,
                "train": {
                    **TRAIN,
                    "tokens": 12 * 8 * 32,
                    "schedule": {"warmup_steps": 4, "decay_steps": 4},
                    "checkpoint": {"every": 12, "keep": 1},
                    "log": {**TRAIN["log"], "val_every": 12},
                },
                "eval": {**SMALL, "last_checkpoints": 3, "checkpoint_spacing": 2},
            }
        )
    )
    targets = [layout.table(name) for name in (*layout.BENCHMARK_TABLES, layout.CHECKPOINT_TABLE)]
    result = run_snakemake(
        *targets,
        "--cores",
        "2",
        "--directory",
        tmp_path,
        "--configfile",
        ROOT / "config" / "config.yaml",
        small,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-3000:]
    benchmarks = pd.read_csv(tmp_path / layout.table("benchmarks"))
    assert list(benchmarks.columns) == [
        "run",
        "shape",
        "block",
        "stream",
        "seed",
        "task",
        "filter",
        "metric",
        "value",
        "stderr",
        "n",
        "chance",
        "checkpoints",
        "checkpoint_mean",
        "checkpoint_sd",
    ]
    assert sorted(set(benchmarks.run)) == sorted(RUNS) and len(benchmarks) == 2 * 8
    assert (benchmarks.checkpoints == 3).all() and benchmarks.checkpoint_sd.notna().all()
    checkpoints = pd.read_csv(tmp_path / layout.table(layout.CHECKPOINT_TABLE))
    assert sorted(set(checkpoints.step)) == [8, 10, 12] and len(checkpoints) == 3 * len(benchmarks)
    assert all((tmp_path / layout.snapshot_file(run, step)).is_file() for run in RUNS for step in (8, 10))
    pairs = pd.read_csv(tmp_path / layout.table("benchmark_pairs"))
    assert (
        list(pairs.run) == ["micro-streamback"] * 8
        and pairs.verdict.str.contains("noise|no difference|one training seed").all()
    )
    for run in RUNS:
        assert json.loads((tmp_path / layout.eval_results(run)).read_text())["config"]["streamback"]["run"] == run
        log = (tmp_path / "logs" / "evaluate" / f"{run}.log").read_text()
        assert "wrote results/eval" in log and log.count("evaluate: snapshot ") == 2
