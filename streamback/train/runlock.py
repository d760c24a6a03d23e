"""The run's lock, `trainer.lock` in its checkpoint directory: one trainer per run, across nodes,
whatever the controller does (a restarted Snakemake resubmits the train jobs of the one before).

The lock is a file created exclusively: its stamp (JSON: the Slurm job id, with the array and
step ids where present, the host, the PID and the time) is written to a temporary name and
hard-linked to `trainer.lock`, which succeeds for one process only, on any file system that
keeps POSIX link semantics across nodes (NFS, Lustre, GPFS), including a Lustre mounted with
`localflock`, whose `flock` holds on one node only. Where `flock` works the holder also keeps
one on the file, so a live holder on this node is seen at once (`use_flock=False` leaves it out:
what a file system with node-local `flock` amounts to from another node).

A lock whose file is left behind (a trainer killed with SIGKILL, a node lost) is stale only when
its holder is known to be gone: the holder's Slurm job no longer runs (`squeue`, through
`job_state`), or, without Slurm, its PID is gone on this same host. An earlier attempt of this
same Slurm job (a requeued job keeps its id) is stale unless its PID still lives here. A holder
on another host without a Slurm job, or a job Slurm cannot be asked about, is taken as alive,
and the message says what to check before deleting the file. A stale lock is taken over under a
second exclusive file (`.trainer.lock.takeover`), so that two processes that both judged it
stale do not both take it. A lock file of the older flock-only kind (a line "PID ... on host
...") is stale unless its flock is held.

`wait_for_holder` is what a train job does first (`streamback train-attempt`, before the trainer
starts its processes): while another live Slurm job holds the run it waits for that job to end,
so that a job a restarted controller resubmitted neither fails (and uses up one of Snakemake's
retries) nor trains beside the first; it then resumes from the first's newest checkpoint.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from streamback import layout
from streamback.errors import StreambackError

TAKEOVER = ".trainer.lock.takeover"
TAKEOVER_STALE_S = 60  # a takeover lasts milliseconds; one this old was left by a killed process
# squeue's states of a job whose processes may still be writing (a PENDING job, e.g. requeued, writes nothing)
LIVE_STATES = {
    "RUNNING",
    "COMPLETING",
    "CONFIGURING",
    "SUSPENDED",
    "STOPPED",
    "SIGNALING",
    "RESIZING",
    "STAGE_OUT",
}
UNKNOWN = "UNKNOWN"  # Slurm could not be asked


def this_holder() -> dict:
    """The stamp of this process: its Slurm job (array and step where present), host, PID and time."""
    env = os.environ
    stamp = {"host": socket.gethostname(), "pid": os.getpid(), "since": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    if env.get("SLURM_JOB_ID"):
        stamp["job"] = env["SLURM_JOB_ID"]
        if env.get("SLURM_ARRAY_JOB_ID"):
            stamp["array"] = f"{env['SLURM_ARRAY_JOB_ID']}_{env.get('SLURM_ARRAY_TASK_ID', '')}"
        if env.get("SLURM_STEP_ID"):
            stamp["step"] = env["SLURM_STEP_ID"]
    return stamp


def describe(stamp: dict | None) -> str:
    """Who holds the lock, in words."""
    if stamp is None:
        return "a trainer of an older streamback (its lock file has no stamp)"
    where = f"host {stamp.get('host', '?')}, PID {stamp.get('pid', '?')}, since {stamp.get('since', '?')}"
    if stamp.get("job"):
        array = f" (array task {stamp['array']})" if stamp.get("array") else ""
        step = f" step {stamp['step']}" if stamp.get("step") else ""
        return f"Slurm job {stamp['job']}{array}{step} on {where}"
    return f"PID {stamp.get('pid', '?')} on host {stamp.get('host', '?')} (since {stamp.get('since', '?')})"


def slurm_job_state(job: str) -> str | None:
    """The job's state as squeue says it; None if Slurm no longer knows it (it ended), UNKNOWN if
    Slurm cannot be asked (no squeue here, the controller not answering)."""
    try:
        out = subprocess.run(
            ["squeue", "-h", "-j", str(job), "-o", "%T"], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return UNKNOWN
    if out.returncode != 0:
        return None if "invalid job id" in out.stderr.lower() else UNKNOWN
    states = out.stdout.split()
    return states[0] if states else None  # an ended job leaves squeue after MinJobAge


def _pid_alive(pid) -> bool:
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, ValueError, TypeError):
        return True  # alive (another user's), or a stamp that cannot be judged
    return True


def holder_alive(stamp: dict | None, flock_held: bool, job_state: Callable[[str], str | None]) -> tuple[bool, str]:
    """Whether the holder of a lock (its `stamp`; None: an older, stampless lock file) may still
    be training, and why; `flock_held`: this process could not take the file's flock."""
    if flock_held:
        return True, "its flock is held"
    if stamp is None:
        return False, "no process holds its flock"
    me = this_holder()
    here = stamp.get("host") == me["host"]
    job = stamp.get("job")
    if job and job == me.get("job"):  # an earlier attempt of this job (a requeue keeps the job's id)
        alive = here and stamp.get("pid") != me["pid"] and _pid_alive(stamp.get("pid"))
        return alive, "its PID lives" if alive else "it is an earlier attempt of this job"
    if job:
        state = job_state(job)
        if state == UNKNOWN:
            return True, f"Slurm could not be asked about job {job}"
        if state in LIVE_STATES:
            return True, f"job {job} is {state}"
        return False, f"job {job} is {state or 'no longer known to Slurm'}"
    if here:
        alive = _pid_alive(stamp.get("pid"))
        return alive, "its PID lives" if alive else "its PID is gone"
    return True, "it is on another host and has no Slurm job, so whether it lives cannot be told from here"


