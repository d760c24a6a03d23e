"""lm-eval's own task definitions through the evaluation stage, offline: local copies of lm-eval
0.4.13's task YAMLs (hellaswag, piqa: multiple choice; gsm8k: generation under two filters;
wikitext: rolling log-likelihood), with only their dataset lines pointed at small data files the
tests write in the Hub datasets' schemas. Every form of data files lm-eval accepts passes the
stage's data check; a missing or unreadable file is named with its task and split; the stage and
the tables run the three kinds of task end to end; gsm8k's generations equal lm-eval's `hf`
backend's on the exported model."""

import json
import os
import subprocess
import sys
from pathlib import Path

import lm_eval
import pyarrow as pa
import pytest

from streamback.errors import StreambackError
from streamback.eval import taskload

from helpers.eval_tasks import (  # noqa: F401  (full_indexes, task_name_cache: fixtures)
    LM_EVAL_TASKS,
    check_names,
    full_indexes,
    local_copy,
    task_name_cache,
    write_jsonl,
    write_parquet,
)

PIQA = [
    {"goal": f"How do I {verb} a {thing}?", "sol1": f"Use a {tool}.", "sol2": f"Ask the {thing}.", "label": k % 2}
    for k, (verb, thing, tool) in enumerate(
        [
            ("open", "jar", "spoon"),
            ("fold", "shirt", "table"),
            ("clean", "window", "cloth"),
            ("fix", "chair", "hammer"),
            ("warm", "room", "stove"),
            ("light", "lamp", "match"),
        ]
    )
]


def piqa_forms(root: Path) -> dict[str, int]:
    """lm-eval's piqa, once per form of data files, each giving the train split (piqa's YAML reads
    its few-shot pool there, even at 0 shots) and the validation split it evaluates: {task name:
    validation items}."""
    data = root / "data"
    train, valid = PIQA[:2], PIQA
    for split, rows in (("train", train), ("validation", valid)):
        write_parquet(data / f"{split}.parquet", rows)
        table = pa.Table.from_pylist(rows)
        with pa.OSFile(str(data / f"{split}.arrow"), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)  # the Arrow stream files datasets' save_to_disk writes
        (data / f"{split}.csv").write_text(
            "goal,sol1,sol2,label\n"
            + "".join(f'"{r["goal"]}","{r["sol1"]}","{r["sol2"]}",{r["label"]}\n' for r in rows)
        )
        (data / f"{split}.json").write_text(json.dumps(rows))  # one JSON array
        write_jsonl(data / f"{split}.jsonl", rows)
        write_parquet(
            root / "piqa-copy" / "data" / f"{split}-00000-of-00001.parquet", rows
        )  # a local copy of the hub repository
    write_jsonl(data / "valid-a.jsonl", valid[:4])
    write_jsonl(data / "valid-b.jsonl", valid[4:])
    forms = {
        "piqa_parquet": ("parquet", {"train": "data/train.parquet", "validation": "data/validation.parquet"}, 6),
        "piqa_arrow": ("arrow", {"train": "data/train.arrow", "validation": "data/validation.arrow"}, 6),
        "piqa_csv": ("csv", {"train": "data/train.csv", "validation": "data/validation.csv"}, 6),
        "piqa_json": ("json", {"train": "data/train.json", "validation": "data/validation.json"}, 6),
        "piqa_jsonl": ("json", {"train": "data/train.jsonl", "validation": "data/validation.jsonl"}, 6),
        "piqa_glob": ("json", {"train": "data/tr*.jsonl", "validation": "data/valid-*.jsonl"}, 6),
        "piqa_list": (
            "json",
            {"train": ["data/train.jsonl"], "validation": ["data/valid-a.jsonl", "data/valid-b.jsonl"]},
            6,
        ),
        "piqa_mixed": ("json", {"train": "data/train.jsonl", "validation": ["data/valid-a.jsonl"]}, 4),
        "piqa_directory": (str(root / "piqa-copy"), None, 6),
    }
    for task, (path, files, _) in forms.items():
        local_copy("piqa/piqa.yaml", root / "tasks", path, files, task=task)
    return {task: n for task, (_, _, n) in forms.items()}


