"""A Hugging Face Hub on 127.0.0.1 for the fetch tests: the HTTP API routes that the installed
huggingface_hub (snapshot_download, hf_hub_download, HfApi.repo_info / dataset_info /
list_repo_tree, HfFileSystem) and datasets (load_dataset of a hub dataset) call, for the
repositories it holds, reached through HF_ENDPOINT. Nothing is mocked in the libraries: they run
their own download code against these answers.

The routes, as huggingface_hub 2.5's hf_api.py and file_download.py build them:
- GET  /api/{models|datasets}/{repo}[/revision/{revision}]: the repository's info (`sha`,
  `siblings`), as repo_info reads it;
- GET  /api/{models|datasets}/{repo}/tree/{revision}[/{path}][?recursive=true]: the tree listing
  (`type`, `path`, `size`, `oid`) that snapshot_download and HfFileSystem read;
- POST /api/{models|datasets}/{repo}/paths-info/{revision}: the entries of the paths asked for;
- HEAD/GET /[datasets/]{repo}/resolve/{revision}/{path}: a file, with the headers
  get_hf_file_metadata reads (X-Repo-Commit, ETag, Content-Length) and Range requests.
An unknown repository, revision or file is a 404 with the X-Error-Code the libraries map to
RepositoryNotFoundError, RevisionNotFoundError and EntryNotFoundError.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

MAIN = "main"


@dataclass
class Repo:
    """A repository the server holds: `kind` model or dataset, its files (path -> bytes), one commit."""

    repo_id: str
    kind: str
    files: dict[str, bytes]
    commit: str = field(init=False)

    def __post_init__(self):
        digest = hashlib.sha1()
        for path in sorted(self.files):
            digest.update(path.encode() + b"\0" + self.files[path] + b"\0")
        self.commit = digest.hexdigest()

    def oid(self, path: str) -> str:
        return hashlib.sha1(self.files[path]).hexdigest()

    def directories(self) -> set[str]:
        return {"/".join(p.split("/")[:k]) for p in self.files for k in range(1, p.count("/") + 1)}

    def entry(self, path: str) -> dict | None:
        if path in self.files:
            return {"type": "file", "path": path, "size": len(self.files[path]), "oid": self.oid(path)}
        if path in self.directories():
            return {"type": "directory", "path": path, "size": 0, "oid": hashlib.sha1(path.encode()).hexdigest()}
        return None

    def tree(self, path: str, recursive: bool) -> list[dict] | None:
        prefix = f"{path}/" if path else ""
        if path and path not in self.directories():
            return None
        names = sorted({*self.files, *self.directories()})
        inside = [n for n in names if n.startswith(prefix) and n != path]
        if not recursive:
            inside = [n for n in inside if "/" not in n[len(prefix) :]]
        return [self.entry(n) for n in inside]


class Hub:
    """The server: `url` for HF_ENDPOINT, `requests` every (method, path) it answered, `stop()`."""

    def __init__(self, repos: list[Repo]):
        self.repos = {(r.kind, r.repo_id): r for r in repos}
        self.requests: list[tuple[str, str]] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def do_GET(self):
                hub._answer(self, body=True)

            def do_HEAD(self):
                hub._answer(self, body=False)

            def do_POST(self):
                hub._answer(self, body=True)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()

    # -- routing

    def _find(self, kind: str, parts: list[str]) -> tuple[Repo | None, list[str]]:
        """The repository named by the first parts (namespace/name, or name), and the rest."""
        for size in (2, 1):
            repo = self.repos.get((kind, "/".join(parts[:size])))
            if repo is not None:
                return repo, parts[size:]
        return None, parts

    def _answer(self, handler: BaseHTTPRequestHandler, body: bool) -> None:
        url = urlsplit(handler.path)
        self.requests.append((handler.command, url.path))
        length = int(handler.headers.get("Content-Length") or 0)
        payload = handler.rfile.read(length) if length else b""
        parts = [unquote(p) for p in url.path.strip("/").split("/")]
        query = parse_qs(url.query)
        if parts[:1] == ["api"] and len(parts) > 2 and parts[1] in ("models", "datasets"):
            return self._api(handler, parts[1][:-1], parts[2:], query, payload, body)
        kind = "model"
        if parts[:1] == ["datasets"]:
            kind, parts = "dataset", parts[1:]
        repo, rest = self._find(kind, parts)
        if repo is None or rest[:1] != ["resolve"] or len(rest) < 3:
            return self._error(handler, 404, "RepoNotFound", f"no repository {'/'.join(parts)}", body)
        if not self._revision_ok(repo, rest[1]):
            return self._error(handler, 404, "RevisionNotFound", f"no revision {rest[1]}", body)
        return self._file(handler, repo, "/".join(rest[2:]), body)

    def _revision_ok(self, repo: Repo, revision: str) -> bool:
        return revision in (MAIN, repo.commit)

    def _api(self, handler, kind: str, parts: list[str], query: dict, payload: bytes, body: bool) -> None:
        repo, rest = self._find(kind, parts)
        if repo is None:
            return self._error(handler, 404, "RepoNotFound", f"no repository {'/'.join(parts)}", body)
        if not rest or rest[0] == "revision":
            if rest and not self._revision_ok(repo, rest[1]):
                return self._error(handler, 404, "RevisionNotFound", f"no revision {rest[1]}", body)
            info = {
                "id": repo.repo_id,
                "_id": repo.commit[:24],
                "author": repo.repo_id.split("/")[0],
                "sha": repo.commit,
                "private": False,
                "gated": False,
                "disabled": False,
                "downloads": 0,
                "likes": 0,
                "tags": [],
                "lastModified": "2026-12-01T00:00:00.000Z",
                "createdAt": "2026-12-01T00:00:00.000Z",
                "siblings": [{"rfilename": p, "size": len(b)} for p, b in sorted(repo.files.items())],
            }
            return self._json(handler, info, body)
        if rest[0] == "tree" and len(rest) >= 2:
            if not self._revision_ok(repo, rest[1]):
                return self._error(handler, 404, "RevisionNotFound", f"no revision {rest[1]}", body)
            recursive = query.get("recursive", ["false"])[0].lower() in ("1", "true")
            listing = repo.tree("/".join(rest[2:]), recursive)
            if listing is None:
                return self._error(handler, 404, "EntryNotFound", f"no folder {'/'.join(rest[2:])}", body)
            return self._json(handler, listing, body)
        if rest[0] == "paths-info" and len(rest) >= 2:
            if not self._revision_ok(repo, rest[1]):
                return self._error(handler, 404, "RevisionNotFound", f"no revision {rest[1]}", body)
            content_type = handler.headers.get("Content-Type", "")
            if "json" in content_type:
                paths = json.loads(payload or b"{}").get("paths", [])
            else:
                paths = parse_qs(payload.decode()).get("paths", [])
            entries = [e for e in (repo.entry(p.strip("/")) for p in paths) if e is not None]
            return self._json(handler, entries, body)
        return self._error(handler, 404, "EntryNotFound", f"no route {'/'.join(rest)}", body)

    # -- answers

    def _file(self, handler, repo: Repo, path: str, body: bool) -> None:
        if path not in repo.files:
            return self._error(handler, 404, "EntryNotFound", f"no file {path}", body, commit=repo.commit)
        data = repo.files[path]
        status, start, end = 200, 0, len(data)
        ranged = handler.headers.get("Range")
        if ranged and ranged.startswith("bytes="):
            first, _, last = ranged[len("bytes=") :].partition("-")
            start = int(first) if first else max(0, len(data) - int(last))
            end = min(len(data), int(last) + 1) if first and last else len(data)
            status = 206
        handler.send_response(status)
        handler.send_header("Content-Type", "application/octet-stream")
        handler.send_header("Content-Length", str(end - start))
        handler.send_header("Accept-Ranges", "bytes")
        handler.send_header("ETag", f'"{repo.oid(path)}"')
        handler.send_header("X-Repo-Commit", repo.commit)
        if status == 206:
            handler.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
        handler.end_headers()
        if body:
            handler.wfile.write(data[start:end])

    def _json(self, handler, value, body: bool) -> None:
        data = json.dumps(value).encode()
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        if body:
            handler.wfile.write(data)

    def _error(self, handler, status: int, code: str, message: str, body: bool, commit: str | None = None) -> None:
        data = json.dumps({"error": message}).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.send_header("X-Error-Code", code)
        handler.send_header("X-Error-Message", message)
        if commit:
            handler.send_header("X-Repo-Commit", commit)
        handler.end_headers()
        if body:
            handler.wfile.write(data)


# -- the repositories the tests serve ------------------------------------------------------------


def parquet_bytes(rows: list[dict], schema: pa.Schema | None = None) -> bytes:
    buffer = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), buffer)
    return buffer.getvalue()


def card(configs: list[dict]) -> bytes:
    """A dataset card (README.md) whose YAML header lists `configs` as the Hub's cards do."""
    lines = ["---", "configs:"]
    for config in configs:
        lines.append(f"- config_name: {config['config_name']}")
        lines.append("  data_files:")
        for split, path in config["data_files"].items():
            lines += [f"  - split: {split}", f"    path: {path}"]
    return ("\n".join([*lines, "---", "", "A dataset served by the fetch tests' local Hub.", ""])).encode()


