"""An optional Weights & Biases sink behind the metrics log (`MetricsLog`'s mirrors, beside
TensorBoard), on when `train.log.wandb` names a project: every record that goes to metrics.jsonl
is logged at its step, under the names TensorBoard uses (`train/<key>`, `<key>/<layer>`,
`<key>/<name>`; `streamback.train.tensorboard.scalars`).

The W&B run's id is the run's and its recipe's (`<run>-<recipe fingerprint>`), and it is opened
with `resume="allow"`, so a resumed run appends to the same W&B run rather than starting another;
its files go to the recipe's checkpoint directory (`wandb/` there). W&B keeps a run's steps
increasing, so the steps an interrupted attempt logged after its last checkpoint are not logged
again (they held the same values; metrics.jsonl is the record). `mode` is W&B's: online,
offline (a local run directory, `wandb sync` uploads it later) or disabled. wandb is not a
dependency: it is imported only when the sink is on.
"""

from __future__ import annotations

from pathlib import Path

from streamback.errors import StreambackError
from streamback.train.tensorboard import scalars


def open_run(settings: dict, run_id: str, name: str, directory: Path, config: dict):
    """A `WandbWriter` of W&B run `run_id` (created, or resumed if it exists) per `settings`
    (train.log.wandb); StreambackError in one line if wandb is not installed."""
    try:
        import wandb  # optional: only a run with train.log.wandb needs it
    except ImportError:
        raise StreambackError(
            "train.log.wandb.project is set but the wandb package is not installed: pip install wandb, "
            "or set train.log.wandb.project to null"
        ) from None
    directory.mkdir(parents=True, exist_ok=True)
    run = wandb.init(
        project=settings["project"],
        entity=settings["entity"],
        mode=settings["mode"],
        id=run_id,
        name=name,
        resume="allow",
        dir=str(directory),
        config=config,
    )
    return WandbWriter(run)


class WandbWriter:
    """Logs metrics records to a W&B run (see the module docstring)."""

    def __init__(self, run):
        self.run = run

    def write(self, record: dict) -> None:
        step = record["step"]
        self.run.log(dict(scalars(record)), step=step)

    def flush(self) -> None:
        pass  # W&B's service writes as it goes

    def close(self) -> None:
        self.run.finish()