def _read(path: Path) -> tuple[str, dict | None] | None:
    """The lock file's text and stamp (None: not a stamp); None if there is no lock file."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        stamp = json.loads(text)
    except ValueError:
        stamp = None
    return text, stamp if isinstance(stamp, dict) else None


def _flock_held(path: Path, use_flock: bool) -> bool:
    """Whether another process holds the flock of `path` (False where flock is off or unsupported)."""
    if not use_flock:
        return False
    try:
        with open(path) as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            except OSError:
                return False
            fcntl.flock(handle, fcntl.LOCK_UN)
    except FileNotFoundError:
        return False
    return False


def _create(path: Path, text: str) -> bool:
    """Create `path` holding `text`, atomically and exclusively (a hard link of a written temporary
    file); False if it exists."""
    tmp = path.with_name(f".{path.name}.{socket.gethostname()}.{os.getpid()}")
    with open(tmp, "w") as out:
        out.write(text)
        out.flush()
        os.fsync(out.fileno())
    try:
        os.link(tmp, path)
    except FileExistsError:
        return False
    finally:
        tmp.unlink()
    return True


def _take_over(path: Path, stale: str, text: str) -> bool:
    """Replace the stale lock file (whose text was `stale`) with ours, under the takeover file;
    False if someone else changed it first."""
    guard = path.with_name(TAKEOVER)
    while not _create(guard, text):
        with contextlib.suppress(FileNotFoundError):
            if time.time() - guard.stat().st_mtime > TAKEOVER_STALE_S:
                guard.unlink()
        time.sleep(0.05)
    try:
        now = _read(path)
        if now is not None and now[0] != stale:
            return False
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        return _create(path, text)
    finally:
        guard.unlink()


class RunLock:
    """A held run lock: `check()` that it is still this process's, `close()` to release it."""

    def __init__(self, path: Path, text: str, handle):
        self.path, self.text, self.handle = path, text, handle

    def held(self) -> bool:
        now = _read(self.path)
        return now is not None and now[0] == self.text

    def check(self) -> None:
        """StreambackError if the lock file is no longer this process's (someone judged it stale)."""
        if not self.held():
            now = _read(self.path)
            raise StreambackError(
                f"{self.path} no longer holds this trainer's stamp (it is "
                f"{describe(now[1]) if now else 'gone'}): another trainer may be training this run; stopping "
                "before writing anything more"
            )

    def close(self) -> None:
        if self.text is None:
            return
        if self.held():
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
        if self.handle is not None:
            self.handle.close()
        self.text = self.handle = None


def lock_run(
    root: str | os.PathLike,
    say=print,
    *,
    use_flock: bool = True,
    job_state: Callable[[str], str | None] = slurm_job_state,
) -> RunLock:
    """Take the run's lock in the checkpoint directory `root` (see the module docstring), or
    StreambackError naming the holder (its Slurm job, host and PID) and what to do."""
    path = Path(root) / layout.TRAINER_LOCK
    text = json.dumps(this_holder(), sort_keys=True) + "\n"
    for _ in range(10):
        if _create(path, text):
            break
        found = _read(path)
        if found is None:
            continue  # released in between
        alive, why = holder_alive(found[1], _flock_held(path, use_flock), job_state)
        if alive:
            raise StreambackError(held_message(path, found[1], why))
        if _take_over(path, found[0], text):
            say(f"took over {path}: its holder, {describe(found[1])}, is gone ({why})")
            break
    else:
        raise StreambackError(f"{path}: could not take the run's lock (it kept changing hands); rerun")
    handle = None
    if use_flock:
        handle = open(path)  # noqa: SIM115 (held open: the flock lasts as long as the file is open)
        try:  # blocking: the file is new, so only another process's look at it (_flock_held) holds it, briefly
            fcntl.flock(handle, fcntl.LOCK_EX)
        except OSError as err:  # no flock here (ENOLCK, ...): the exclusive file alone keeps trainers apart
            if err.errno not in (errno.ENOLCK, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                handle.close()
                raise
    return RunLock(path, text, handle)


def held_message(path: Path, stamp: dict | None, why: str) -> str:
    """The one line of a trainer refused because `stamp` holds the run."""
    stop = f"scancel {stamp['job']}" if stamp and stamp.get("job") else "kill it"
    return (
        f"another trainer is training this run: {path} is held by {describe(stamp)} ({why}). Two trainers on one run "
        f"would overwrite each other's checkpoints. Wait for it or stop it ({stop}), then rerun; if it is gone, "
        f"delete {path}"
    )


def wait_for_holder(
    root: str | os.PathLike,
    say=print,
    *,
    poll_s: float = 60,
    stopped: Callable[[], bool] = lambda: False,
    job_state: Callable[[str], str | None] = slurm_job_state,
) -> bool:
    """Wait while another Slurm job that Slurm says is running holds the run in `root` (a job that
    a restarted controller submitted again), polling every `poll_s` seconds; True once it is free
    or its holder is not such a job (the trainer then takes the lock, or is refused, itself),
    False if `stopped()` came first."""
    path = Path(root) / layout.TRAINER_LOCK
    told = False
    while True:
        found = _read(path)
        if found is None or found[1] is None or not found[1].get("job"):
            return True
        job = found[1]["job"]
        if job == this_holder().get("job") or (state := job_state(job)) not in LIVE_STATES:
            return True  # ended, or Slurm cannot be asked: the trainer judges the lock itself
        if not told:
            say(
                f"this run is held by {describe(found[1])} (job {job} is {state}), submitted by an earlier Snakemake: "
                "waiting for it "
                f"to end, then resuming from its newest checkpoint (scancel {found[1]['job']} to stop it now)"
            )
            told = True
        if stopped():
            return False
        time.sleep(poll_s)
        if stopped():
            return False
