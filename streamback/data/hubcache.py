"""Where a process's Hugging Face libraries (huggingface_hub, datasets, and lm-eval through them)
keep their files, and whether they may reach the Hub: decided once per process, applied around
the stage, given back after it.

A config that reads anything from the Hub (a hub dataset, a hub tokenizer, a task dataset that is
not local) names one cache, `hub_cache` (on disk that every node shares). Its jobs get it as
STREAMBACK_HUB_CACHE (`jobs.execution_environment`, exported by workflow/rules/common.smk), and
`cli.main` decides from it and the command (`for_command`): `streamback fetch`, the login node's
job, fills the cache from the Hub; every other stage reads the cache alone, with the Hub offline
(HF_HUB_OFFLINE=1, HF_DATASETS_OFFLINE=1), so that nothing a compute node runs touches the
network. Without STREAMBACK_HUB_CACHE a process runs as the libraries' own defaults say.

The cache holds `hub/` (huggingface_hub's cache: the dataset's and the tokenizer's repositories)
and `datasets/` (datasets' prepared task datasets). The libraries read their settings from the
environment once, when first imported, so `applied` has those already imported read it again
(their own code, `importlib.reload`), and after the block every one imported by then. Standard
library only: `jobs.py`, which the rule files import, names the variable and asks `hub_reads`.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path

ENV = "STREAMBACK_HUB_CACHE"
FETCH_COMMAND = "fetch"
# the hint of every error about something the cache lacks
FETCH_HINT = "run `snakemake fetch` (or `streamback fetch`) on a machine with internet, such as the login node"


@dataclass(frozen=True)
class HubAccess:
    """A process's Hub access: the cache it reads (None: the libraries' defaults) and whether it
    may reach the Hub (`offline`: the cache alone)."""

    cache: Path | None
    offline: bool

    @property
    def hub(self) -> Path | None:
        """huggingface_hub's cache directory (HF_HUB_CACHE): the repositories' files."""
        return self.cache / "hub" if self.cache else None

    @property
    def datasets(self) -> Path | None:
        """datasets' cache directory (HF_DATASETS_CACHE): the task datasets as prepared."""
        return self.cache / "datasets" if self.cache else None

    def environment(self) -> dict[str, str]:
        """The variables the libraries read at import; none without a cache."""
        if self.cache is None:
            return {}
        flag = "1" if self.offline else "0"
        return {
            "HF_HUB_CACHE": str(self.hub),
            "HF_DATASETS_CACHE": str(self.datasets),
            "HF_HUB_OFFLINE": flag,
            "HF_DATASETS_OFFLINE": flag,
        }

    def describe(self) -> str:
        if self.cache is None:
            return "the Hugging Face libraries' default cache"
        return f"the cache {self.cache}" + (" (offline)" if self.offline else "")


def hub_reads(config: dict, local_tasks) -> list[str]:
    """What a validated config's jobs read from the Hub (rules fetch_data and fetch_tasks download it): the hub dataset,
    the hub tokenizer, the eval tasks not in `local_tasks` (the built-in ones, whose items rule
    eval_tasks writes: lm-eval's own and include_path's; `streamback fetch` loads those whose data
    are on the Hub). Empty for the default config."""
    data = config["data"]
    reads = []
    if data["source"] == "hub" and not Path(data["hub"]["dataset"]).is_dir():
        reads.append(f"hub dataset {data['hub']['dataset']} ({data['hub']['name']})")
    if data["tokenizer"]["kind"] == "hub":
        reads.append(f"tokenizer {data['tokenizer']['name']}")
    tasks = [t for t in config["eval"]["tasks"] if t not in local_tasks]
    if tasks:
        reads.append(f"eval tasks {', '.join(tasks)}")
    return reads


def for_command(command: str | None, environ=None) -> HubAccess:
    """The access of a `streamback <command>` process: the cache STREAMBACK_HUB_CACHE names (the
    job's config's `hub_cache`), online for `fetch` alone."""
    environ = os.environ if environ is None else environ
    cache = environ.get(ENV)
    if not cache:
        return HubAccess(None, offline=False)
    return HubAccess(Path(cache).resolve(), offline=command != FETCH_COMMAND)


# the libraries' modules that read the environment once, when imported
LIBRARY_SETTINGS = ("huggingface_hub.constants", "datasets.config")


def _reread() -> None:
    """Have each of LIBRARY_SETTINGS already imported read the environment again (its own code)."""
    for name in LIBRARY_SETTINGS:
        module = sys.modules.get(name)
        if module is not None:
            importlib.reload(module)


@contextlib.contextmanager
def applied(access: HubAccess):
    """Run the block with `access`'s cache and offline mode: the environment the libraries read,
    and the settings of those already imported (re-read from it); after the block the previous
    environment comes back, and each of them imported by then re-reads it. Nothing changes
    without a cache. A library first imported inside the block reads the block's environment."""
    if access.cache is None:
        yield access
        return
    saved = {name: os.environ.get(name) for name in access.environment()}
    os.environ.update(access.environment())
    _reread()
    try:
        yield access
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        _reread()
