"""The one command-line entry point: `streamback <stage> [options]`, one subcommand per stage.

Each stage module defines `HELP` (one line), `add_arguments(parser)` and `run(args)`. Only the
chosen stage's module is imported, so `streamback drift` does not pay for torch.distributed,
datasets or lm-eval imports it does not use. A stage that runs model code (MODEL_STAGES) runs
inside its process's execution (threads, CPU kernel path, device: streamback.model.execution),
decided here once from the job's config and handed to it as `args.execution_context`; the
previous one comes back when it returns, so an in-process caller leaves nothing behind. Its Hub
access (streamback.data.hubcache: the config's cache, offline for every stage but `fetch`) is
decided here too, before the stage's module is imported, handed to it as `args.hub_access` and
given back the same way.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import errno
import importlib
import importlib.util
import logging
import os
import sys
import textwrap
from pathlib import Path
from typing import NoReturn

from streamback.data import hubcache
from streamback.errors import DiskFull, StreambackError
from streamback.progress import plain_logs

COMMANDS = {
    "check": "streamback.check",
    "plan": "streamback.plan",
    "fetch": "streamback.fetch.stage",
    "drift": "streamback.drift.stage",
    "corpus": "streamback.data.generate",
    "tokenize": "streamback.data.tokenize",
    "preflight": "streamback.preflight.stage",
    "preflight-table": "streamback.preflight.table",
    "train": "streamback.train.stage",
    "train-attempt": "streamback.train.attempt",
    "checkpoints": "streamback.train.recipes",
    "training-curves": "streamback.train.curves",
    "seed-variance": "streamback.report.seeds",
    "depth": "streamback.report.depth",
    "study-report": "streamback.report.stage",
    "export-hf": "streamback.model.export_hf",
    "bench": "streamback.measure.bench",
    "memory": "streamback.measure.memory",
    "analyze": "streamback.analysis.stage",
    "import-hf": "streamback.model.import_hf",
    "eval-tasks": "streamback.eval.taskdata",
    "evaluate": "streamback.eval.stage",
    "benchmark-table": "streamback.eval.tables",
}

# the stages that run model code: each computes on the execution cli.main decides for it
MODEL_STAGES = ("preflight", "train", "export-hf", "bench", "memory", "analyze", "import-hf", "evaluate")


class HelpFormatter(argparse.HelpFormatter):
    """argparse's, with every option's default shown, unless its help says it already, it has none
    (None, an empty list) or it is a flag; lines never break inside a hyphenated name or path."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (
            not action.option_strings
            or action.nargs == 0
            or "default" in text
            or default in (None, [], argparse.SUPPRESS)
        ):
            return text
        return f"{text} (default: %(default)s)"


