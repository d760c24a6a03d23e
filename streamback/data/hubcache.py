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
environment when first imported, so `applied` also sets them on the modules already imported (it
imports them first) and gives both back after the block. Standard library only: `jobs.py`, which
the rule files import, names the variable.
"""

from __future__ import annotations

import contextlib
import importlib
import os
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


def for_command(command: str | None, environ=None) -> HubAccess:
    """The access of a `streamback <command>` process: the cache STREAMBACK_HUB_CACHE names (the
    job's config's `hub_cache`), online for `fetch` alone."""
    environ = os.environ if environ is None else environ
    cache = environ.get(ENV)
    if not cache:
        return HubAccess(None, offline=False)
    return HubAccess(Path(cache).resolve(), offline=command != FETCH_COMMAND)


def _library_settings(access: HubAccess) -> list[tuple[str, str, object]]:
    """(module, attribute, value) of each setting the libraries read once at import."""
    offline = access.offline
    return [
        ("huggingface_hub.constants", "HF_HUB_CACHE", str(access.hub)),
        ("huggingface_hub.constants", "HF_HUB_OFFLINE", offline),
        ("datasets.config", "HF_DATASETS_CACHE", access.datasets),
        ("datasets.config", "DOWNLOADED_DATASETS_PATH", access.datasets / "downloads"),
        ("datasets.config", "EXTRACTED_DATASETS_PATH", access.datasets / "downloads" / "extracted"),
        ("datasets.config", "HF_HUB_OFFLINE", offline),
        ("datasets.config", "HF_DATASETS_OFFLINE", offline),
    ]


@contextlib.contextmanager
def applied(access: HubAccess):
    """Run the block with `access`'s cache and offline mode (environment and the libraries' own
    settings); the previous ones come back after it. Nothing changes without a cache."""
    if access.cache is None:
        yield access
        return
    settings = _library_settings(access)
    modules = {name: importlib.import_module(name) for name, _, _ in settings}  # imported now, so restorable
    saved_env = {name: os.environ.get(name) for name in access.environment()}
    saved = [(name, attr, getattr(modules[name], attr)) for name, attr, _ in settings]
    os.environ.update(access.environment())
    for name, attr, value in settings:
        setattr(modules[name], attr, value)
    try:
        yield access
    finally:
        for name, attr, value in saved:
            setattr(modules[name], attr, value)
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
