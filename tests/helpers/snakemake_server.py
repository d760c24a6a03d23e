"""`python -m snakemake ARGS` for the tests, each started by fork from one process that has imported Snakemake.

Most of a short Snakemake run (a dry run, a config that fails) is its start: importing Snakemake, its plugins and
what the Snakefile imports (docs/measurements.md). `SnakemakeServer` (the `run_snakemake` fixture's, one per
test process) starts this file as a process once: it imports them, then for each request forks a child that
runs `snakemake.cli.main(ARGS)` (what `python -m snakemake ARGS` runs) in the request's directory and
environment, its output going to the request's files. Each child starts from the same freshly imported state,
so nothing one Snakemake run does reaches the server or the next run; the child is a process group of its own,
so a timeout ends it with the jobs it started. What Snakemake takes from the process when it is imported is set
again in the child: the run directory (`Workflow._rundir`).

The protocol, one JSON object a line: the client writes {"argv", "cwd", "env", "stdout", "stderr"} to the
server's stdin; the server answers {"pid": ...} once the child runs, then {"returncode": ...} (negative: the
signal that ended it, as `subprocess` reports it).
"""

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
from pathlib import Path

# what every start imports before it plans a job: Snakemake's API and its executor plugins (the Slurm one asks
# Slurm for its configuration when it loads), and what the Snakefile and its rule files import
PRELOAD = (
    "snakemake.cli",
    "snakemake.api",
    "snakemake.workflow",
    "snakemake.dag",
    "snakemake.persistence",
    "snakemake.utils",
    "streamback.check",
    "streamback.config",
    "streamback.eval.taskdata",
    "streamback.jobs",
    "streamback.layout",
    "streamback.runs",
)


def serve() -> None:
    """Import PRELOAD, then answer requests on stdin until it closes; returns in each child, by SystemExit."""
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    from snakemake_interface_executor_plugins.registry import ExecutorPluginRegistry

    ExecutorPluginRegistry()  # loads every executor plugin, once, as each start would
    requests, answers = sys.stdin.buffer, sys.stdout
    while line := requests.readline():
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(request)  # never returns: raises SystemExit, which ends this (the child) process
        print(json.dumps({"pid": pid}), file=answers, flush=True)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}), file=answers, flush=True)


def _child(request: dict) -> None:
    """In the forked child: `python -m snakemake ARGV` in the request's directory, environment and files."""
    os.setsid()
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    for fd, path, flags in (
        (0, os.devnull, os.O_RDONLY),
        (1, request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
        (2, request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
    ):
        opened = os.open(path, flags, 0o644)
        os.dup2(opened, fd)
        os.close(opened)
    sys.stdin = open(os.devnull)  # noqa: SIM115  (the process's own stdin, as a subprocess's would be)
    import snakemake
    from snakemake.cli import main
    from snakemake.workflow import Workflow

    Workflow._rundir = str(Path.cwd().absolute())  # what snakemake.workflow takes when imported: the run directory

    sys.argv = [str(Path(snakemake.__file__).with_name("__main__.py")), *request["argv"]]  # as `python -m` sets it
    sys.path[0] = request["cwd"]  # `python -m` puts the working directory first
    main(request["argv"])  # exits: SystemExit(0 or 1), as under `python -m snakemake`
    raise SystemExit(0)


class SnakemakeServer:
    """The client: `run(args, cwd, timeout)` is `subprocess.run([python, -m, snakemake, *args], cwd=cwd,
    capture_output=True, text=True, timeout=timeout)`, through one server process (the module docstring)."""

    def __init__(self, scratch: Path):
        self.scratch = scratch
        self.lock = threading.Lock()
        self.calls = 0
        # unbuffered: `select` on the pipe sees every answer that `_answer` has not read
        self.process = subprocess.Popen(
            [sys.executable, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=scratch, bufsize=0
        )

    def _answer(self, timeout: float | None) -> dict | None:
        """The server's next line, or None if none comes within `timeout` seconds."""
        if timeout is not None and not select.select([self.process.stdout], [], [], timeout)[0]:
            return None
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the Snakemake server (pid {self.process.pid}) ended: exit {self.process.wait()}")
        return json.loads(line)

    def run(self, args: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess:
        with self.lock:
            self.calls += 1
            out, err = self.scratch / f"{self.calls}.out", self.scratch / f"{self.calls}.err"
            request = {"argv": args, "cwd": str(cwd), "env": dict(os.environ), "stdout": str(out), "stderr": str(err)}
            data = (json.dumps(request) + "\n").encode()
            while data:
                data = data[self.process.stdin.write(data) :]
            pid = self._answer(None)["pid"]
            answer = self._answer(timeout)
            cmd = [sys.executable, "-m", "snakemake", *args]
            if answer is None:  # as subprocess.run's timeout, and the jobs the run started end with it
                with contextlib.suppress(ProcessLookupError):  # it may have ended since
                    os.killpg(pid, signal.SIGKILL)
                self._answer(None)
                raise subprocess.TimeoutExpired(cmd, timeout, output=out.read_text(), stderr=err.read_text())
            result = subprocess.CompletedProcess(cmd, answer["returncode"], out.read_text(), err.read_text())
            out.unlink()
            err.unlink()
            return result

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=60)


if __name__ == "__main__":
    serve()
