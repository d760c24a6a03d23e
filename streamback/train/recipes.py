"""`streamback checkpoints`: each run's recipes (`recipe-<fingerprint>/` in its checkpoint
directory, one per recipe it was trained with), where each stands and how it differs from the one
in use; `--prune` deletes the recipes no longer in use (`streamback.train.checkpoint` writes and
reads the checkpoints themselves)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from streamback import layout
from streamback.errors import StreambackError
from streamback.io import remove, tree_bytes
from streamback.train.checkpoint import CORRUPT_PREFIX, STEP_NAME, CorruptCheckpoint, list_checkpoints, read_meta
from streamback.train.runlock import lock_run

HELP = "list each run's checkpoints by recipe and how the recipes differ; --prune removes those no longer in use"


@dataclass(frozen=True)
class Recipe:
    """One recipe directory of a run: its newest readable identity, its checkpoints' steps, bytes, last write."""

    path: Path
    identity: dict | None
    steps: list[int]
    bytes: int
    written: float

    def describe(self) -> str:
        total = (
            self.identity["tokens"] // (self.identity["batch_size"] * self.identity["seq_len"])
            if self.identity
            else None
        )
        steps = f"step {self.steps[-1]}" + (f" of {total}" if total else "") if self.steps else "no checkpoint"
        return (
            f"{self.path.name}  {steps}, {self.bytes / 1e6:,.1f} MB, written "
            f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(self.written))}"
        )


def run_recipes(checkpoints: str | os.PathLike) -> list[Recipe]:
    """The recipes in a run's checkpoint directory, oldest write first."""
    found = []
    for path in layout.recipe_dirs(checkpoints):
        steps = list_checkpoints(path)
        identity = None
        for _, step_dir in reversed(steps):
            with contextlib.suppress(CorruptCheckpoint):
                identity = read_meta(step_dir).get("identity")
                break
        size = tree_bytes(path)
        written = max([p.stat().st_mtime for _, p in steps] or [path.stat().st_mtime])
        found.append(Recipe(path, identity, [s for s, _ in steps], size, written))
    return sorted(found, key=lambda r: r.written)


def model_recipe(summary: Path) -> str | None:
    """The name of the recipe directory the run's model came from (its summary.json names the checkpoint), or None."""
    if not summary.is_file():
        return None
    return Path(json.loads(summary.read_text()).get("checkpoint", "")).parent.name or None


def recipe_in_use(recipes: list[Recipe], summary: Path) -> Path | None:
    """The recipe to keep: the one the run's model came from (its summary.json names the
    checkpoint), or, with no model (a run stopped midway), the one written last."""
    model = model_recipe(summary)
    named = [r.path for r in recipes if r.path.name == model]
    return named[0] if named else (recipes[-1].path if recipes else None)


def differences(identity: dict | None, reference: dict | None) -> str:
    """How `identity` differs from `reference`, key by key (dotted), e.g. "optimizer.lr 0.002 (in use: 0.003)"."""
    if identity is None or reference is None:
        return "its identity cannot be read"

    def flat(d, prefix=""):
        for key, value in d.items():
            yield from flat(value, f"{prefix}{key}.") if isinstance(value, dict) else [(f"{prefix}{key}", value)]

    mine, theirs = dict(flat(identity)), dict(flat(reference))
    changed = [
        f"{k} {mine.get(k)!r} (in use: {theirs.get(k)!r})"
        for k in sorted(mine.keys() | theirs.keys())
        if mine.get(k) != theirs.get(k)
    ]
    return "; ".join(changed) or "the same recipe"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "runs", nargs="*", metavar="RUN", help=f"runs to look at (default: every run in {layout.CHECKPOINTS_DIR})"
    )
    parser.add_argument(
        "--prune",
        action="store_true",
        help="delete the checkpoints of every recipe but the one the run's model came from (with no model: the one "
        "written last), and those written before recipes had directories; a run being trained is skipped",
    )


def run(args: argparse.Namespace) -> int:
    if args.runs:
        names = args.runs
    else:
        names = (
            sorted(p.name for p in layout.CHECKPOINTS_DIR.iterdir() if p.is_dir())
            if layout.CHECKPOINTS_DIR.is_dir()
            else []
        )
        if not names:
            print(f"no run has checkpoints in {layout.CHECKPOINTS_DIR}")
    freed = 0
    for name in names:
        checkpoints, summary = layout.checkpoint_dir(name), layout.summary_file(name)
        if not checkpoints.is_dir():
            raise StreambackError(f"run {name} has no checkpoint directory {checkpoints}")
        recipes = run_recipes(checkpoints)
        keep = recipe_in_use(recipes, summary)
        reference = next((r.identity for r in recipes if r.path == keep), None)
        outside = sorted(p for p in checkpoints.iterdir() if STEP_NAME.match(p.name.removeprefix(CORRUPT_PREFIX)))
        print(f"{name}: {len(recipes)} recipe(s) in {checkpoints}")
        for recipe in recipes:
            if recipe.path == keep:
                state = (
                    f"in use: the model of {summary}"
                    if recipe.path.name == model_recipe(summary)
                    else "in use: written last"
                )
            else:
                state = f"differs in {differences(recipe.identity, reference)}"
            print(f"  {recipe.describe()}; {state}")
        if outside:
            print(
                f"  {len(outside)} checkpoint(s) outside any recipe directory (written before checkpoints were kept "
                f"per recipe; "
                f"never resumed from): {', '.join(p.name for p in outside)}"
            )
        if not args.prune:
            continue
        try:
            lock = lock_run(checkpoints)
        except StreambackError as err:
            print(f"  not pruned: {err}")
            continue
        try:
            for path in [r.path for r in recipes if r.path != keep] + outside:
                size = tree_bytes(path)
                remove(path, checkpoints)
                freed += size
                print(f"  removed {path} ({size / 1e6:,.1f} MB)")
        finally:
            if lock is not None:
                lock.close()
    if args.prune:
        print(f"freed {freed / 1e6:,.1f} MB")
    return 0
