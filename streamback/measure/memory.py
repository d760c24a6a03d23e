"""`streamback memory`: peak memory of a training step (forward + backward), estimated on the CPU.

The model is built on the meta device and materialised as fake tensors (`FakeTensorMode`:
shapes, dtypes and storages, no data and no arithmetic), then one forward + backward with
cross-entropy on `batch` x `seq_len` tokens runs under torch's `MemTracker`, which follows the
lifetime of every storage an operator allocates. Its peak is what a GPU's
`torch.cuda.max_memory_allocated` reports for the same eager step (`streamback bench`, no
optimizer step), up to the CUDA caching allocator's rounding of each block to 512 bytes and
library workspaces; a paper-size shape takes seconds on a laptop.

The peak is split by what holds the memory at that moment: parameters (fp32 masters), buffers
(the RoPE tables), gradients, activations (allocated on the forward pass and still alive: what autograd keeps for
the backward pass, e.g. the residual stream, bf16 weight copies, the loss's softmax) and
temporaries (allocated on the backward pass: gradients of activations in flight). The
reversible stream is included: its saved-tensor hooks run on fake tensors as on real ones.
At the study's sizes the peak falls at the loss, before any weight gradient exists (the fp32
logits and their softmax: 2 x 3.9 GiB at 4 x 2048 tokens and 128,256 words); with few tokens it
moves to the end of the backward pass, where all gradients are held.

Eager only: a compiled block allocates inside Inductor's generated code, out of a dispatch
mode's sight, and Inductor's partitioner chooses for itself what to save, so the compiled
step's memory is measured on a GPU (`streamback bench`), not estimated here.

Writes `--out` (JSON) and a Markdown table beside it (.md), atomically, and prints the table.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from streamback import layout
from streamback.config import load_config
from streamback.io import markdown_table as table_of
from streamback.io import write_json, write_text
from streamback.measure.step import (
    GPU_SHAPES,
    VARIANTS,
    add_step_arguments,
    fake_training_step,
    model_args,
    parse_names,
    require_positive,
)

HELP = "estimate the peak memory of a training step per shape x block, on the CPU (fake tensors)"
GIB = 2**30
_CATEGORIES = {"PARAM": "params", "BUFFER": "buffers", "GRAD": "grads", "ACT": "activations", "TEMP": "temporaries"}


def _step_peak_tracker():
    """torch's MemTracker, keeping only the step's peak.

    MemTracker also keeps every module's own peak, updated after every operator by a walk over
    all modules seen so far: quadratic in depth, minutes for the 80-layer shape.
    """
    from torch.distributed._tools.mem_tracker import MemTracker

    class StepPeakTracker(MemTracker):
        def _update_peak_stats(self, peak_state) -> None:
            for dev, snapshot in self._curr_mem_snap.items():
                if self._peak_mem.get(dev, 0) < snapshot["Total"]:
                    self._peak_mem[dev] = snapshot["Total"]
                    self._peak_mem_snap[dev] = dict(snapshot)

    return StepPeakTracker()


def estimate_step_memory(
    margs, batch: int, seq_len: int, compute_dtype: torch.dtype = torch.bfloat16
) -> dict[str, int]:
    """Peak bytes of one eager forward + backward of `Transformer(margs)`: `{"peak": total,
    "params": ..., "buffers": ..., "grads": ..., "activations": ..., "temporaries": ...}`, the
    categories as they stood at the peak (activations include the input tokens)."""
    tracker = _step_peak_tracker()

    def watch(model):
        tracker.track_external(model)
        return tracker

    fake_training_step(margs, batch, seq_len, watch, compute_dtype)
    (snapshot,) = tracker.get_tracker_snapshot("peak").values()
    out = {"peak": snapshot["Total"]}
    for kind, nbytes in snapshot.items():
        name = getattr(kind, "name", kind)
        if name in _CATEGORIES:
            out[_CATEGORIES[name]] = nbytes
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_step_arguments(parser)
    parser.add_argument("--shapes", default=GPU_SHAPES, help=f"comma-separated shape names (default: {GPU_SHAPES})")
    parser.add_argument(
        "--out", type=Path, default=layout.MEMORY_FILE, help="JSON output; the table goes beside it as .md"
    )


def run(args: argparse.Namespace) -> int:
    require_positive(args, ("batch", "seq_len", "vocab_size"))
    model_cfg = load_config(args.config)["model"]
    shapes = parse_names(args.shapes, model_cfg["shapes"], "shapes")
    variants = parse_names(args.variants, VARIANTS, "variants")
    rows = []
    for shape in shapes:
        for variant in variants:
            margs = model_args(model_cfg, shape, variant, args.vocab_size)
            row = {"shape": shape, "variant": variant, **estimate_step_memory(margs, args.batch, args.seq_len)}
            rows.append(row)
            print(f"{shape} {variant}: {row['peak'] / GIB:.3f} GiB", flush=True)
    result = {"batch": args.batch, "seq_len": args.seq_len, "vocab_size": args.vocab_size, "rows": rows}
    table = markdown_table(result)
    write_json(args.out, result)
    write_text(args.out.with_suffix(".md"), table)
    print(table)
    return 0


def table(result: dict) -> tuple[tuple[str, ...], list[list]]:
    """The table's header and rows of text cells (GiB), as memory.md and the study page show them."""
    cells = []
    for row in result["rows"]:
        base = next((r for r in result["rows"] if r["shape"] == row["shape"] and r["variant"] == "baseline"), None)
        diff = "" if base is None else f"{(row['peak'] - base['peak']) / GIB:+.3f}"
        cells.append(
            [row["shape"], row["variant"], f"{row['peak'] / GIB:.3f}", diff]
            + [f"{row.get(k, 0) / GIB:.3f}" for k in ("params", "activations", "temporaries")]
        )
    return ("shape", "variant", "peak", "vs baseline", "params", "activations", "temporaries"), cells


def markdown_table(result: dict) -> str:
    head = (
        f"Estimated peak memory (GiB) of an eager training step (forward + backward, bf16 compute, fp32 "
        f"master weights, no optimizer), micro-batch {result['batch']} x {result['seq_len']}, vocabulary "
        f"{result['vocab_size']}; fake tensors under torch's MemTracker.\n\n"
    )
    return head + table_of(*table(result))
