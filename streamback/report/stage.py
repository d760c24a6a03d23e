"""`streamback study-report`: write results/study.html, the one page a reader opens first.

Reads what the stages wrote (streamback/layout.py) and the merged config; draws nothing that
its stage did not define (see `streamback.report.page`). A stage that has not run is named on the
page, so the command also runs on a partial study.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from streamback import layout
from streamback.config import DEFAULT_CONFIG, load_config, validate_config
from streamback.errors import StreambackError
from streamback.html_report import write_report
from streamback.report.page import Study, sections

HELP = "write results/study.html: what was run, the answer, and every stage's tables and figures on one page"
TITLE = "The Lost Accumulator, reproduced: residual-stream precision in Llama 3 training"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config", type=Path, default=None, help=f"config file of the study (default: {DEFAULT_CONFIG.name}); or:"
    )
    parser.add_argument("--config-json", default=None, help="the merged config as JSON (what the rule passes) ...")
    parser.add_argument(
        "--config-files", nargs="*", type=Path, default=None, help="... and the files it was merged from"
    )
    parser.add_argument("--out", type=Path, default=layout.STUDY_PAGE, help=f"the page (default: {layout.STUDY_PAGE})")


def timings() -> dict[str, list[Path]]:
    """Snakemake's benchmark records of every job, by rule: results/timing/<rule>/*.tsv."""
    if not layout.TIMING_DIR.is_dir():
        return {}
    return {d.name: sorted(d.glob("*.tsv")) for d in sorted(layout.TIMING_DIR.iterdir()) if d.is_dir()}


def run(args: argparse.Namespace) -> int:
    if args.config_json is not None:
        try:
            config = validate_config(json.loads(args.config_json))
        except json.JSONDecodeError as err:
            raise StreambackError(f"--config-json is not valid JSON: {err}") from None
        files = args.config_files or []
    else:
        files = [args.config or DEFAULT_CONFIG]
        config = load_config(files[0])
    study = Study(config, files, timings())
    write_report(args.out, TITLE, sections(study))
    print(f"study-report: wrote {args.out}")
    return 0
