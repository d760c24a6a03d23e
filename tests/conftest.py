"""Shared test fixtures: the repository root, a way to run Snakemake on it, small token shards, and
the devices a test runs on.

A test that takes the `device` fixture runs once per device: on the CPU everywhere, and on CUDA
as a test marked `gpu`, which is skipped (with its reason) where no CUDA device exists. A test
that needs CUDA alone is marked `@pytest.mark.gpu` itself. `pytest -m gpu` selects exactly the
runs a GPU machine adds (`benchmarks/gpu_checks.py` runs them there).
"""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.fixture(params=DEVICES)
def device(request):
    """torch.device of each device a test runs on (see the module docstring)."""
    import torch

    return torch.device(request.param)


def pytest_collection_modifyitems(config, items):
    """Skip every test marked `gpu` where torch sees no CUDA device."""
    gpu = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="no CUDA device")
    for item in gpu:
        item.add_marker(skip)


@pytest.fixture(scope="session")
def run_snakemake():
    """Run `snakemake -s <repo>/Snakefile` with the given arguments; returns the CompletedProcess."""

    def run(*args, cwd=None, timeout=900):
        cmd = [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), *map(str, args)]
        return subprocess.run(cmd, cwd=cwd or ROOT, capture_output=True, text=True, timeout=timeout)

    return run



@pytest.fixture(scope="session")
def tokens(tmp_path_factory):
    """A 600-document synthetic corpus through the data stage (BPE of 300 tokens): its shard dir."""
    from streamback.config import validate_config
    from streamback.data.corpus import write_part
    from streamback.data.tokenize import tokenize

    root = tmp_path_factory.mktemp("token-shards")
    write_part(11, 0, 600, root / "part.parquet")
    data = validate_config({"data": {"tokenizer": {"vocab_size": 300}, "val_fraction": 0.1, "shard_tokens": 20000, "processes": 1}})["data"]
    tokenize(data, root / "tokens", inputs=[root / "part.parquet"], progress=False)
    return root / "tokens"


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models run fastest on one thread (on a loaded 2-core machine, many times faster than on two)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
