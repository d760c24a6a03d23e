"""lm-eval's own tasks offline, shared by the task tests: local copies of its task YAMLs over small data files, three
real tasks, the micro runs with a longer context, and the task-name check with its cache and index count."""

import dataclasses
import json
import shutil
from pathlib import Path

import lm_eval
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from streamback import layout
from streamback.model.weights import read_model, save_model

from helpers.eval import RUNS

LM_EVAL_TASKS = Path(lm_eval.__file__).resolve().parent / "tasks"
HELLASWAG = [
    {
        "ind": 10 + k,
        "activity_label": label,
        "ctx_a": f"A {who} stands in a kitchen.",
        "ctx_b": "she picks up a cup",
        "ctx": f"A {who} stands in a kitchen. She picks up a cup",
        "endings": [f"and drinks {x}." for x in ("tea", "water", "milk", "juice")],
        "source_id": f"activitynet~v_{k}",
        "split": "val",
        "split_type": "indomain",
        "label": str(k % 4),
    }
    for k, (label, who) in enumerate(
        [
            ("Making tea", "woman"),
            ("Cooking", "man"),
            ("Cleaning [title] dishes", "girl"),
            ("Baking", "boy"),
            ("Washing", "cook"),
        ]
    )
]
GSM8K = [
    {
        "question": f"{name} has {a} apples and buys {b} more. How many apples does {name} have?",
        "answer": f"{name} has {a} + {b} = <<{a}+{b}={a + b}>>{a + b} apples.\n#### {a + b}",
    }
    for name, a, b in [
        ("Mia", 3, 4),
        ("Ben", 2, 5),
        ("Ava", 6, 1),
        ("Leo", 4, 4),
        ("Zoe", 1, 8),
        ("Sam", 7, 2),
        ("Ivy", 5, 5),
        ("Max", 9, 3),
        ("Eve", 2, 2),
        ("Tom", 3, 6),
        ("Ada", 8, 1),
    ]
]
WIKITEXT = [
    {"page": f" = {title} = \n \n {title} is a small town . It has a river , a bridge and 1 @,@ 200 people . \n"}
    for title in ("Valley", "Hill Top", "River End")
]


def local_copy(task_file: str, directory: Path, dataset_path: str, data_files=None, task: str | None = None) -> Path:
    """lm-eval's own `task_file` (under lm_eval/tasks/) and the Python files beside it, copied into
    `directory` with only its dataset lines changed (and its task name, if `task` is given)."""
    source = LM_EVAL_TASKS / task_file
    directory.mkdir(parents=True, exist_ok=True)
    lines = [
        line for line in source.read_text().splitlines() if not line.startswith(("dataset_path:", "dataset_name:"))
    ]
    if task is not None:
        lines = [f"task: {task}" if line.startswith("task:") else line for line in lines]
    lines.append(f"dataset_path: {dataset_path}")
    if data_files is not None:
        lines.append("dataset_kwargs: " + json.dumps({"data_files": data_files}))  # JSON is YAML
    for helper in source.parent.glob("*.py"):
        shutil.copy(helper, directory)
    target = directory / f"{task or source.stem}.yaml"
    target.write_text("\n".join(lines) + "\n")
    return target


def write_jsonl(path: Path, rows: list[dict]) -> None:
    """`rows` as JSON lines at `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def write_parquet(path: Path, rows: list[dict], schema: pa.Schema | None = None) -> None:
    """`rows` as a parquet file at `path` (with `schema`, if given)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)


HELLASWAG_SCHEMA = pa.schema(
    [
        ("ind", pa.int32()),
        ("activity_label", pa.string()),
        ("ctx_a", pa.string()),
        ("ctx_b", pa.string()),
        ("ctx", pa.string()),
        ("endings", pa.list_(pa.string())),
        ("source_id", pa.string()),
        ("split", pa.string()),
        ("split_type", pa.string()),
        ("label", pa.string()),
    ]
)


