"""`streamback train-attempt`, the train rule's attempt: the trainer's own status through a launcher
that reports another, the run's history over attempts, the job's log as a link to it, and an
attempt that outlives the SIGTERM Slurm sends every process of a job."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# A stand-in for torchrun: it writes the trainer's status to --status-file and reports 1 itself;
# on SIGTERM (sent once it has written "ready") it "saves a checkpoint" and stops with 75.
FAKE = r"""
import signal, sys, time
args = sys.argv[1:]
assert args[0] == "train", args
status_file = args[args.index("--status-file") + 1]
print("trainer arguments:", " ".join(args[1:]), flush=True)
def stop(signum, frame):
    print("saved a checkpoint", flush=True)
    open(status_file, "w").write("75\n")
    sys.exit(1)
signal.signal(signal.SIGTERM, stop)
if "--wait" in args:
    print("ready", flush=True)
    time.sleep(60)
open(status_file, "w").write(args[args.index("--status") + 1] + "\n")
sys.exit(1 if args[args.index("--status") + 1] != "0" else 0)
"""


def _attempt(tmp_path, *trainer, wait=False):
    fake = tmp_path / "fake_launcher.py"
    fake.write_text(FAKE)
    cmd = [
        sys.executable,
        "-m",
        "streamback",
        "train-attempt",
        "--launch",
        f"{shlex.quote(sys.executable)} {fake}",
        "--checkpoints",
        str(tmp_path / "ckpt"),
        "--history",
        str(tmp_path / "ckpt" / "train.log"),
        "--log",
        str(tmp_path / "logs" / "run.log"),
        "--",
        *trainer,
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if not wait:
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_the_trainer_s_status_and_the_history_of_two_attempts(tmp_path):
    first = _attempt(tmp_path, "--run-name", "r", "--status", "3")
    assert first.returncode == 3, first.stderr
    assert f"--- the end of {tmp_path / 'logs' / 'run.log'}:" in first.stderr
    history = tmp_path / "ckpt" / "train.log"
    text = history.read_text()
    assert text.startswith("=== attempt started ")
    assert f"trainer arguments: --run-name r --status 3 --checkpoints {tmp_path / 'ckpt'} --status-file " in text
    assert text.rstrip().endswith("=== attempt ended with status 3 (the launcher returned 1)")
    second = _attempt(tmp_path, "--run-name", "r", "--status", "0")
    assert second.returncode == 0 and second.stderr == ""
    story = history.read_text()
    assert story.startswith(text) and story.count("=== attempt started") == 2
    assert story.rstrip().endswith("=== attempt ended with status 0 (the launcher returned 0)")
    assert os.path.samefile(history, tmp_path / "logs" / "run.log")  # the job's log is the history
    assert not list((tmp_path / "ckpt").glob(".exit-status*"))


def test_the_attempt_outlives_sigterm_and_returns_75(tmp_path):
    proc = _attempt(tmp_path, "--run-name", "r", "--wait", wait=True)
    history = tmp_path / "ckpt" / "train.log"
    deadline = time.monotonic() + 30
    while "ready" not in (history.read_text() if history.exists() else ""):
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    # as Slurm does: the signal to every process of the job (the attempt, the launcher's shell, the trainer)
    children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
    grandchildren = [
        c for p in children for c in subprocess.run(["pgrep", "-P", p], capture_output=True, text=True).stdout.split()
    ]
    for pid in [proc.pid, *map(int, children), *map(int, grandchildren)]:
        os.kill(pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 75, err
    assert "saved a checkpoint" in history.read_text()
    assert history.read_text().rstrip().endswith("=== attempt ended with status 75 (the launcher returned 1)")
