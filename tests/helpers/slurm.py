"""The local Slurm cluster's tests (tests/slurm/start-cluster.sh): their marks and the queue."""

import shutil
import subprocess

import pytest

# a module's pytestmark: slow, slurm, and skipped where Slurm is not installed
SLURM = [
    pytest.mark.slow,
    pytest.mark.slurm,
    pytest.mark.skipif(shutil.which("sbatch") is None, reason="Slurm is not installed (see tests/slurm/)"),
]


def squeue(*fields):
    """The queue's jobs, each a list of the `squeue -o` fields asked for."""
    out = subprocess.run(["squeue", "-h", "-o", "|".join(fields)], capture_output=True, text=True, check=True).stdout
    return [line.split("|") for line in out.splitlines() if line]
