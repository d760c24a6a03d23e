"""Shared test fixtures: the repository root and a way to run Snakemake on it."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def run_snakemake():
    """Run `snakemake -s <repo>/Snakefile` with the given arguments; returns the CompletedProcess."""

    def run(*args, cwd=None, timeout=900):
        cmd = [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), *map(str, args)]
        return subprocess.run(cmd, cwd=cwd or ROOT, capture_output=True, text=True, timeout=timeout)

    return run