def stage_help(module_name: str) -> str:
    """A stage module's HELP line, read from its source: listing the stages imports none of them."""
    tree = ast.parse(Path(importlib.util.find_spec(module_name).origin).read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "HELP" for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError(f"{module_name} defines no HELP")


def _parser(command: str | None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="streamback", description=__doc__.splitlines()[0], formatter_class=HelpFormatter
    )
    sub = parser.add_subparsers(dest="command", metavar="<stage>", required=True)
    for name, module_name in COMMANDS.items():
        if name == command:
            module = importlib.import_module(module_name)
            module.add_arguments(
                sub.add_parser(name, help=module.HELP, description=module.HELP, formatter_class=HelpFormatter)
            )
        else:  # listed with its line; its options are parsed only when it is the one asked for
            sub.add_parser(name, help=stage_help(module_name) if command is None else None)
    return parser


def parse(argv: list[str]) -> argparse.Namespace:
    """A command line's arguments (`<stage> [options]`), as `main` parses them: argparse's exit on a bad one."""
    command = next((a for a in argv if not a.startswith("-")), None)
    return _parser(command if command in COMMANDS else None).parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    plain_logs()  # before the stage's module imports torch, whose torch.hub imports tqdm
    command = next((a for a in argv if not a.startswith("-")), None)
    access = hub_access(command, argv)  # before any Hugging Face library is imported
    with hubcache.applied(access):
        return _main(argv, command, access)


def hub_access(command: str | None, argv: list[str]) -> hubcache.HubAccess:
    """The process's Hub access: from the config file a stage is given (`--config FILE`: a hand run
    reads the cache its rule's job reads, if that config reads the Hub), else from the job's
    STREAMBACK_HUB_CACHE (hubcache.for_command). A config file that cannot be read is left to the
    stage, which names it."""
    config_file = next(
        (argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--config"),
        next((a.partition("=")[2] for a in argv if a.startswith("--config=")), None),
    )
    if config_file is None:
        return hubcache.for_command(command)
    from streamback.config import read_config_file, validate_config
    from streamback.eval.taskdata import LOCAL_TASKS

    try:
        config = validate_config(read_config_file(config_file))
    except (StreambackError, OSError):
        return hubcache.for_command(command)
    if not hubcache.hub_reads(config, LOCAL_TASKS):
        return hubcache.HubAccess(None, offline=False)
    return hubcache.for_command(command, {hubcache.ENV: config["hub_cache"]})


def _main(argv: list[str], command: str | None, access: hubcache.HubAccess) -> int:
    try:  # a stage whose module cannot run here says so at import (e.g. a torch without a name it needs)
        args = parse(argv)
        module = importlib.import_module(COMMANDS[args.command])
    except StreambackError as err:
        print(f"streamback {command}: error: {err}", file=sys.stderr)
        return 2
    args.hub_access = access
    status = None
    try:
        with stage_execution(args):
            status = int(module.run(args) or 0)
        return status
    except (StreambackError, OSError) as err:  # the expected faults, one line each; any other is a bug: its traceback
        message = expected_fault(err)
        if message is None:
            raise
        print(f"streamback {args.command}: error: {message}", file=sys.stderr)
        status = 2
        return status
    except KeyboardInterrupt:
        print(f"streamback {args.command}: interrupted", file=sys.stderr)
        status = 130
        return status
    finally:
        write_status(args, status)


def write_status(args: argparse.Namespace, status: int | None) -> None:
    """The exit status to the stage's `--status-file`, if it has one (train: for launchers such as
    torchrun that report their own), from rank 0; none for a bug's traceback (status None)."""
    path = getattr(args, "status_file", None)
    if path is None or status is None or int(os.environ.get("RANK", "0")) != 0:
        return
    from streamback.io import write_text

    with contextlib.suppress(OSError):
        write_text(path, f"{status}\n")


def execution_of(args: argparse.Namespace):
    """The execution (streamback.model.execution.Execution) a stage's parsed arguments run on, as
    its workflow job gets it, or None for a stage that runs no model code. A stage module's
    `default_threads(args)` gives its threads where `--threads` is not given."""
    if args.command not in MODEL_STAGES:
        return None
    from streamback.model import execution

    default_threads = getattr(importlib.import_module(COMMANDS[args.command]), "default_threads", None)
    return execution.from_args(args, default_threads(args) if default_threads else None)


@contextlib.contextmanager
def stage_execution(args: argparse.Namespace):
    """Decide the stage's execution (`args.execution_context`) and apply it around the block;
    a stage that runs no model code runs as it is."""
    args.execution_context = execution_of(args)
    if args.execution_context is None:
        yield
        return
    from streamback.model import execution

    with execution.applied(args.execution_context):
        yield


# OS errors a user meets and fixes (a full disk or quota, permissions, a read-only filesystem): a line, not a traceback
EXPECTED_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS)


def expected_fault(err: BaseException) -> str | None:
    """The one line the CLI prints for an expected fault, or None for a bug."""
    if isinstance(err, StreambackError):
        return str(err)
    if not isinstance(err, OSError) or err.errno not in EXPECTED_ERRNOS:
        return None
    where = err.filename or "a file the system does not name"
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        return str(DiskFull(where))
    return f"{err.strerror}: {where}"


def exit_with(status: int | str | None) -> NoReturn:
    """End `python -m streamback` with `status`, as sys.exit would. A torchrun worker (WORLD_SIZE > 1: its stage
    has done its work, written its outputs and the status file, and torn its process group down) ends with
    os._exit after flushing what it printed: the interpreter's finalization is skipped. There gloo's worker
    threads may still run (destroy_process_group drops only c10d's own references to the group; another
    object, such as FSDP2's device mesh, may keep it alive), and one that asks for the GIL is ended by CPython
    mid-C++ frame, which aborts the process ("terminate called without an active exception", SIGABRT) after
    a run that passed (pytorch/pytorch#179291; torch has no ProcessGroupGloo shutdown,
    pytorch/pytorch#130345). docs/reliability.md says more."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        sys.exit(status)
    if isinstance(status, str):  # sys.exit's meaning: the message on stderr, status 1
        print(status, file=sys.stderr)
    code = 0 if status is None else status if isinstance(status, int) else 1
    logging.shutdown()  # what atexit would have flushed
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_with(main())
