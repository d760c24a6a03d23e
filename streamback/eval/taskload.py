"""lm-eval tasks found by name and loaded with their data checked, before anything is scored.

- `check_task_names` (also at DAG time: the Snakefile and `streamback check` call it): every name
  of eval.tasks must be a task that lm-eval's TaskManager finds, offline, in the local tasks
  (streamback/eval/tasks/), eval.include_path or lm-eval's own; an unknown one is named with the
  closest names, a group or tag is refused (samples are kept per task). Indexing lm-eval's own
  task names takes seconds, so their names are kept in the user's cache
  (`$XDG_CACHE_HOME/streamback/`, else ~/.cache/streamback/), once per lm-eval version and
  installation; the names in the local tasks and include_path are cached too, under a fingerprint
  of their files (each file's path, size and modification time) and of lm-eval's installation, so
  a check whose names are all local imports no lm-eval at all once they were indexed (the
  Snakefile runs it at every `snakemake`, and through Slurm in every job).
- `task_manager`: the TaskManager that loads them (lm-eval's own tasks indexed only if a name is one).
- `load_tasks`: each task's data as lm-eval loads them, `datasets.load_dataset(dataset_path,
  dataset_name, **dataset_kwargs)`, so whatever lm-eval accepts passes (parquet, arrow, csv,
  json, jsonl; a file, a glob, a list, a dict of splits; a local dataset directory). For local
  data the files are first resolved as datasets resolves them: a split whose pattern matches no
  file, or an empty file, is named with its task and split; so are a split lm-eval reads that the
  files do not give, and a file datasets cannot read. The hint fits the task: `streamback
  eval-tasks` for the built-in local tasks, the task's own YAML for the others, the hub for hub
  datasets; offline (every job but fetch of a config with a `hub_cache`), `snakemake fetch`.
- `hub_tasks`: the tasks whose data come from the Hub, which `streamback fetch` loads.
"""

from __future__ import annotations

import difflib
import hashlib
import inspect
import json
import os
from importlib.metadata import version
from importlib.util import find_spec
from pathlib import Path

from streamback.data.hubcache import FETCH_HINT
from streamback.errors import StreambackError
from streamback.io import write_json

TASKS_DIR = (
    Path(__file__).resolve().parent / "tasks"
)  # the built-in local tasks' YAML files (their items: `streamback eval-tasks`)


def _cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "streamback"


def _cache_file() -> Path:
    import lm_eval

    return _cache_dir() / f"lm-eval-{lm_eval.__version__}-task-names.json"


def lm_eval_task_names() -> dict[str, list[str]]:
    """{"tasks": lm-eval's own task names, "groups": its groups and tags}, from the cache when it
    was written for this lm-eval installation, else from its TaskManager (and cached)."""
    import lm_eval

    def index():
        from lm_eval.tasks import TaskManager

        return TaskManager()

    return _cached_names(_cache_file(), {"installed": str(Path(lm_eval.__file__).resolve().parent)}, index)


def _cached_names(path: Path, key: dict, index) -> dict[str, list[str]]:
    """{"tasks", "groups"} kept at `path` when they were kept there under `key` (its fields), else
    those of the TaskManager that `index()` builds, then kept there under `key`."""
    try:
        cached = json.loads(path.read_text())
        if all(cached.get(field) == value for field, value in key.items()):
            return {"tasks": cached["tasks"], "groups": cached["groups"]}
    except (OSError, ValueError, KeyError, AttributeError):
        pass
    manager = index()
    names = {
        "tasks": sorted(manager.all_subtasks),
        "groups": sorted(set(manager.all_tasks) - set(manager.all_subtasks)),
    }
    try:
        write_json(path, {**key, **names})
    except OSError:  # an unwritable cache costs time, not correctness
        pass
    return names


def _check_include_path(include_path: list[str]) -> None:
    for path in include_path:
        if not Path(path).is_dir():
            raise StreambackError(f"eval.include_path: {path} is not a directory")


def _local_manager(include_path: list[str]):
    from lm_eval.tasks import TaskManager

    _check_include_path(include_path)
    return TaskManager(include_defaults=False, include_path=[str(TASKS_DIR), *include_path])


def _local_fingerprint(include_path: list[str]) -> str:
    """What the local index depends on: lm-eval's installation and version (found without importing
    it) and every file under the local tasks and include_path, by path, size and modification time."""
    digest = hashlib.sha256(json.dumps([version("lm_eval"), find_spec("lm_eval").origin]).encode())
    for root in (TASKS_DIR, *include_path):
        digest.update(f"\0{Path(root).resolve()}".encode())
        for path in sorted(p for p in Path(root).rglob("*") if p.is_file()):
            stat = path.stat()
            digest.update(f"\0{path.relative_to(root)}\0{stat.st_size}\0{stat.st_mtime_ns}".encode())
    return digest.hexdigest()


