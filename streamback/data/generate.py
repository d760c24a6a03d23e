"""`streamback corpus`: write the synthetic corpus as parquet files with FineWeb's columns
(rule `corpus`, into results/corpus/<corpus>/), one file per worker task."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from streamback import layout
from streamback.config import add_config_arguments, section_from_args
from streamback.data import worker_pool
from streamback.data.corpus import part_ranges, write_part
from streamback.errors import StreambackError
from streamback.io import output_dir

HELP = "write the synthetic corpus (a probabilistic English grammar) as FineWeb-style parquet"


def generate(data: dict, out_dir: str | Path | None = None, processes: int = 1) -> list[Path]:
    """Write the parts of the synthetic corpus; returns their paths."""
    synthetic = data["synthetic"]
    paths = layout.corpus_files(data)
    if out_dir is not None:
        paths = [Path(out_dir) / p.name for p in paths]
    tasks = [(synthetic["seed"], a, b, p) for (a, b), p in zip(part_ranges(synthetic["documents"], len(paths)), paths)]
    with output_dir(paths[0].parent, "corpus directory"):  # checked before any work
        if processes > 1:
            with worker_pool(min(processes, len(tasks))) as pool:
                pool.starmap(write_part, tasks)
        else:
            for task in tasks:
                write_part(*task)
    return paths


def add_arguments(parser) -> None:
    add_config_arguments(parser, "data")
    parser.add_argument("--out", type=Path, default=None, help="output directory (default: results/corpus/<corpus>)")
    parser.add_argument("--processes", type=int, default=None, help="worker processes (default: data.processes)")


def run(args) -> int:
    data = section_from_args(args, "data")
    processes = data["processes"] if args.processes is None else args.processes
    if processes < 1:
        raise StreambackError(f"--processes must be at least 1, got {processes}")
    t0 = time.monotonic()
    paths = generate(data, args.out, processes)
    print(
        f"corpus: wrote {data['synthetic']['documents']} documents to {len(paths)} files in {paths[0].parent} "
        f"in {time.monotonic() - t0:.1f} s",
        file=sys.stderr,
    )
    return 0
