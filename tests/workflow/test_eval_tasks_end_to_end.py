"""The end-to-end half of test_eval_tasks.py (commands run as processes, compiled or multi-process runs, Snakemake): the
same subjects, at the pace of whole runs."""

import json

import lm_eval
import pytest

from streamback import layout
from streamback.config import validate_config
from streamback.eval import stage, tables, taskload

from helpers.eval import MODEL, RUNS, SMALL, TRAIN, runs  # noqa: F401  (runs: the two micro runs, a fixture)

# full_indexes, long_runs, task_name_cache: fixtures
from helpers.eval_tasks import LM_EVAL_TASKS, check_names, full_indexes, long_runs, real_tasks, task_name_cache  # noqa: F401


@pytest.mark.slow
def test_the_stage_and_tables_run_real_lm_eval_tasks(long_runs, tokens, monkeypatch):
    """hellaswag, gsm8k and wikitext through `stage.evaluate` (both runs, as trained) and the tables:
    one row per task, filter and metric, gsm8k's two filters apart and each paired on its own items,
    the Holm family naming what it covers."""
    monkeypatch.chdir(long_runs)
    names = real_tasks(long_runs)
    cfg = validate_config({"eval": {**SMALL, "tasks": names, "include_path": ["tasks"]}})["eval"]
    results = {run: stage.evaluate(cfg, layout.model_file(run), tokens, layout.eval_dir(run)) for run in RUNS}
    for run in RUNS:
        assert {t: results[run]["n-samples"][t]["effective"] for t in names} == {
            "hellaswag": 5,
            "gsm8k": 6,
            "wikitext": 3,
        }
        gsm8k = [json.loads(line) for line in layout.eval_samples(run, "gsm8k").read_text().splitlines()]
        assert sorted(s["filter"] for s in gsm8k) == ["flexible-extract"] * 6 + ["strict-match"] * 6
        assert (
            gsm8k[0]["arguments"]["gen_args_0"]["arg_0"].count("Question:") == 6
        )  # five shots from the train split, then the item
    train_cfg = validate_config({"model": MODEL, "train": TRAIN})["train"]
    benchmarks, pairs, _ = tables.tables(cfg, train_cfg)
    assert (
        list(pairs.seed.astype(str)) == [str(train_cfg["seed"])] * 4 + ["all"] * 4
    )  # per seed, then over the (one) seed
    pairs = pairs[pairs.seed.astype(str) != "all"]
    rows = {(r.run, r.task, r.filter, r.metric): r for r in benchmarks.itertuples()}
    want = [
        ("hellaswag", "none", "acc"),
        ("hellaswag", "none", "acc_norm"),
        ("gsm8k", "strict-match", "exact_match"),
        ("gsm8k", "flexible-extract", "exact_match"),
        ("wikitext", "none", "word_perplexity"),
        ("wikitext", "none", "byte_perplexity"),
        ("wikitext", "none", "bits_per_byte"),
    ]
    assert sorted(rows) == sorted((run, *key) for run in RUNS for key in want)
    for (run, task, filt, metric), row in rows.items():
        assert (
            row.value == results[run]["results"][task][f"{metric},{filt}"]
            and row.n == {"hellaswag": 5, "gsm8k": 6, "wikitext": 3}[task]
        )
    assert list(pairs[["task", "filter", "metric"]].itertuples(index=False, name=None)) == want[:4]
    for row in pairs.itertuples():
        samples = [
            json.loads(line) for line in layout.eval_samples("micro-streamback", row.task).read_text().splitlines()
        ]
        mine = {s["doc_id"]: s[row.metric] for s in samples if s["filter"] == row.filter}
        # derived: the same formula by hand on the same floats (fp64 roundings only, within approx's default 1e-6)
        assert row.n == len(mine) and row.value == pytest.approx(sum(mine.values()) / len(mine))
        assert row.tests == 4 and row.family == (
            "micro-streamback vs micro-baseline, 4 tests: hellaswag acc; hellaswag acc_norm; "
            "gsm8k exact_match (strict-match, flexible-extract)"
        )
    # the study page shows the two filters apart
    from streamback.io import write_csv
    from streamback.report import page

    for name, frame in zip(layout.BENCHMARK_TABLES, (benchmarks, pairs)):
        write_csv(layout.table(name), frame)
    wide, _, _, shown, _ = page.benchmarks()
    assert {"gsm8k (exact_match, strict-match)", "gsm8k (exact_match, flexible-extract)", "hellaswag (acc)"} <= set(
        wide.columns
    )
    assert list(shown["filter"]) == ["none", "none", "strict-match", "flexible-extract"]


