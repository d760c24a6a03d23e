"""`streamback fetch` (rules fetch_data and fetch_tasks, local: the login node's jobs): download
everything the config's later jobs read from the Hugging Face Hub into its `hub_cache`, so that
they run offline.

- the hub dataset (data.source hub): its card (README.md), then the files of its config and split
  as the card's `configs` name them (`snapshot_download(..., allow_patterns=...)`), at the commit
  data.hub.revision resolves to now;
- the hub tokenizer (data.tokenizer.kind hub): its tokenizer.json;
- every task of eval.tasks whose data are on the Hub, loaded as lm-eval loads it, so that
  datasets' cache holds it prepared.

Everything goes through the libraries' own download code into `<hub_cache>/hub` and
`<hub_cache>/datasets` (streamback.data.hubcache); a rerun downloads only what is missing. The
records (results/fetch/data.json, tasks.json: rules fetch_data and fetch_tasks, which `snakemake
fetch` asks for) name each thing and its commit; the tokenize manifest names the commit it read,
from the cache.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from streamback import layout
from streamback.config import DEFAULT_CONFIG, read_config_file, section_from_json, validate_config
from streamback.data import hubcache
from streamback.data.sources import card_patterns
from streamback.errors import StreambackError
from streamback.io import write_json

HELP = (
    "download the config's hub dataset, hub tokenizer and hub task datasets into its hub_cache (the login node's job)"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config", type=Path, default=None, help="config file (default: the default config, which fetches nothing)"
    )
    parser.add_argument("--data", default=None, metavar="JSON", help="the 'data' section as JSON (rule fetch_data)")
    parser.add_argument("--eval", default=None, metavar="JSON", help="the 'eval' section as JSON (rule fetch_tasks)")
    parser.add_argument("--cache", type=Path, default=None, help="the cache to fill (default: the config's hub_cache)")
    parser.add_argument(
        "--parts",
        nargs="+",
        choices=layout.FETCH_PARTS,
        default=list(layout.FETCH_PARTS),
        help="what to fetch: data (the hub dataset and tokenizer; rule fetch_data), tasks (eval.tasks' hub datasets; "
        "rule fetch_tasks)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=layout.FETCH_DIR,
        help="directory of the records, <part>.json each: what was fetched, at which commits",
    )


def _config(args: argparse.Namespace) -> dict:
    """The config: its file (`--config`), or the sections the rules pass (`--data`, `--eval`; the
    other one's defaults)."""
    if args.data is None and args.eval is None:
        return validate_config(read_config_file(args.config or DEFAULT_CONFIG))
    if args.config is not None:
        raise StreambackError("--config or the sections (--data, --eval), not both")
    return validate_config(
        {
            "data": section_from_json(args.data or "{}", "data", "--data"),
            "eval": section_from_json(args.eval or "{}", "eval", "--eval"),
        }
    )


def _say(message: str) -> None:
    print(f"fetch: {message}", file=sys.stderr, flush=True)


def _hub_error(what: str, err: BaseException) -> StreambackError:
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    text = " ".join(str(err).split())[:300]
    if isinstance(err, GatedRepoError):
        return StreambackError(f"{what} is gated: accept its license on the Hub and export HF_TOKEN=<a read token>")
    if isinstance(err, RevisionNotFoundError):
        return StreambackError(f"{what}: the Hub has no such revision ({text})")
    if isinstance(err, RepositoryNotFoundError):
        return StreambackError(f"{what} is not on the Hub (or private: export HF_TOKEN)")
    return StreambackError(f"cannot fetch {what}: {type(err).__name__}: {text}")


def fetch_dataset(hub: dict) -> dict:
    """The hub dataset's card and the files of its config and split, into huggingface_hub's cache."""
    from huggingface_hub import hf_hub_download, snapshot_download

    repo, revision = hub["dataset"], hub["revision"]
    what = f"hub dataset {repo} (revision {revision})"
    try:
        card = Path(hf_hub_download(repo, "README.md", repo_type="dataset", revision=revision))
    except Exception as err:  # huggingface_hub raises its HTTP errors and httpx's
        raise _hub_error(what, err) from None
    patterns = card_patterns(card, repo, hub["name"], hub["split"])
    _say(f"{what}: {hub['name']} split {hub['split']} ({', '.join(patterns)})")
    try:
        folder = Path(
            snapshot_download(repo, repo_type="dataset", revision=revision, allow_patterns=["README.md", *patterns])
        )
    except Exception as err:
        raise _hub_error(what, err) from None
    files = [p for p in sorted(folder.rglob("*")) if p.is_file() and p.name != "README.md"]
    if not files:
        raise StreambackError(f"{what}: no file of the repository matches {', '.join(patterns)} (its card's files)")
    return {
        "dataset": repo,
        "name": hub["name"],
        "split": hub["split"],
        "revision": revision,
        "commit": folder.name,  # the cache keeps a commit's files under snapshots/<commit>/
        "files": [{"path": str(p.relative_to(folder)), "bytes": p.stat().st_size} for p in files],
    }


def fetch_tokenizer(spec: dict) -> dict:
    """The hub tokenizer's tokenizer.json, into huggingface_hub's cache."""
    from huggingface_hub import hf_hub_download

    what = f"tokenizer repository {spec['name']} (revision {spec['revision']})"
    try:
        path = Path(hf_hub_download(spec["name"], "tokenizer.json", revision=spec["revision"]))
    except Exception as err:
        raise _hub_error(what, err) from None
    return {"repository": spec["name"], "revision": spec["revision"], "commit": path.parent.name}


def fetch_tasks(eval_cfg: dict) -> list[dict]:
    """Every task of eval.tasks whose data are on the Hub, loaded as lm-eval loads it (its data then
    sit in datasets' cache); the local tasks' files are written by rule eval_tasks instead."""
    from streamback.eval import taskload

    manager = taskload.task_manager(eval_cfg["tasks"], eval_cfg["include_path"])
    names = taskload.hub_tasks(manager, eval_cfg["tasks"])
    tasks = taskload.load_tasks(manager, names) if names else {}
    fetched = []
    for name, task in tasks.items():
        cfg = manager.task_index[name].cfg or {}
        fetched.append(
            {
                "task": name,
                "dataset_path": cfg.get("dataset_path"),
                "dataset_name": cfg.get("dataset_name"),
                "items": len(task.eval_docs),
            }
        )
        _say(f"task {name}: {cfg.get('dataset_path')} ({len(task.eval_docs)} items)")
    return fetched


def fetch(config: dict, cache: Path, part: str) -> dict:
    """Fill `cache` with what `config`'s jobs read from the Hub, of `part` (data: the hub dataset and
    tokenizer; tasks: the task datasets); returns its record."""
    data = config["data"]
    record: dict = {"cache": str(cache)}
    with hubcache.applied(hubcache.HubAccess(cache, offline=False)):
        if part == "data":
            record["dataset"] = None
            record["tokenizer"] = None
            if data["source"] == "hub" and not Path(data["hub"]["dataset"]).is_dir():
                record["dataset"] = fetch_dataset(data["hub"])
            if data["tokenizer"]["kind"] == "hub":
                record["tokenizer"] = fetch_tokenizer(data["tokenizer"])
        else:
            record["tasks"] = fetch_tasks(config["eval"])
    return record


def run(args: argparse.Namespace) -> int:
    config = _config(args)
    cache = args.cache or (Path(config["hub_cache"]) if config.get("hub_cache") else None)
    if cache is None:
        raise StreambackError("hub_cache is not set: name the cache to fill (hub_cache in the config, or --cache)")
    cache = cache.resolve()
    fetched = []
    for part in dict.fromkeys(args.parts):
        record = fetch(config, cache, part)
        write_json(args.out / f"{part}.json", record)
        fetched += [
            *(["the dataset"] if record.get("dataset") else []),
            *(["the tokenizer"] if record.get("tokenizer") else []),
            *([f"{len(record['tasks'])} task datasets"] if record.get("tasks") else []),
        ]
    _say(f"{', '.join(fetched) or 'nothing (the data and tasks are local)'} in {cache}; records in {args.out}")
    return 0