def real_tasks(root: Path) -> list[str]:
    """hellaswag (multiple choice, from parquet), gsm8k (generation, two filters, 5-shot, from JSON
    lines by a glob) and wikitext (rolling log-likelihood, from a list of parquet files), lm-eval's
    own YAMLs in root/tasks with their data in root/data in the Hub datasets' schemas."""
    data = root / "data"
    write_parquet(
        data / "hellaswag" / "train-00000-of-00001.parquet", HELLASWAG[:2], HELLASWAG_SCHEMA
    )  # its few-shot pool
    write_parquet(data / "hellaswag" / "validation-00000-of-00001.parquet", HELLASWAG, HELLASWAG_SCHEMA)
    write_jsonl(data / "gsm8k" / "train.jsonl", GSM8K[:5])
    write_jsonl(data / "gsm8k" / "test-0.jsonl", GSM8K[5:8])
    write_jsonl(data / "gsm8k" / "test-1.jsonl", GSM8K[8:])
    write_parquet(
        data / "wikitext" / "train.parquet", WIKITEXT[:1]
    )  # read by lm-eval as a few-shot pool, even at 0 shots
    write_parquet(data / "wikitext" / "test-a.parquet", WIKITEXT[:2])
    write_parquet(data / "wikitext" / "test-b.parquet", WIKITEXT[2:])
    local_copy(
        "hellaswag/hellaswag.yaml",
        root / "tasks" / "hellaswag",
        "parquet",
        {
            "train": "data/hellaswag/train-00000-of-00001.parquet",
            "validation": "data/hellaswag/validation-00000-of-00001.parquet",
        },
    )
    local_copy(
        "gsm8k/gsm8k.yaml",
        root / "tasks" / "gsm8k",
        "json",
        {"train": "data/gsm8k/train.jsonl", "test": "data/gsm8k/test-*.jsonl"},
    )
    local_copy(
        "wikitext/wikitext.yaml",
        root / "tasks" / "wikitext",
        "parquet",
        {
            "train": "data/wikitext/train.parquet",
            "test": ["data/wikitext/test-a.parquet", "data/wikitext/test-b.parquet"],
        },
    )
    return ["hellaswag", "gsm8k", "wikitext"]


@pytest.fixture(scope="module")
def long_runs(runs, tmp_path_factory):
    """The two micro runs with a context of 512 positions (RoPE tables are not weights), so that
    gsm8k's 256 generated tokens fit: results/runs/<run>/model.pt of a working directory."""
    root = tmp_path_factory.mktemp("real-tasks")
    for run in RUNS:
        trained = read_model(runs[run])
        save_model(
            root / layout.model_file(run),
            dataclasses.replace(trained.args, max_seq_len=512),
            trained.state,
            trained.compute_dtype,
            data=trained.data,
        )
    return root


@pytest.fixture(scope="module")
def task_name_cache(tmp_path_factory):
    """A cache directory of this module's own ($XDG_CACHE_HOME), so the tests see a cold cache first."""
    return tmp_path_factory.mktemp("xdg-cache")


@pytest.fixture
def full_indexes(task_name_cache, monkeypatch):
    """The TaskManagers built over lm-eval's own tasks (the ~4 s index), counted; with `refuse`
    appended, building one raises instead."""
    from lm_eval import tasks as lm_eval_tasks

    monkeypatch.setenv("XDG_CACHE_HOME", str(task_name_cache))
    built, real = [], lm_eval_tasks.TaskManager

    def counting(*args, **kwargs):
        if kwargs.get("include_defaults", True):
            if "refuse" in built:
                raise RuntimeError("lm-eval's own tasks indexed again")
            built.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(lm_eval_tasks, "TaskManager", counting)
    return built


def check_names(tmp_path, capsys, tasks):
    """`streamback check` of a config with these eval.tasks: (status, captured output)."""
    from streamback.cli import main as cli_main

    config = tmp_path / "small.yaml"
    config.write_text(json.dumps({"eval": {"tasks": tasks}}))
    return cli_main(["check", str(config)]), capsys.readouterr()