@pytest.mark.slow
def test_lm_evals_own_names_are_indexed_once_and_cached(tmp_path, capsys, full_indexes, task_name_cache):
    """A cold cache: lm-eval's own tasks are indexed (its real TaskManager) once, then read from the cache."""
    status, out = check_names(tmp_path, capsys, ["streamback_clze"])
    assert status == 2 and len(full_indexes) == 1
    assert (
        "eval.tasks: lm-eval knows no task 'streamback_clze' (local tasks, eval.include_path and lm-eval's own); close "
        "names: "
        "streamback_cloze" in out.err
    )
    cached = json.loads(taskload._cache_file().read_text())
    assert taskload._cache_file().parent == task_name_cache / "streamback" and cached["installed"] == str(
        LM_EVAL_TASKS.parent
    )
    assert {"arc_easy", "gsm8k", "hellaswag", "wikitext"} <= set(cached["tasks"]) and "ai2_arc" in cached["groups"]
    assert (
        check_names(tmp_path, capsys, ["arc_easy", "hellaswag", "streamback_cloze"])[0] == 0 and len(full_indexes) == 1
    )


@pytest.mark.slow
def test_an_unknown_task_name_stops_a_dry_run(tmp_path, task_name_cache, run_snakemake):
    """`snakemake -n` with a misspelt eval.tasks name stops before any job, naming the close names
    (the Snakefile runs the same check; lm-eval's own names come from the cache the test above filled)."""
    import os
    import subprocess
    import sys

    from conftest import ROOT

    bad = tmp_path / "bad.yaml"
    bad.write_text(json.dumps({"eval": {"tasks": ["streamback_cloze", "gsm8kk"]}}))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "snakemake",
            "-s",
            str(ROOT / "Snakefile"),
            "-n",
            "--directory",
            str(tmp_path),
            "--configfile",
            str(bad),
        ],
        env={**os.environ, "XDG_CACHE_HOME": str(task_name_cache)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 0
    assert "eval.tasks: lm-eval knows no task 'gsm8kk'" in proc.stderr and "close names: gsm8k" in proc.stderr, (
        proc.stderr[-2000:]
    )
    assert "Job stats" not in proc.stdout + proc.stderr


@pytest.mark.slow
def test_gsm8k_generations_equal_the_hf_backends(long_runs, tokens, tmp_path, monkeypatch):
    """lm-eval's gsm8k (5-shot, 256 new tokens, greedy), run by the `hf` backend (transformers, its
    own KV cache) on the export and by the `streamback` model with its KV cache, both fp32: the same
    generations, item for item, and the same scores under both filters."""
    from lm_eval.models.huggingface import HFLM

    from streamback.eval.lm import StreambackLM
    from streamback.model.export_hf import export

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(long_runs)
    real_tasks(long_runs)
    model = layout.model_file("micro-baseline")
    export(model, tmp_path / "hf", tokens)
    manager = taskload.task_manager(["gsm8k"], ["tasks"])
    outputs = {}
    for backend, lm in (
        ("hf", HFLM(pretrained=str(tmp_path / "hf"), dtype="float32", batch_size=4, device="cpu")),
        ("streamback", StreambackLM(pretrained=str(model), tokens=str(tokens), dtype="float32", batch_size=4)),
    ):
        out = lm_eval.simple_evaluate(
            model=lm,
            tasks=list(taskload.load_tasks(manager, ["gsm8k"]).values()),
            task_manager=manager,
            log_samples=True,
            bootstrap_iters=0,
        )
        outputs[backend] = out
    hf, ours = (outputs[b]["samples"]["gsm8k"] for b in ("hf", "streamback"))
    assert len(hf) == len(ours) == 12
    for a, b in zip(hf, ours, strict=True):
        assert (
            (a["doc_id"], a["filter"]) == (b["doc_id"], b["filter"])
            and a["resps"] == b["resps"]
            and len(a["resps"][0][0]) > 100
        )
    assert outputs["hf"]["results"]["gsm8k"] == outputs["streamback"]["results"]["gsm8k"]