def table_bytes(table: pa.Table) -> bytes:
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    return buffer.getvalue()


def fineweb_repo(repo_id: str, sample: str, tables: list[pa.Table]) -> Repo:
    """A dataset laid out as FineWeb's repository: each sample's parquet files under
    sample/<size>/ (FineWeb's sample-10BT is sample/10BT/*), its crawls under data/<crawl>/, and
    a card whose configs name them."""
    size = sample.removeprefix("sample-")
    content = {f"sample/{size}/{k:03d}_00000.parquet": table_bytes(t) for k, t in enumerate(tables)}
    content["data/CC-MAIN-2026-01/000_00000.parquet"] = table_bytes(tables[0].slice(0, 1))  # never fetched
    content["README.md"] = card(
        [
            {"config_name": "default", "data_files": {"train": "data/*/*"}},
            {"config_name": sample, "data_files": {"train": f"sample/{size}/*"}},
        ]
    )
    return Repo(repo_id, "dataset", content)


def tokenizer_repo(repo_id: str, tokenizer_json: str) -> Repo:
    """A model repository holding a tokenizer.json (and a config.json, never fetched)."""
    return Repo(repo_id, "model", {"tokenizer.json": tokenizer_json.encode(), "config.json": b"{}"})


def task_repo(repo_id: str, splits: dict[str, list[dict]], schema: pa.Schema | None = None) -> Repo:
    """A task dataset in the Hub's parquet layout: data/<split>-00000-of-00001.parquet and a card."""
    content = {f"data/{split}-00000-of-00001.parquet": parquet_bytes(rows, schema) for split, rows in splits.items()}
    content["README.md"] = card([{"config_name": "default", "data_files": {s: f"data/{s}-*" for s in splits}}])
    return Repo(repo_id, "dataset", content)