def local_task_names(include_path: list[str]) -> dict[str, list[str]]:
    """{"tasks", "groups"} of the local tasks and include_path as lm-eval's TaskManager indexes them
    (`_local_manager`), from the cache when its fingerprint matches these files, else indexed and
    cached. An include_path entry that is not a directory is a one-line error."""
    _check_include_path(include_path)
    return _cached_names(
        _cache_dir() / "local-task-names.json",
        {"fingerprint": _local_fingerprint(include_path)},
        lambda: _local_manager(include_path),
    )


def check_task_names(names: list[str], include_path: list[str]) -> bool:
    """Check that every name is a task (not a group or tag) of the local tasks, include_path or
    lm-eval's own; returns whether all are local (found without lm-eval's own)."""
    local = local_task_names(include_path)
    tasks = set(local["tasks"])
    groups = set(local["groups"])
    all_local = all(name in tasks for name in names)
    if not all(name in tasks | groups for name in names):  # a name is not local at all: ask lm-eval's own
        own = lm_eval_task_names()
        tasks, groups = tasks | set(own["tasks"]), groups | set(own["groups"])
    for name in names:
        if name in tasks:
            continue
        if name in groups:
            raise StreambackError(
                f"eval.tasks: {name!r} is a group or tag of lm-eval tasks; list its tasks instead "
                "(the per-item samples are kept per task)"
            )
        close = difflib.get_close_matches(name, sorted(tasks | groups), n=6, cutoff=0.6)
        raise StreambackError(
            f"eval.tasks: lm-eval knows no task {name!r} (local tasks, eval.include_path and lm-eval's own); "
            + (f"close names: {', '.join(close)}" if close else "`lm-eval ls tasks` lists them")
        )
    return all_local


def task_manager(names: list[str], include_path: list[str]):
    """lm-eval's TaskManager for `names` (checked by `check_task_names`): the local tasks and
    `include_path` only, unless a name is lm-eval's own."""
    from lm_eval.tasks import TaskManager

    if check_task_names(names, include_path):
        return _local_manager(include_path)
    return TaskManager(include_path=[str(TASKS_DIR), *include_path])


def _data_description(cfg: dict) -> str:
    """A task config's dataset, as a message names it."""
    files = (cfg.get("dataset_kwargs") or {}).get("data_files")
    if files:
        listed = files.values() if isinstance(files, dict) else [files] if isinstance(files, str) else files
        return f"dataset {cfg.get('dataset_path')} (data_files {', '.join(map(str, listed))})"
    name = f" ({cfg['dataset_name']})" if cfg.get("dataset_name") else ""
    return f"dataset {cfg.get('dataset_path')}{name}"


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text[:400]}{'...' if len(text) > 400 else ''}"


