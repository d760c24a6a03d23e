"""Documents in: a hub dataset (FineWeb; from the Hub, or from the cache `snakemake fetch` filled)
or local parquet / jsonl / text files (the synthetic corpus is local parquet), all read with
`datasets.load_dataset(..., streaming=True)`.

A source yields documents in one fixed order as batches; a document's position in that order is
its stream index (resuming counts on it). Its split is a pure function of its id: validation if
the first 8 bytes of sha256(id) read as a fraction of 2**64 fall below `val_fraction`, so a
document can never be in both splits, whatever the order or the budget. Without an id column
the id is the text itself (duplicates then always land in the same split).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from streamback import layout
from streamback.data.hubcache import FETCH_HINT
from streamback.data.shards import file_sha256
from streamback.errors import StreambackError

FILE_FORMATS = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".txt": "text", ".md": "text"}


def is_validation(key: str, fraction: float) -> bool:
    """Whether the document with id (or, lacking one, text) `key` belongs to the validation split."""
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big") < fraction * 2.0**64


@dataclass
class Batch:
    """Consecutive documents: `texts[i]` has stream index `start + i`; `ids[i]` may be None."""

    start: int
    texts: list[str]
    ids: list[str | None]


def _columns(batch, text_column: str, id_column: str | None, where: str) -> tuple[list[str], list[str | None]]:
    """Texts (None as "") and ids (None where missing) of a batch: a pyarrow Table or a dict of lists."""
    names = batch.column_names if hasattr(batch, "column_names") else list(batch)
    if text_column not in names:
        raise StreambackError(
            f"{where} has no column {text_column!r} (columns: {', '.join(names) or 'none'}); set data.text_column"
        )
    if hasattr(batch, "column_names"):
        texts = batch.column(text_column).to_pylist()
        ids = batch.column(id_column).to_pylist() if id_column in names else None
    else:
        texts, ids = batch[text_column], batch.get(id_column) if id_column else None
    bad = next((t for t in texts if not isinstance(t, str) and t is not None), None)
    if bad is not None:
        raise StreambackError(f"{where}: column {text_column!r} holds {type(bad).__name__} values, not text")
    texts = [t or "" for t in texts]
    return texts, [str(i) if i is not None else None for i in ids] if ids is not None else [None] * len(texts)


def _iter_dataset(
    dataset, text_column: str, id_column: str | None, batch_size: int, where: str, start: int
) -> Iterator[Batch]:
    """Batches of a streaming dataset; errors name `where`."""
    try:
        for raw in dataset.iter(batch_size=batch_size):
            texts, ids = _columns(raw, text_column, id_column, where)
            yield Batch(start, texts, ids)
            start += len(texts)
    except UnicodeDecodeError as err:
        raise StreambackError(
            f"{where} is not valid UTF-8 text ({err.reason}: byte {err.object[err.start : err.start + 1]!r} at offset "
            f"{err.start} of a block)"
        ) from None
    except StreambackError:
        raise
    except Exception as err:  # datasets/pyarrow raise many types for unreadable data
        raise StreambackError(f"{where} cannot be read: {type(err).__name__}: {err}") from None


class FileSource:
    """Local files read one after another (so an error names its file), each through
    `datasets.load_dataset(<parquet|json|text>, data_files=[file], streaming=True)`."""

    def __init__(self, data: dict, files: list[Path], kind: str):
        self.text_column, self.id_column = data["text_column"], data["id_column"]
        self.text_unit = data["local"]["text_unit"]
        fmt = data["local"]["format"] if kind == "local" else "parquet"
        if not files:
            what = "data.local.files matched no files" if kind == "local" else "the synthetic corpus has no files"
            raise StreambackError(f"empty corpus: {what}")
        self.files: list[tuple[Path, str]] = []
        for path in files:
            if not path.is_file():
                hint = " (run `streamback corpus` or the rule corpus first)" if kind == "synthetic" else ""
                raise StreambackError(f"corpus file {path} does not exist{hint}")
            file_format = fmt if fmt != "auto" else FILE_FORMATS.get(path.suffix.lower())
            if file_format is None:
                raise StreambackError(
                    f"corpus file {path}: unknown format {path.suffix!r}; "
                    f"name it {', '.join(FILE_FORMATS)} or set data.local.format"
                )
            self.files.append((path, file_format))
        self.rows = {path: self._preflight(path, f) for path, f in self.files}
        if all(rows == 0 for rows in self.rows.values()):
            raise StreambackError(f"empty corpus: {', '.join(str(p) for p, _ in self.files)} hold no documents")
        self.description = {
            "kind": kind,
            "format": fmt,
            "files": [{"path": str(p), "bytes": p.stat().st_size, "sha256": file_sha256(p)} for p, _ in self.files],
        }
        if kind == "synthetic":
            self.description["generator"] = dict(data["synthetic"])

    def _preflight(self, path: Path, file_format: str) -> int | None:
        """Rows in the file if its format tells cheaply (parquet; 0 for an empty file), else None;
        a parquet file without the text column fails here, before any work."""
        if path.stat().st_size == 0:
            return 0
        if file_format != "parquet":
            return None
        import pyarrow.parquet as pq

        try:
            meta = pq.read_metadata(path)
        except Exception as err:
            raise StreambackError(f"corpus file {path} is not a readable parquet file: {err}") from None
        names = meta.schema.to_arrow_schema().names
        if self.text_column not in names:
            raise StreambackError(
                f"corpus file {path} has no column {self.text_column!r} (columns: {', '.join(names)}); "
                "set data.text_column"
            )
        return meta.num_rows

    def batches(self, batch_size: int) -> Iterator[Batch]:
        start = 0
        for path, file_format in self.files:
            if self.rows[path] == 0:
                continue
            for batch in read_file(
                path, file_format, self.text_column, self.id_column, self.text_unit, batch_size, start
            ):
                start += len(batch.texts)
                yield batch


def read_file(
    path, file_format: str, text_column: str, id_column: str | None, text_unit: str, batch_size: int, start: int = 0
) -> Iterator[Batch]:
    """The documents of one file (a path, or a URL `datasets` reads such as hf://...) as batches,
    the first with stream index `start`: `datasets.load_dataset(file_format, data_files=[path],
    streaming=True)`; errors name the file."""
    import datasets

    datasets.disable_progress_bars()
    extra = {"sample_by": text_unit} if file_format == "text" else {}
    where = f"corpus file {path}"
    try:
        dataset = datasets.load_dataset(file_format, data_files=[str(path)], split="train", streaming=True, **extra)
    except Exception as err:
        raise StreambackError(f"{where} cannot be opened as {file_format}: {err}") from None
    if file_format == "text":
        text_column, id_column = "text", None
    yield from _iter_dataset(dataset, text_column, id_column, batch_size, where, start)


def card_patterns(card: Path, dataset: str, name: str | None, split: str) -> list[str]:
    """The file patterns of `split` of config `name` in a dataset card (README.md), as datasets
    reads its `configs`; every file of the repository (`["*"]`) when the card names no configs."""
    from datasets.data_files import sanitize_patterns
    from datasets.utils.metadata import MetadataConfigs
    from huggingface_hub import DatasetCard

    try:
        configs = MetadataConfigs.from_dataset_card_data(DatasetCard.load(card).data)
    except Exception as err:  # yaml and datasets' checks raise several types
        raise StreambackError(f"hub dataset {dataset}: its card {card} cannot be read: {err}") from None
    if not configs:
        return ["*"]
    chosen = name if name is not None else "default"
    if chosen not in configs:
        raise StreambackError(
            f"hub dataset {dataset} has no config {chosen!r} (data.hub.name); its card names {', '.join(configs)}"
        )
    patterns = sanitize_patterns(configs[chosen].get("data_files") or {}).get(split)
    if not patterns:
        raise StreambackError(
            f"hub dataset {dataset}, config {chosen}: its card gives no files for split {split!r} (data.hub.split)"
        )
    return [p if not configs[chosen].get("data_dir") else f"{configs[chosen]['data_dir']}/{p}" for p in patterns]


def cached_snapshot(dataset: str, name: str | None, split: str, revision: str) -> tuple[Path, list[str]]:
    """(the fetched repository's snapshot folder, the patterns of the files read) from the Hub cache
    alone (huggingface_hub's, which the process's hubcache.HubAccess names); a StreambackError
    naming what is missing, and `snakemake fetch`, when the cache lacks the card or a file."""
    from huggingface_hub import constants, hf_hub_download, snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    where = f"hub dataset {dataset} (revision {revision})"
    try:
        card = Path(
            hf_hub_download(dataset, "README.md", repo_type="dataset", revision=revision, local_files_only=True)
        )
    except LocalEntryNotFoundError:
        raise StreambackError(
            f"{where}: its README.md is not in the Hub cache {constants.HF_HUB_CACHE}; {FETCH_HINT}"
        ) from None
    patterns = card_patterns(card, dataset, name, split)
    try:
        folder = snapshot_download(
            dataset, repo_type="dataset", revision=revision, allow_patterns=patterns, local_files_only=True
        )
    except LocalEntryNotFoundError as err:  # the tree listing fetch cached names the missing files
        raise StreambackError(
            f"{where}: the files of {name} ({', '.join(patterns)}) are not all in the Hub cache "
            f"{constants.HF_HUB_CACHE} ({' '.join(str(err).split())[:300]}); {FETCH_HINT}"
        ) from None
    return Path(folder), patterns


class HubSource:
    """A dataset on the Hugging Face hub (or a local copy of its repository), streamed.

    The manifest records the commit the revision resolved to; a gated or private dataset needs
    HF_TOKEN in the environment. Where the process's Hub access is offline (every job of a config
    whose data `snakemake fetch` put in its `hub_cache`: streamback.data.hubcache), the files are
    read from the fetched snapshot of that commit with the same loading code, so the source's
    description, and with it the shards' fingerprint, is the one the Hub route gives."""

    def __init__(self, data: dict):
        hub = data["hub"]
        self.text_column, self.id_column = data["text_column"], data["id_column"]
        self.dataset, self.name, self.split, self.revision = hub["dataset"], hub["name"], hub["split"], hub["revision"]
        self.description = {
            "kind": "hub",
            "dataset": self.dataset,
            "name": self.name,
            "split": self.split,
            "revision": self.revision,
        }
        self.snapshot: Path | None = None  # the fetched copy read offline
        local = Path(self.dataset)
        if local.is_dir():  # a mirror of the repository: record its files instead of a commit
            self.description["local_copy"] = [
                {"path": str(p.relative_to(local)), "bytes": p.stat().st_size}
                for p in sorted(local.rglob("*"))
                if p.is_file() and not p.name.startswith(".")
            ]
        elif _offline():
            self.snapshot, patterns = cached_snapshot(self.dataset, self.name, self.split, self.revision)
            # the cache keeps a commit's files under snapshots/<commit>/
            self.description["commit"] = self.snapshot.name
            matching = _matching(self.snapshot, patterns)
            where = f"hub dataset {self.dataset} ({self.name}, split {self.split})"
            if not matching:
                raise StreambackError(
                    f"{where}: no file of the fetched copy {self.snapshot} matches {', '.join(patterns)}; {FETCH_HINT}"
                )
            # (path, format) in the order datasets reads them, as a FileSource's: tokenize reads them by file
            self.files = [(path, _builder(matching, where)) for path in matching]
        else:
            self.description["commit"] = self._resolve()

    def _resolve(self) -> str:
        from huggingface_hub import HfApi

        try:
            return HfApi().dataset_info(self.dataset, revision=self.revision).sha
        except Exception as err:
            raise StreambackError(
                f"cannot reach hub dataset {self.dataset} (revision {self.revision}): {err}. "
                "A gated or private dataset needs HF_TOKEN; offline, fetch it first (`snakemake fetch`, "
                "with hub_cache on shared disk) or use data.source: local"
            ) from None

    def batches(self, batch_size: int) -> Iterator[Batch]:
        import datasets

        datasets.disable_progress_bars()
        where = f"hub dataset {self.dataset} ({self.name}, split {self.split})"
        revision = self.description.get("commit", self.revision)
        try:
            if self.snapshot is not None:  # the fetched files of the split, in the order datasets resolves them
                dataset = datasets.load_dataset(
                    self.files[0][1],
                    data_files={self.split: [str(f) for f, _ in self.files]},
                    split=self.split,
                    streaming=True,
                )
            else:
                dataset = datasets.load_dataset(
                    self.dataset, name=self.name, split=self.split, streaming=True, revision=revision
                )
            dataset = dataset.with_format("arrow")
        except Exception as err:
            raise StreambackError(f"{where} cannot be opened: {err}") from None
        yield from _iter_dataset(dataset, self.text_column, self.id_column, batch_size, where, 0)


def _offline() -> bool:
    """Whether this process's Hub access is offline (huggingface_hub's setting, which
    streamback.data.hubcache.applied sets for the stage from its decided access)."""
    from huggingface_hub import constants

    return constants.is_offline_mode()


def _builder(files: list[Path], where: str) -> str:
    """datasets' packaged builder for the files' format (parquet for FineWeb), by extension as
    datasets infers it. A local folder is not read as a repository (`load_dataset(folder, name)`):
    datasets infers the format from the default config's files, which a fetch of one sample lacks."""
    from datasets.packaged_modules import _EXTENSION_TO_MODULE

    suffixes = {f.suffix.lower() for f in files}
    builders = {_EXTENSION_TO_MODULE.get(s, (None, None))[0] for s in suffixes}
    if len(builders) != 1 or None in builders:
        raise StreambackError(f"{where}: cannot read files with extensions {', '.join(sorted(suffixes))} as one format")
    return builders.pop()


def _matching(folder: Path, patterns: list[str]) -> list[Path]:
    """The files under `folder` that `patterns` (the card's, relative to it) match, sorted by path."""
    from fnmatch import fnmatch

    return sorted(
        p
        for p in folder.rglob("*")
        if p.is_file() and any(fnmatch(p.relative_to(folder).as_posix(), pattern) for pattern in patterns)
    )


def open_source(data: dict, inputs: list[Path] | None = None) -> FileSource | HubSource:
    """The configured source; `inputs` overrides the files of a local or synthetic source."""
    if data["source"] == "hub":
        return HubSource(data)
    files = [Path(p) for p in inputs] if inputs else layout.input_files(data)
    return FileSource(data, files, data["source"])
