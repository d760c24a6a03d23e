"""The end-to-end half of test_stream_traffic.py (commands run as processes, compiled or multi-process runs, Snakemake):
the same subjects, at the pace of whole runs."""

import subprocess
import sys

from conftest import ROOT

SCRIPT = ROOT / "benchmarks" / "stream_traffic.py"


def test_table_for_a_tiny_shape():
    cmd = [
        sys.executable,
        str(SCRIPT),
        "--shapes",
        "tiny-fat-short",
        "--variants",
        "baseline,streamback,streamback-reversible",
        "--batch",
        "2",
        "--seq-len",
        "64",
        "--vocab-size",
        "512",
    ]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {line.split()[1]: line.split() for line in proc.stdout.splitlines()[1:]}
    assert set(rows) == {"baseline", "streamback", "streamback-reversible"}
    moved = {k: float(r[4]) for k, r in rows.items()}  # GB moved
    assert float(rows["baseline"][6]) == 0 and moved["streamback-reversible"] > moved["streamback"] > 0
