"""`streamback fetch` against the local Hub (tests/helpers/hub.py), then the stages that read what
it fetched with no network at all (`unshare -n`): a GPU tier's data and tasks, small. The fetch
takes the sample's own files at the commit `main` resolves to, the tokenizer and the task's
dataset; a tokenize from the cache names that commit and writes the shards the Hub route writes;
a stage that needs what the cache lacks fails naming it and `snakemake fetch`."""

import json
import shutil
import subprocess
import sys

import huggingface_hub.constants
import pytest
import yaml

from streamback import layout
from streamback.cli import main
from streamback.data import hubcache

from helpers.hub import (  # noqa: F401
    DATASET,
    SAMPLE,
    TASK,
    TASK_DATASET,
    TOKENIZER,
    hub_environment,
    local_hub,
    needs_unshare,
    no_network,
    tier_config,
)

pytestmark = needs_unshare


def streamback(*args) -> list[str]:
    return [sys.executable, "-m", "streamback", *map(str, args)]


def run(command, cwd, env, timeout=300):
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def fetched(local_hub, tmp_path_factory):
    """(root, its environment, the record) of one fetch of tier_config(root) from the local Hub."""
    root = tmp_path_factory.mktemp("fetch")
    (root / "config.yaml").write_text(yaml.safe_dump(tier_config(root)))
    env = hub_environment(local_hub.hub, root)
    result = run(streamback("fetch", "--config", "config.yaml"), root, env)
    assert result.returncode == 0, result.stderr[-3000:]
    record = {}
    for part in layout.FETCH_PARTS:
        record.update(json.loads((root / layout.fetch_record(part)).read_text()))
    return root, env, record


def data_params(root) -> str:
    """The data section as rule tokenize passes it (`--params`: the cache comes from the job's environment)."""
    return json.dumps(yaml.safe_load((root / "config.yaml").read_text())["data"])


def offline_env(env, cache):
    """What a compute job of the config gets: the cache (jobs.execution_environment), nothing else."""
    return {**env, hubcache.ENV: str(cache)}


def test_fetch_takes_the_sample_the_tokenizer_and_the_task_at_their_commits(fetched, local_hub):
    root, env, record = fetched
    dataset = record["dataset"]
    assert (dataset["dataset"], dataset["name"], dataset["revision"]) == (DATASET, SAMPLE, "main")
    assert dataset["commit"] == local_hub.dataset.commit
    sample = sorted(p for p in local_hub.dataset.files if p.startswith("sample/10BT/"))
    assert [f["path"] for f in dataset["files"]] == sample  # the sample's own files, not the crawls'
    assert [f["bytes"] for f in dataset["files"]] == [len(local_hub.dataset.files[p]) for p in sample]
    assert record["tokenizer"] == {"repository": TOKENIZER, "revision": "main", "commit": local_hub.tokenizer.commit}
    assert record["tasks"] == [{"task": TASK, "dataset_path": TASK_DATASET, "dataset_name": None, "items": 5}]
    fetched_paths = {path for method, path in local_hub.hub.requests if method == "GET" and "/resolve/" in path}
    assert not any("CC-MAIN" in path for path in fetched_paths)
    # a second fetch finds everything in the cache: no file is downloaded again
    before = len(local_hub.hub.requests)
    again = run(streamback("fetch", "--config", "config.yaml"), root, env)
    assert again.returncode == 0, again.stderr[-3000:]
    gets = [p for m, p in local_hub.hub.requests[before:] if m == "GET" and "/resolve/" in p and p.endswith(".parquet")]
    assert gets == []


def test_tokenize_offline_reads_the_cache_and_writes_the_hub_routes_shards(fetched, local_hub):
    root, env, record = fetched
    data = data_params(root)
    offline = run(
        no_network(streamback("tokenize", "--params", data, "--out", "tokens-offline")),
        root,
        offline_env(env, root / "hf-cache"),
    )
    assert offline.returncode == 0, offline.stderr[-3000:]
    manifest = json.loads((root / "tokens-offline" / "manifest.json").read_text())
    assert manifest["source"]["commit"] == record["dataset"]["commit"] == local_hub.dataset.commit
    # the Hub route (no cache: the libraries' defaults, streaming from the Hub) gives the same fingerprint and bytes
    online = run(streamback("tokenize", "--params", data, "--out", "tokens-hub"), root, env)
    assert online.returncode == 0, online.stderr[-3000:]
    hub = json.loads((root / "tokens-hub" / "manifest.json").read_text())
    assert hub["fingerprint"] == manifest["fingerprint"] and hub["source"] == manifest["source"]
    for split in ("train", "val"):
        assert [s["sha256"] for s in hub["splits"][split]["shards"]] == [
            s["sha256"] for s in manifest["splits"][split]["shards"]
        ]
        assert manifest["splits"][split]["tokens"] > 0


def without(cache, tmp_path, *paths):
    """A copy of the fetched cache with `paths` (relative to it) removed."""
    copy = tmp_path / "cache"
    shutil.copytree(cache, copy, symlinks=True)
    for path in paths:
        target = copy / path
        shutil.rmtree(target) if target.is_dir() and not target.is_symlink() else target.unlink()
    return copy


def test_a_stage_that_needs_what_was_not_fetched_names_it_and_snakemake_fetch(fetched, tmp_path, monkeypatch, capsys):
    """In this process, as cli.main runs a job of the config (its cache offline), and given back after."""
    root, env, record = fetched
    cache = root / "hf-cache"
    snapshot = f"hub/datasets--HuggingFaceFW--fineweb/snapshots/{record['dataset']['commit']}"
    cases = {
        "nothing fetched": (tmp_path / "empty", f"hub dataset {DATASET} (revision main): its README.md is not in"),
        "a file of the sample": (
            without(cache, tmp_path / "file", f"{snapshot}/{record['dataset']['files'][1]['path']}"),
            f"hub dataset {DATASET} (revision main): the files of {SAMPLE} (sample/10BT/*) are not all in",
        ),
        "the tokenizer": (
            without(cache, tmp_path / "tokenizer", "hub/models--meta-llama--Meta-Llama-3-8B"),
            f"tokenizer.json of {TOKENIZER} (revision main) is not in the Hub cache",
        ),
    }
    offline_before = huggingface_hub.constants.is_offline_mode()
    for case, (missing, message) in cases.items():
        monkeypatch.setenv(hubcache.ENV, str(missing))
        out = tmp_path / f"tokens-{case.replace(' ', '-')}"
        assert main(["tokenize", "--params", data_params(root), "--out", str(out)]) == 2, case
        (line,) = capsys.readouterr().err.strip().splitlines()[-1:]
        assert line.startswith("streamback tokenize: error: ") and message in line, (case, line)
        assert "run `snakemake fetch`" in line, (case, line)
        assert not (out / "manifest.json").exists(), case
        assert huggingface_hub.constants.is_offline_mode() == offline_before  # given back
    # evaluate loads its tasks before its model: a task dataset the cache lacks fails first, naming it
    monkeypatch.setenv(hubcache.ENV, str(without(cache, tmp_path / "task", "datasets/Rowan___hellaswag")))
    eval_section = json.dumps(tier_config(root)["eval"])
    args = [
        "--run-name",
        "r",
        "--model",
        str(tmp_path / "model.pt"),
        "--tokens",
        str(tmp_path),
        "--outdir",
        str(tmp_path),
    ]
    assert main(["evaluate", "--params", eval_section, *args]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"task {TASK}: cannot load its dataset {TASK_DATASET}" in line and "run `snakemake fetch`" in line, line
