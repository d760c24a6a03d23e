"""The one command-line entry point: `streamback <stage> [options]`, one subcommand per stage.

Each stage module defines `HELP` (one line), `add_arguments(parser)` and `run(args)`. Only the
chosen stage's module is imported, so `streamback drift` does not pay for torch.distributed,
datasets or lm-eval imports it does not use.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from streamback.errors import StreambackError

COMMANDS = {
    "check": "streamback.config",
    "drift": "streamback.drift.stage",
    "corpus": "streamback.data.generate",
    "tokenize": "streamback.data.tokenize",
    "train": "streamback.train.trainer",
    "checkpoints": "streamback.train.checkpoint",
    "training-curves": "streamback.train.curves",
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


def _parser(command: str | None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="streamback", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="<stage>", required=True)
    for name, module_name in COMMANDS.items():
        if name == command:
            module = importlib.import_module(module_name)
            module.add_arguments(sub.add_parser(name, help=module.HELP, description=module.HELP))
        else:
            sub.add_parser(name, help=f"(see `streamback {name} --help`)")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    args = _parser(command if command in COMMANDS else None).parse_args(argv)
    module = importlib.import_module(COMMANDS[args.command])
    try:
        return int(module.run(args) or 0)
    except StreambackError as err:
        print(f"streamback {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
