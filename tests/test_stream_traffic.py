"""benchmarks/stream_traffic.py: its byte counter on hand-computed cases, and its table."""

import importlib.util
import subprocess
import sys

import pytest
import torch

from conftest import ROOT

SCRIPT = ROOT / "benchmarks" / "stream_traffic.py"


@pytest.fixture(scope="module")
def traffic_module():
    spec = importlib.util.spec_from_file_location("stream_traffic", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bytes_counted_by_hand(traffic_module):
    a, b = torch.ones(1000), torch.ones(1000, dtype=torch.bfloat16)
    cases = [
        (lambda: a + a, 3 * 4000),  # read two fp32, write one
        (lambda: a + b, 4000 + 2000 + 4000),  # mixed add: bf16 read as it is, fp32 written
        (lambda: b.float(), 2000 + 4000),  # a conversion reads and writes
        (lambda: a.float(), 0),  # already fp32: returns the input itself
        (lambda: a.view(10, 100).t(), 0),  # views move nothing
        (lambda: a.clone().add_(1), 2 * 4000 + 2 * 4000),  # a copy, then an in-place read + write
    ]
    for fn, expected in cases:
        counter = traffic_module.Traffic()
        with counter:
            fn()
        assert counter.bytes == expected, (fn, counter.bytes, expected)


def test_table_for_a_tiny_shape():
    cmd = [sys.executable, str(SCRIPT), "--shapes", "tiny-fat-short", "--variants", "baseline,streamback,streamback-reversible",
           "--batch", "2", "--seq-len", "64", "--vocab-size", "512"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {line.split()[1]: line.split() for line in proc.stdout.splitlines()[1:]}
    assert set(rows) == {"baseline", "streamback", "streamback-reversible"}
    moved = {k: float(r[4]) for k, r in rows.items()}  # GB moved
    assert float(rows["baseline"][6]) == 0 and moved["streamback-reversible"] > moved["streamback"] > 0
