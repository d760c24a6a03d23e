"""Conda environments in envs/ parse and pin versions that pyproject.toml allows."""

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


_TRAIN_PATH_CHECK = """
import importlib.abc, importlib.machinery, sys
BLOCKED = {blocked!r}
class Block(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    # packages outside the env look absent: a spec without origin, whose import fails
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in BLOCKED:
            return importlib.machinery.ModuleSpec(name, self)
    def create_module(self, spec):
        raise ModuleNotFoundError("not in envs/train.yaml: " + spec.name)
    def exec_module(self, module):
        pass
sys.meta_path.insert(0, Block())
import streamback.model.export_hf, streamback.train.trainer
from streamback.cli import main
sys.exit(main(["bench", "--shapes", "tiny-fat-short", "--modes", "eager", "--variants", "baseline",
               "--batch", "1", "--seq-len", "8", "--vocab-size", "32", "--steps", "1", "--warmup", "0",
               "--out", {out!r}]))
"""


def test_train_env_suffices_for_the_gpu_commands(tmp_path):
    """train/bench/export-hf run with envs/train.yaml's packages alone (a bare GPU node: no
    Snakemake, pandas, altair or data stack); here the bench runs with the others blocked."""
    import subprocess
    import sys

    import_names = {"pyyaml": "yaml", "vl-convert-python": "vl_convert"}
    train_pins = _pip_pins(yaml.safe_load((ROOT / "envs" / "train.yaml").read_text()))
    project = _project_requirements()
    blocked = {import_names.get(n, n.replace("-", "_")) for n in project if n not in train_pins}
    blocked -= {"pytest"}  # the test runner's own
    assert {"snakemake", "pandas", "datasets"} <= blocked
    code = _TRAIN_PATH_CHECK.format(blocked=sorted(blocked), out=str(tmp_path / "bench.json"))
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "bench.json").exists()
