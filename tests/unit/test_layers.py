"""The package's layers (pyproject.toml's import-linter contract): commands over stages, stages
over training, training over the model, the model over data, data over the base modules."""

import pkgutil
import subprocess
import sys
import tomllib
from pathlib import Path

import streamback

from conftest import ROOT


def test_no_import_runs_up_a_layer():
    lint = Path(sys.executable).parent / "lint-imports"
    proc = subprocess.run([str(lint)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "1 kept, 0 broken" in proc.stdout


def test_every_module_has_a_layer():
    """A module outside every layer could import anything: each top-level module or package of
    streamback (but the package's own __init__ and __main__) is named in exactly one layer."""
    (contract,) = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    named = [m.strip() for layer in contract["layers"] for m in layer.replace("|", ":").split(":")]
    modules = {f"streamback.{m.name}" for m in pkgutil.iter_modules(streamback.__path__) if m.name != "__main__"}
    assert sorted(named) == sorted(modules)