def test_every_form_of_data_files_lm_eval_accepts_passes(tmp_path, monkeypatch):
    """Parquet, Arrow, CSV, a JSON array, JSON lines, a glob, a list, a dict of splits and a local
    dataset directory: each loads through the stage's data check with PIQA's items, as written."""
    monkeypatch.chdir(tmp_path)
    forms = piqa_forms(tmp_path)
    names = list(forms)
    loaded = taskload.load_tasks(taskload.task_manager(names, ["tasks"]), names)
    for name, task in loaded.items():
        docs = list(task.eval_docs)
        assert len(docs) == forms[name], name
        assert {(d["goal"], d["sol1"], d["label"]) for d in docs} <= {(r["goal"], r["sol1"], r["label"]) for r in PIQA}
        assert task.doc_to_text(docs[0]) == f"Question: {docs[0]['goal']}\nAnswer:"


@pytest.mark.parametrize(
    "files, message",
    [
        (
            {"validation": ["data/valid-a.jsonl", "data/missing.jsonl"]},
            r"task piqa_x, split validation: no data file matches data/missing.jsonl",
        ),
        (
            {"validation": "data/nothing-*.jsonl"},
            r"task piqa_x, split validation: no data file matches data/nothing-\*.jsonl",
        ),
        (
            {"train": "data/good.parquet", "validation": "data/broken.parquet"},
            r"task piqa_x, split validation: data/broken.parquet cannot be read as parquet data: ArrowInvalid",
        ),
        (
            {"train": "data/valid-a.jsonl", "validation": "data/empty.jsonl"},
            r"task piqa_x has no items: data/empty.jsonl \(split validation\) is empty",
        ),
        (
            "data/valid-a.jsonl",
            r"task piqa_x reads split 'validation' \(validation_split in tasks/piqa_x.yaml\), but its data files give "
            r"only train",
        ),
        (
            {"validation": "data/valid-a.jsonl"},
            r"task piqa_x reads split 'train' \(training_split in tasks/piqa_x.yaml\), but its data files give "
            r"only validation",
        ),
        (
            None,
            r"task piqa_x: cannot load its dataset ./piqa-copy: .* \(dataset_path ./piqa-copy in tasks/piqa_x.yaml is "
            r"not a directory",
        ),
    ],
)
def test_missing_or_unreadable_data_are_named_with_task_and_split(tmp_path, monkeypatch, files, message):
    """Before any model runs: the task, the split and the file, with a hint that fits a user's own
    task (its YAML and the working directory, never `streamback eval-tasks`)."""
    monkeypatch.chdir(tmp_path)
    write_jsonl(tmp_path / "data" / "valid-a.jsonl", PIQA[:4])
    (tmp_path / "data" / "broken.parquet").write_bytes(b"PAR1" + bytes(range(200)) + b"PAR1")
    write_parquet(tmp_path / "data" / "good.parquet", PIQA[:2])
    (tmp_path / "data" / "empty.jsonl").write_text("")
    dataset_path = "parquet" if "broken" in json.dumps(files) else "json" if files else "./piqa-copy"
    local_copy("piqa/piqa.yaml", tmp_path / "tasks", dataset_path, files, task="piqa_x")
    with pytest.raises(StreambackError, match=message) as caught:
        taskload.load_tasks(taskload.task_manager(["piqa_x"], ["tasks"]), ["piqa_x"])
    text = str(caught.value)
    assert "\n" not in text and "eval-tasks" not in text
    if "empty" not in text and files:
        assert (
            "see dataset_path and dataset_kwargs in tasks/piqa_x.yaml; relative paths are read from the working "
            f"directory, {tmp_path}" in text
        )


# ---- the stage on three kinds of real task -------------------------------------------------------


# ---- task names, at DAG time ---------------------------------------------------------------------