# -- the Hub of the fetch tests: a GPU tier's repositories, small -------------------------------

DATASET, SAMPLE = "HuggingFaceFW/fineweb", "sample-10BT"  # config/one-gpu.yaml's
TOKENIZER, EOS = "meta-llama/Meta-Llama-3-8B", "<|end_of_text|>"
TASK, TASK_DATASET = "hellaswag", "Rowan/hellaswag"  # lm-eval's hellaswag.yaml reads Rowan/hellaswag
DOCUMENTS, FILES = 1200, 3  # synthetic documents in FineWeb's columns, over the sample's files


@dataclass
class LocalHub:
    hub: Hub
    dataset: Repo
    tokenizer: Repo
    task: Repo


def hub_repos() -> tuple[Repo, Repo, Repo]:
    """The dataset (the synthetic corpus in FineWeb's layout and columns), the tokenizer (a BPE
    trained on it by `tokenizers`, with Llama 3's end-of-text token) and hellaswag's task data."""
    from streamback.data.corpus import corpus_table, part_ranges
    from streamback.data.tokenizer import train_bpe

    from helpers.eval_tasks import HELLASWAG, HELLASWAG_SCHEMA

    tables = [corpus_table(7, a, b, f"{k:03d}_00000.parquet") for k, (a, b) in enumerate(part_ranges(DOCUMENTS, FILES))]
    texts = (text for table in tables for text in table.column("text").to_pylist())
    tokenizer = train_bpe(texts, 300, EOS)
    return (
        fineweb_repo(DATASET, SAMPLE, tables),
        tokenizer_repo(TOKENIZER, tokenizer.to_str()),
        task_repo(TASK_DATASET, {"train": HELLASWAG[:2], "validation": HELLASWAG}, HELLASWAG_SCHEMA),
    )


