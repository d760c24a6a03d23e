"""The Hub access of a process (streamback.data.hubcache): decided from the job's environment and
command, applied around a stage and given back; which configs read the Hub and so get a cache;
the card's file patterns that the fetch downloads. The fetch itself, against the local Hub:
tests/workflow/test_fetch_end_to_end.py and test_fetch_workflow.py."""

import os

import datasets
import huggingface_hub.constants
import pytest
import yaml

from streamback import jobs
from streamback.cli import hub_access
from streamback.config import validate_config
from streamback.data import hubcache
from streamback.data.sources import card_patterns
from streamback.errors import StreambackError

from conftest import ROOT
from helpers.hub import card


def test_every_command_but_fetch_is_offline_on_the_cache_its_job_names(tmp_path):
    environ = {hubcache.ENV: str(tmp_path / "cache")}
    for command in ("tokenize", "train", "evaluate", "analyze", None):
        access = hubcache.for_command(command, environ)
        assert access == hubcache.HubAccess(tmp_path / "cache", offline=True)
        assert access.environment() == {
            "HF_HUB_CACHE": str(tmp_path / "cache" / "hub"),
            "HF_DATASETS_CACHE": str(tmp_path / "cache" / "datasets"),
            "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
        }
    fetch = hubcache.for_command("fetch", environ)
    assert not fetch.offline and fetch.environment()["HF_HUB_OFFLINE"] == "0"
    # without the variable (the default config's jobs, a hand run): the libraries' own defaults, untouched
    assert hubcache.for_command("tokenize", {}) == hubcache.HubAccess(None, offline=False)
    assert hubcache.for_command("tokenize", {}).environment() == {}


def test_applied_sets_the_libraries_and_gives_them_back(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.delenv("HF_DATASETS_CACHE", raising=False)
    before = (
        huggingface_hub.constants.HF_HUB_OFFLINE,
        huggingface_hub.constants.HF_HUB_CACHE,
        datasets.config.HF_HUB_OFFLINE,
        datasets.config.HF_DATASETS_CACHE,
    )
    access = hubcache.HubAccess(tmp_path, offline=True)
    with hubcache.applied(access):
        assert huggingface_hub.constants.is_offline_mode() and datasets.config.HF_HUB_OFFLINE
        assert huggingface_hub.constants.HF_HUB_CACHE == str(tmp_path / "hub")
        assert datasets.config.HF_DATASETS_CACHE == tmp_path / "datasets"
        assert os.environ["HF_HUB_OFFLINE"] == "1" and os.environ["HF_DATASETS_CACHE"] == str(tmp_path / "datasets")
    assert before == (
        huggingface_hub.constants.HF_HUB_OFFLINE,
        huggingface_hub.constants.HF_HUB_CACHE,
        datasets.config.HF_HUB_OFFLINE,
        datasets.config.HF_DATASETS_CACHE,
    )
    assert os.environ["HF_HUB_OFFLINE"] == "0" and "HF_DATASETS_CACHE" not in os.environ


def test_applied_gives_back_after_a_failing_stage(tmp_path):
    before = huggingface_hub.constants.HF_HUB_OFFLINE
    with pytest.raises(RuntimeError), hubcache.applied(hubcache.HubAccess(tmp_path, offline=not before)):
        raise RuntimeError("the stage failed")
    assert huggingface_hub.constants.HF_HUB_OFFLINE == before


def tier(name: str) -> dict:
    return validate_config(yaml.safe_load((ROOT / "config" / name).read_text()))


def test_only_a_config_that_reads_the_hub_gets_a_cache_and_the_hub_offline():
    default = validate_config({})
    assert jobs.hub_reads(default) == []
    assert jobs.execution_environment(default) == {"STREAMBACK_CPU_BF16": "auto"}  # as before the cache existed
    for name in ("one-gpu.yaml", "paper.yaml"):
        config = tier(name)
        reads = jobs.hub_reads(config)
        assert reads[:2] == [
            f"hub dataset HuggingFaceFW/fineweb ({config['data']['hub']['name']})",
            "tokenizer meta-llama/Meta-Llama-3-8B",
        ]
        assert "piqa" in reads[2]
        env = jobs.execution_environment(config)
        # absolute, so that a job reads the cache whatever directory it starts in
        assert os.path.isabs(env[hubcache.ENV]) and env[hubcache.ENV].endswith(os.sep + "hf-cache")
    # lm-eval's own task on the synthetic corpus: its data come from the Hub, so the jobs read the cache
    config = validate_config({"eval": {"tasks": ["hellaswag"]}})
    assert jobs.hub_reads(config) == ["eval tasks hellaswag"] and hubcache.ENV in jobs.execution_environment(config)


def test_each_fetch_job_is_given_what_it_downloads_and_not_the_budgets():
    config = tier("one-gpu.yaml")
    assert jobs.fetch_parts(config) == ["data", "tasks"]
    data = jobs.fetch(config, "data")["data"]
    assert data["hub"] == config["data"]["hub"] and data["tokenizer"] == config["data"]["tokenizer"]
    assert "train_tokens" not in data  # a budget changes no download: changing it refetches nothing
    tasks = jobs.fetch(config, "tasks")
    assert tasks == {"eval": {"tasks": config["eval"]["tasks"], "include_path": config["eval"]["include_path"]}}
    # the default plans neither; lm-eval's own task on the synthetic corpus, its tasks' fetch alone
    assert jobs.fetch_parts(validate_config({})) == []
    assert jobs.fetch_parts(validate_config({"eval": {"tasks": ["hellaswag"]}})) == ["tasks"]


def test_the_card_names_the_files_of_a_sample(tmp_path):
    path = tmp_path / "README.md"
    path.write_bytes(
        card(
            [
                {"config_name": "default", "data_files": {"train": "data/*/*"}},
                {"config_name": "sample-10BT", "data_files": {"train": "sample/10BT/*"}},
            ]
        )
    )
    assert card_patterns(path, "HuggingFaceFW/fineweb", "sample-10BT", "train") == ["sample/10BT/*"]
    assert card_patterns(path, "HuggingFaceFW/fineweb", None, "train") == ["data/*/*"]
    with pytest.raises(
        StreambackError, match=r"no config 'sample-1T' \(data.hub.name\); its card names default, sample-10BT"
    ):
        card_patterns(path, "HuggingFaceFW/fineweb", "sample-1T", "train")
    with pytest.raises(StreambackError, match=r"gives no files for split 'test' \(data.hub.split\)"):
        card_patterns(path, "HuggingFaceFW/fineweb", "sample-10BT", "test")
    plain = tmp_path / "plain.md"
    plain.write_text("a card without configs\n")
    assert card_patterns(plain, "someone/corpus", None, "train") == ["*"]


def test_a_hand_run_with_a_config_file_reads_the_cache_its_job_reads(tmp_path):
    path = tmp_path / "tier.yaml"
    path.write_text(yaml.safe_dump({"data": {"source": "hub"}, "hub_cache": str(tmp_path / "shared" / "hf")}))
    assert hub_access("tokenize", ["tokenize", "--config", str(path)]) == hubcache.HubAccess(
        tmp_path / "shared" / "hf", offline=True
    )
    assert hub_access("fetch", ["fetch", f"--config={path}"]) == hubcache.HubAccess(tmp_path / "shared" / "hf", False)
    # a config that reads nothing from the Hub: the libraries' defaults, whatever the environment says
    local = tmp_path / "local.yaml"
    local.write_text("data: {source: synthetic}\n")
    assert hub_access("tokenize", ["tokenize", "--config", str(local)]) == hubcache.HubAccess(None, offline=False)
