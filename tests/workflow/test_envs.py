"""Conda environments in envs/ parse, pin versions that pyproject.toml allows, and suffice for
their jobs (run with every other package blocked)."""

import json
import tomllib

import pytest
import yaml
from packaging.requirements import Requirement

from conftest import ROOT

ENVS = sorted((ROOT / "envs").glob("*.yaml"))


def _project_requirements():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    for extra in project.get("optional-dependencies", {}).values():
        reqs += [Requirement(r) for r in extra]
    return {r.name.lower().replace("_", "-"): r for r in reqs}


def _pip_pins(env):
    pins = {}
    for dep in env["dependencies"]:
        if isinstance(dep, dict):
            for line in dep["pip"]:
                req = Requirement(line)
                (spec,) = req.specifier
                assert spec.operator == "==", f"{line}: pin an exact version"
                pins[req.name.lower().replace("_", "-")] = spec.version
    return pins


def test_there_is_one_env_per_rule_family():
    assert {p.stem for p in ENVS} >= {"drift", "data", "train"}


@pytest.mark.parametrize("path", ENVS, ids=lambda p: p.name)
def test_env_parses_and_agrees_with_pyproject(path):
    env = yaml.safe_load(path.read_text())
    assert env["name"] == f"streamback-{path.stem}"
    assert "python=3.11" in env["dependencies"]
    pins = _pip_pins(env)
    project = _project_requirements()
    for name, version in pins.items():
        assert name in project, f"{path.name}: {name} is not a dependency in pyproject.toml"
        assert project[name].specifier.contains(version, prereleases=True), (
            f"{path.name}: {name}=={version} is outside pyproject's {project[name].specifier}"
        )


def test_every_rule_names_an_existing_env():
    for smk in (ROOT / "workflow" / "rules").glob("*.smk"):
        for line in smk.read_text().splitlines():
            if line.strip().startswith("conda:"):
                target = line.split(":", 1)[1].strip().strip('"').strip("'")
                assert (smk.parent / target).resolve().exists(), f"{smk.name}: {target} missing"


_ONLY_THE_ENV = """
import importlib.machinery, sys
BLOCKED = {blocked!r}
class Absent(importlib.machinery.PathFinder):
    # the standard path finder, blind to the packages outside the env: as where they are not
    # installed, find_spec gives None (a probe says absent) and an import fails
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        return None if name.split(".")[0] in BLOCKED else super().find_spec(name, path, target)
sys.meta_path[sys.meta_path.index(importlib.machinery.PathFinder)] = Absent
{imports}
from streamback.cli import main
for argv in {commands!r}:
    if main(argv):
        sys.exit(f"streamback {{argv[0]}} failed")
"""


def run_with_only_the_env(env: str, commands: list[list[str]], imports: str = "", extra_env: dict | None = None):
    """Run `streamback` commands in one process where every package of pyproject.toml that
    envs/<env>.yaml does not pin is blocked (an import of it fails), as on a node with that env alone."""
    import os
    import subprocess
    import sys

    import_names = {"pyyaml": "yaml", "vl-convert-python": "vl_convert"}
    pins = _pip_pins(yaml.safe_load((ROOT / "envs" / f"{env}.yaml").read_text()))
    blocked = {import_names.get(n, n.replace("-", "_")) for n in _project_requirements() if n not in pins}
    blocked -= {"pytest"}  # the test runner's own
    assert "snakemake" in blocked  # no job imports it: no env carries it
    code = _ONLY_THE_ENV.format(blocked=sorted(blocked), env=env, imports=imports, commands=commands)
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, **(extra_env or {})},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return blocked


def test_train_env_suffices_for_the_gpu_commands(tmp_path):
    """train/bench/export-hf run with envs/train.yaml's packages alone (a bare GPU node: no
    Snakemake, pandas, altair or data stack); here the bench runs with the others blocked."""
    bench = [
        "bench",
        "--shapes",
        "tiny-fat-short",
        "--modes",
        "eager",
        "--variants",
        "baseline",
        "--batch",
        "1",
        "--seq-len",
        "8",
        "--vocab-size",
        "32",
        "--steps",
        "1",
        "--warmup",
        "0",
        "--out",
        str(tmp_path / "bench.json"),
    ]
    blocked = run_with_only_the_env(
        "train", [bench], imports="import streamback.model.export_hf, streamback.train.trainer"
    )
    assert {"pandas", "datasets"} <= blocked
    assert (tmp_path / "bench.json").exists()


@pytest.mark.slow
def test_data_and_drift_envs_suffice_for_their_jobs(tmp_path):
    """The corpus, tokenize and drift jobs run with their envs' packages alone (neither carries
    Snakemake: no job imports it). Drift runs eagerly here (TORCHDYNAMO_DISABLE: the same numbers
    without the compile's seconds)."""
    corpus = tmp_path / "corpus" / "part-00000-of-00001.parquet"
    run_with_only_the_env(
        "data",
        [
            [
                "corpus",
                "--params",
                json.dumps({"synthetic": {"documents": 300, "files": 1}}),
                "--out",
                str(corpus.parent),
                "--processes",
                "1",
            ],
            [
                "tokenize",
                "--params",
                json.dumps(
                    {
                        "tokenizer": {"vocab_size": 300, "train_documents": 300},
                        "shard_tokens": 20000,
                        "val_fraction": 0.1,
                    }
                ),
                "--out",
                str(tmp_path / "tokens"),
                "--processes",
                "1",
                "--inputs",
                str(corpus),
                "--quiet",
            ],
        ],
    )
    assert (tmp_path / "tokens" / "manifest.json").exists()
    drift = {
        "coords": 16,
        "steps": 20,
        "seeds": [0],
        "trajectory_every": 5,
        "settings": [{"mu": 0.2, "sigma": 0.5}],
        "paths": ["fp32", "bf16"],
    }
    run_with_only_the_env(
        "drift",
        [["drift", "--params", json.dumps(drift), "--outdir", str(tmp_path / "drift")]],
        extra_env={"TORCHDYNAMO_DISABLE": "1"},
    )
    assert (tmp_path / "drift" / "report.html").exists()