@pytest.fixture(scope="module")
def local_hub():
    """The Hub on 127.0.0.1 holding `hub_repos()`, for the module; stopped after it."""
    dataset, tokenizer, task = hub_repos()
    hub = Hub([dataset, tokenizer, task])
    yield LocalHub(hub, dataset, tokenizer, task)
    hub.stop()


def tier_config(root: Path) -> dict:
    """A GPU tier's data and tasks, small: FineWeb's sample from the Hub with the hub tokenizer,
    lm-eval's own hellaswag (its YAML copied under root/tasks, reading Rowan/hellaswag from the
    Hub), the cache in root/hf-cache."""
    from helpers.eval_tasks import local_copy

    local_copy("hellaswag/hellaswag.yaml", root / "tasks" / "hellaswag", TASK_DATASET)
    return {
        "data": {
            "corpus": "fineweb-small",
            "source": "hub",
            "hub": {"dataset": DATASET, "name": SAMPLE},
            "tokenizer": {"kind": "hub", "name": TOKENIZER, "eos_token": EOS},
            "val_fraction": 0.1,
            "shard_tokens": 4096,
            "processes": 1,
        },
        "eval": {"tasks": [TASK], "include_path": [str(root / "tasks")]},
        "hub_cache": str(root / "hf-cache"),
    }


def hub_environment(hub: Hub, root: Path) -> dict[str, str]:
    """This process's environment with the Hub at `hub` (HF_ENDPOINT), the Hugging Face libraries'
    own files (HF_HOME, XDG_CACHE_HOME) under root, and the worktree's streamback importable."""
    repo = Path(__file__).resolve().parents[2]
    return {
        **os.environ,
        "HF_ENDPOINT": hub.url,
        "HF_HOME": str(root / "hf-home"),
        "XDG_CACHE_HOME": str(root / "xdg-cache"),
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "PYTHONPATH": os.pathsep.join([str(repo), *filter(None, [os.environ.get("PYTHONPATH")])]),
    }


def no_network(command: list[str]) -> list[str]:
    """`command` in a network namespace of its own (`unshare -n`): no interface but a loopback that
    is down, so that nothing it runs reaches any host, the local Hub included."""
    return ["unshare", "-n", *command]


def unshare_works() -> bool:
    import subprocess

    try:
        return subprocess.run(["unshare", "-n", "true"], capture_output=True, check=False).returncode == 0
    except OSError:
        return False


needs_unshare = pytest.mark.skipif(
    not unshare_works(), reason="`unshare -n` (a network namespace: root) is not available"
)
