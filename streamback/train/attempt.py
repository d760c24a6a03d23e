"""`streamback train-attempt`: one attempt of a train job, as the train rule runs it.

It starts the trainer with the job's launcher (python, torchrun or srun + torchrun: the rule's
`train_launcher`) and keeps the story of a run resumed over several jobs: every attempt appends
to the run's history (`results/checkpoints/{run}/train.log`, kept with the checkpoints, because
Snakemake deletes a job's log before every attempt), framed by a line when it starts and one
with its status when it ends, and the job's log is a hard link to the history (a copy where the
two are on different filesystems).

The exit status is the trainer's own (75: stopped to be requeued, 3: diverged, 2: bad input),
read from the trainer's `--status-file` where the launcher reports another (torchrun reports a
failed worker as 1), so a scheduler can tell "requeue me" from "failed". Slurm sends SIGTERM,
SIGUSR1 or SIGURG (the train rule's `--signal`) to every process of a job: this process and the
launcher's shell outlive them (they are caught and ignored here; the trainers get them too and
save a checkpoint before they stop), so the status can still be read and returned.

Before it starts the trainer it waits while another live Slurm job holds the run's lock (a job
that a restarted Snakemake submitted again: `streamback.train.runlock.wait_for_holder`), so that
the duplicate neither fails, using up one of Snakemake's retries, nor trains beside the first;
once that job ends this one resumes from its newest checkpoint (or, the run done, writes its
outputs again). Stopped while it waits, it exits 75 having started nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from streamback.train.runlock import wait_for_holder

HELP = "one attempt of a train job: the trainer under the job's launcher, its history and its exit status"
SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGURG)
EXIT_REQUEUE = 75  # the trainer's (streamback.train.trainer): stopped, to be resumed
_heard: list[int] = []  # the stop signals this process caught


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--launch",
        required=True,
        help="the shell command that starts `streamback` (the rule's train_launcher); `train` and the trainer's "
        "arguments follow it",
    )
    parser.add_argument("--checkpoints", type=Path, required=True, help="the run's checkpoint directory")
    parser.add_argument(
        "--history",
        type=Path,
        required=True,
        help="the run's history, appended to by every attempt (results/checkpoints/{run}/train.log)",
    )
    parser.add_argument(
        "--log", type=Path, required=True, help="the job's log: a hard link to the history, else a copy"
    )
    parser.add_argument(
        "--lock-poll",
        type=float,
        default=60,
        help="seconds between looks at the Slurm job that holds the run's lock, while this attempt waits for it",
    )
    parser.add_argument(
        "trainer",
        nargs=argparse.REMAINDER,
        help="`--` and then the arguments of `streamback train` (not --checkpoints or --status-file: added here)",
    )


def _ignore(signum, frame) -> None:
    """A handler, not SIG_IGN: the launcher's processes start with the default and act on the signal.
    It remembers the signal, which stops a wait for the run's lock."""
    _heard.append(signum)


def link_log(history: Path, log: Path) -> None:
    """The job's log as a hard link to the history, or a copy where a link cannot be made."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        log.unlink()
    try:
        os.link(history, log)
    except OSError:
        shutil.copyfile(history, log)


def _note(history: Path, line: str) -> None:
    with history.open("a") as out:
        out.write(line + "\n")


def _status(launcher: int, status_file: Path) -> int:
    """The trainer's status: the launcher's, unless it failed and the trainer wrote its own."""
    if launcher == 0:
        return 0
    with contextlib.suppress(OSError, ValueError):
        return int(status_file.read_text().strip())
    return launcher


def attempt(
    launch: str, trainer_args: list[str], checkpoints: Path, history: Path, log: Path, lock_poll: float = 60
) -> int:
    """Run one attempt; return its exit status (see the module docstring)."""
    for sig in SIGNALS:
        signal.signal(sig, _ignore)
    checkpoints.mkdir(parents=True, exist_ok=True)
    history.touch()
    link_log(history, log)
    job = f", Slurm job {os.environ['SLURM_JOB_ID']}" if os.environ.get("SLURM_JOB_ID") else ""
    _note(history, f"=== attempt started {time.strftime('%Y-%m-%d %H:%M:%S %Z')} on {socket.gethostname()}{job}")

    def say(line):
        _note(history, line)

    if not wait_for_holder(checkpoints, say, poll_s=lock_poll, stopped=lambda: bool(_heard)):
        _note(history, f"=== attempt ended with status {EXIT_REQUEUE} (stopped while it waited for the run's lock)")
        return EXIT_REQUEUE
    status_file = checkpoints / f".exit-status.{os.getpid()}"
    args = [*trainer_args, "--checkpoints", str(checkpoints), "--status-file", str(status_file)]
    # the launcher's shell, too, outlives the signals it is sent; its children start with the default
    command = f"trap : TERM USR1; {launch} train {shlex.join(args)}"
    env = {**os.environ, "STREAMBACK_PYTHON": os.environ.get("STREAMBACK_PYTHON", sys.executable)}
    try:
        with history.open("a") as out:
            launcher = subprocess.run(["bash", "-c", command], stdout=out, stderr=subprocess.STDOUT, env=env).returncode
        launcher = (
            launcher if launcher >= 0 else 128 - launcher
        )  # the shell itself killed by a signal: as a shell says it
        status = _status(launcher, status_file)
    finally:
        with contextlib.suppress(FileNotFoundError):
            status_file.unlink()
    _note(history, f"=== attempt ended with status {status} (the launcher returned {launcher})")
    if not log.exists() or not os.path.samefile(history, log):
        shutil.copyfile(history, log)
    if status != 0:
        tail = history.read_text(errors="replace").splitlines()[-5:]
        print(f"--- the end of {log}:", *tail, sep="\n", file=sys.stderr)
    return status


def run(args: argparse.Namespace) -> int:
    trainer = args.trainer[1:] if args.trainer[:1] == ["--"] else args.trainer
    return attempt(args.launch, trainer, args.checkpoints, args.history, args.log, args.lock_poll)