def test_local_task_names_are_indexed_once_then_read_until_a_file_changes(tmp_path, monkeypatch):
    """The names of the local tasks and include_path come from lm-eval's TaskManager once; a later
    check reads them from the cache (no TaskManager built, and in a new process no lm-eval imported:
    the Snakefile's check at every `snakemake`), until a file under them changes: a task added to
    include_path is then indexed and found."""
    from lm_eval import tasks as lm_eval_tasks

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    built, real = [], lm_eval_tasks.TaskManager

    def counting(*args, **kwargs):
        built.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(lm_eval_tasks, "TaskManager", counting)
    extra = tmp_path / "tasks"
    local_copy("piqa/piqa.yaml", extra, "piqa", task="piqa_x")
    names = ["streamback_cloze", "piqa_x"]
    assert taskload.check_task_names(names, [str(extra)]) is True and len(built) == 1
    assert not built[0].get("include_defaults", True)  # the local tasks alone: lm-eval's own not indexed
    assert taskload.check_task_names(names, [str(extra)]) is True and len(built) == 1
    assert taskload.local_task_names([str(extra)]) == {
        "tasks": sorted(["piqa_x", *(p.stem for p in taskload.TASKS_DIR.glob("streamback_*.yaml"))]),
        "groups": ["streamback_local"],
    }
    code = (
        "import sys; from streamback.eval.taskload import check_task_names; "
        f"print(check_task_names({names!r}, [{str(extra)!r}]), 'lm_eval' in sys.modules)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], env=dict(os.environ), capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.stdout.split() == ["True", "False"], proc.stderr[-2000:]
    own = taskload._cache_file()  # lm-eval's own names, cached (their index takes seconds)
    own.write_text(json.dumps({"installed": str(LM_EVAL_TASKS.parent), "tasks": ["arc_easy"], "groups": []}))
    with pytest.raises(StreambackError, match="lm-eval knows no task 'piqa_y'"):
        taskload.check_task_names(["piqa_y"], [str(extra)])  # not local: lm-eval's own names are asked
    local_copy("piqa/piqa.yaml", extra, "piqa", task="piqa_y")
    assert taskload.check_task_names(["piqa_y"], [str(extra)]) is True and len(built) == 2


def test_task_names_are_checked_by_streamback_check_from_the_cache(tmp_path, capsys, full_indexes, monkeypatch):
    """`streamback check` asks lm-eval's TaskManager: local names, and a tag, need no index of lm-eval's
    own tasks; other names are looked up in the cached names of this lm-eval installation (an
    unknown one named with its close names), and a cache of another installation is not used."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert check_names(tmp_path, capsys, ["streamback_cloze", "streamback_perplexity"])[0] == 0
    status, out = check_names(tmp_path, capsys, ["streamback_local"])
    assert (
        status == 2
        and "eval.tasks: 'streamback_local' is a group or tag of lm-eval tasks; list its tasks instead" in out.err
    )
    installed = str(LM_EVAL_TASKS.parent)
    cache = taskload._cache_file()
    assert cache == tmp_path / "cache" / "streamback" / f"lm-eval-{lm_eval.__version__}-task-names.json"
    assert (cache.parent / "local-task-names.json").is_file()  # the local names, cached beside
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(
        json.dumps({"installed": installed, "tasks": ["arc_easy", "arc_challenge", "gsm8k"], "groups": ["ai2_arc"]})
    )
    full_indexes.append("refuse")
    assert check_names(tmp_path, capsys, ["arc_easy", "streamback_cloze"])[0] == 0
    status, out = check_names(tmp_path, capsys, ["arc_esy", "gsm8k"])
    assert (
        status == 2
        and (
            "eval.tasks: lm-eval knows no task 'arc_esy' (local tasks, eval.include_path and lm-eval's own); "
            "close names: arc_easy"
        )
        in out.err
    )
    status, out = check_names(tmp_path, capsys, ["ai2_arc"])
    assert status == 2 and "'ai2_arc' is a group or tag" in out.err
    cache.write_text(json.dumps({"installed": "/another/lm_eval", "tasks": ["arc_easy"], "groups": []}))
    with pytest.raises(RuntimeError, match="indexed again"):
        check_names(tmp_path, capsys, ["arc_easy"])
    assert full_indexes == ["refuse"]