class _Data:
    """A task's dataset as lm-eval passes it to `datasets.load_dataset`."""

    def __init__(self, name: str, cfg: dict, yaml_path):
        self.task, self.cfg, self.yaml_path = name, cfg, yaml_path
        self.path, self.name = str(cfg.get("dataset_path")), cfg.get("dataset_name")
        self.kwargs = {
            k: v for k, v in (cfg.get("dataset_kwargs") or {}).items() if k != "trust_remote_code"
        }  # lm-eval drops it too

    @property
    def local(self) -> bool:
        """Read from local files (a packaged builder such as json or parquet, or a directory), not the hub."""
        from datasets.packaged_modules import _PACKAGED_DATASETS_MODULES

        return self.path in _PACKAGED_DATASETS_MODULES or os.path.isdir(self.path)

    @property
    def built_in(self) -> bool:
        """One of the local tasks of streamback/eval/tasks/, whose items `streamback eval-tasks` writes."""
        return Path(self.yaml_path).resolve().is_relative_to(TASKS_DIR)

    def hint(self) -> str:
        if self.built_in:
            return "local tasks: run `streamback eval-tasks` (rule eval_tasks)"
        if not self.local and self.path.startswith((os.sep, ".", "~")):
            return (
                f"dataset_path {self.path} in {self.yaml_path} is not a directory (relative paths are read from "
                f"{Path.cwd()})"
            )
        if not self.local:
            import datasets

            if datasets.config.HF_HUB_OFFLINE:  # every job but fetch, where the config names a hub_cache
                cache = datasets.config.HF_DATASETS_CACHE
                return f"offline, a hub dataset is read from the datasets cache {cache}: {FETCH_HINT}"
            return "hub datasets need the Hugging Face Hub, or the hub_cache that `snakemake fetch` fills"
        return (
            f"see dataset_path and dataset_kwargs in {self.yaml_path}; relative paths are read from the working "
            f"directory, "
            f"{Path.cwd()}"
        )

    def builder(self, data_files=None):
        """datasets' builder of these data (files resolved, nothing read); `data_files` replaces the task's."""
        import datasets

        explicit = set(inspect.signature(datasets.load_dataset).parameters)
        accepted = set(inspect.signature(datasets.load_dataset_builder).parameters)
        kwargs = {k: v for k, v in self.kwargs.items() if k in accepted or k not in explicit}
        if data_files is not None:
            kwargs["data_files"] = data_files
        return datasets.load_dataset_builder(self.path, self.name, **kwargs)

    def files(self) -> dict[str, list[str]]:
        """{split: resolved data files}; StreambackError naming the task and split of a pattern that
        matches nothing, or of an empty file."""
        from datasets.data_files import sanitize_patterns

        try:
            builder = self.builder()
        except FileNotFoundError as err:
            patterns = sanitize_patterns(self.kwargs["data_files"]) if self.kwargs.get("data_files") else {}
            for split, listed in patterns.items():
                for pattern in listed:
                    try:
                        self.builder({split: pattern})
                    except FileNotFoundError:
                        raise StreambackError(
                            f"task {self.task}, split {split}: no data file matches {pattern} ({self.hint()})"
                        ) from None
            raise StreambackError(
                f"task {self.task}: the files of its {_data_description(self.cfg)} are not found: "
                f"{_one_line(err)} ({self.hint()})"
            ) from None
        except Exception as err:  # datasets raises ValueError and others for settings it refuses
            raise StreambackError(
                f"task {self.task}: datasets refuses its {_data_description(self.cfg)}: {_one_line(err)} "
                f"({self.hint()})"
            ) from None
        files = {split: [str(f) for f in listed] for split, listed in (builder.config.data_files or {}).items()}
        for split, listed in files.items():
            if not listed:  # datasets lets a glob match nothing
                patterns = sanitize_patterns(self.kwargs.get("data_files") or {}).get(
                    split, ["(datasets' default patterns)"]
                )
                raise StreambackError(
                    f"task {self.task}, split {split}: no data file matches {', '.join(patterns)} ({self.hint()})"
                )
            for path in listed:
                if os.path.isfile(path) and os.path.getsize(path) == 0:
                    raise StreambackError(f"task {self.task} has no items: {_shown(path)} (split {split}) is empty")
        return files

    def missing_split(self, err: BaseException, files: dict[str, list[str]]) -> str | None:
        """If lm-eval failed reading a split the data files do not give (a KeyError of its name), that, as a message."""
        split = err.args[0] if isinstance(err, KeyError) and err.args else None
        if not files or not isinstance(split, str) or split in files:
            return None
        keys = [
            k for k in ("test_split", "validation_split", "training_split", "fewshot_split") if self.cfg.get(k) == split
        ]
        return (
            f"task {self.task} reads split {split!r} ({' and '.join(keys) or 'a split'} in {self.yaml_path}), but its "
            f"data files give "
            f"only {', '.join(files)}"
        )

    def unreadable(self, files: dict[str, list[str]]) -> str | None:
        """The first data file datasets cannot load on its own, as a message; None if each loads."""
        import datasets

        builder = self.builder()
        for split, listed in files.items():
            for path in listed:
                try:
                    datasets.load_dataset(
                        builder.name,
                        data_files={split: [path]},
                        **{k: v for k, v in self.kwargs.items() if k not in ("data_files", "data_dir")},
                    )
                except Exception as err:  # pyarrow, json and csv readers raise many types
                    return (
                        f"task {self.task}, split {split}: {_shown(path)} cannot be read as {builder.name} data: "
                        f"{_one_line(err)}"
                    )
        return None


def _shown(path: str) -> str:
    """A path as a message shows it: relative to the working directory when inside it."""
    relative = os.path.relpath(path)
    return path if relative.startswith("..") else relative


def hub_tasks(manager, names: list[str]) -> list[str]:
    """The tasks of `names` whose data come from the Hub (neither a packaged builder's files nor a
    directory): those `snakemake fetch` loads, so that datasets' cache holds them."""
    tasks = []
    for name in names:
        entry = manager.task_index[name]
        if not _Data(name, entry.cfg or {}, entry.yaml_path).local:
            tasks.append(name)
    return tasks


def load_tasks(manager, names: list[str]) -> dict:
    """{name: lm-eval Task} with its data loaded; StreambackError naming the task (and for local
    data the split and file) if the data cannot be loaded or hold no items."""
    tasks = {}
    for name in names:
        entry = manager.task_index[name]
        data = _Data(name, entry.cfg or {}, entry.yaml_path)
        files = data.files() if data.local else {}
        try:
            task = manager.load([name])["tasks"][name]
        except Exception as err:  # datasets and lm-eval raise many types (ConnectionError offline)
            named = data.missing_split(err, files) or (data.unreadable(files) if files else None)
            if named:
                raise StreambackError(f"{named} ({data.hint()})") from None
            hint = (
                "its items do not fit its YAML: write them again (`streamback eval-tasks`)"
                if data.built_in
                else f"its data do not fit {data.yaml_path}"
                if data.local
                else data.hint()
            )
            raise StreambackError(
                f"task {name}: cannot load its {_data_description(data.cfg)}: {_one_line(err)} ({hint})"
            ) from None
        if len(task.eval_docs) == 0:
            raise StreambackError(f"task {name} has no items in its {_data_description(data.cfg)}")
        tasks[name] = task
    return tasks
