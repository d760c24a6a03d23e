"""A run's checkpointing, apart from its loop: the resume policy (the newest checkpoint of the
run's recipe that passes its check, computed on the run's kernels unless
train.checkpoint.resume_on_other_kernels, at or before any snapshot step the recipe directory
lacks), saving with the run's record (recipe, elapsed seconds, kernels), and the snapshots of
eval.last_checkpoints; and before all that, the recipe's identity (`recipe_identity`) and
`claim_run`: the directories checked for writing and the run's lock taken. The files themselves are `streamback.train.checkpoint`'s."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from streamback import layout
from streamback.errors import StreambackError
from streamback.io import writable_dir
from streamback.model import compute
from streamback.model.weights import save_model
from streamback.train.checkpoint import TrainState, list_checkpoints, load_checkpoint, load_newest, save_checkpoint
from streamback.train.processes import Distributed
from streamback.train.runlock import lock_run


def recipe_identity(spec, model_args, cfg: dict, manifest: dict) -> dict:
    """The identity of run `spec`'s recipe, which its checkpoints must match and its recipe
    directory is named by: the model's arguments, the seeds, the token budget, batch, optimizer
    and schedule of the `train` section `cfg`, and the data (the token `manifest`'s fingerprint)."""
    return {
        "run": spec.name,
        "model_args": dataclasses.asdict(model_args),
        "seed": spec.data_seed,
        **({"init_seed": spec.init_seed} if spec.init_seed != spec.data_seed else {}),
        **{key: cfg[key] for key in ("tokens", "seq_len", "batch_size", "optimizer", "schedule")},
        "data": manifest["fingerprint"],  # what the data stage tokenized, and how
    }


def snapshot_steps_of(requested, steps: int) -> list[int]:
    """The snapshot steps `requested` (--snapshot-steps) of a run of `steps` steps, sorted and
    unique; StreambackError naming any outside (0, steps)."""
    outside = [s for s in requested if not 0 < s < steps]
    if outside:
        raise StreambackError(
            f"--snapshot-steps {' '.join(map(str, outside))}: a snapshot step lies between 0 "
            f"and the run's {steps} steps (the final model is written anyway)"
        )
    return sorted(set(requested))


def claim_run(env: Distributed, checkpoints: Path, outdir: Path, say: Callable[[str], None]):
    """Before a run's first step, found on every rank (StreambackError): the checkpoint directory
    `checkpoints` writable (every rank writes checkpoints), the output directory `outdir` too
    (rank 0 writes the outputs), and the run's lock taken by rank 0 (a second trainer on the run
    is refused, naming the Slurm job, host and PID of the first: `streamback.train.runlock`).
    Returns the lock, to close when the run ends (a RunLock; None on the other ranks)."""
    env.agree(_error_of(writable_dir, checkpoints, "checkpoint directory"), "the checkpoint directory check")
    env.agree(
        _error_of(writable_dir, outdir, "output directory", keep=False) if env.rank == 0 else None,
        "the output directory check",
    )
    lock, error = None, None
    if env.rank == 0:
        try:
            lock = lock_run(checkpoints, say)
        except StreambackError as err:
            error = str(err)
    try:
        env.agree(error, "locking the run")
    except StreambackError:
        if lock is not None:
            lock.close()
        raise
    return lock


def _error_of(check, *args, **kwargs) -> str | None:
    """The message of the StreambackError `check(*args, **kwargs)` raises, or None."""
    try:
        check(*args, **kwargs)
    except StreambackError as err:
        return str(err)
    return None


class CheckpointManager:
    """The checkpoints of one run's recipe (`recipe_dir`): `resume`, `save`, `restore`, and the
    model files (`write_model`, `snapshot`). `kernels`: what this process computes on, as the
    run's records name it; `say`: a line in the run's log."""

    def __init__(
        self,
        run: str,
        recipe_dir: Path,
        state: TrainState,
        identity: dict,
        kernels: str,
        checkpoint_cfg: dict,
        snapshot_steps: list[int],
        env: Distributed,
        say: Callable[[str], None],
    ):
        self.run, self.recipe_dir, self.state, self.identity = run, recipe_dir, state, identity
        self.kernels, self.checkpoint_cfg, self.snapshot_steps = kernels, checkpoint_cfg, snapshot_steps
        self.env, self.say = env, say
        self.kernel_changes: list[dict] = []  # {"step", "from", "to"} of each resume onto other kernels

    def kernel_record(self) -> dict:
        """The kernels the run computes on, and each change of them at a resume (for its records)."""
        return {"kernels": self.kernels, "kernel_changes": self.kernel_changes}

    def resume(self) -> tuple[int, float]:
        """(step, elapsed seconds) of the newest checkpoint that passes its check, now loaded; (0, 0) if none."""

        def accept(path, meta):
            changed = sorted(k for k in self.identity if meta.get("identity", {}).get(k) != self.identity[k])
            if changed:
                raise StreambackError(
                    f"checkpoint {path} belongs to another recipe ({', '.join(changed)} differ from this config) but "
                    f"lies in this recipe's directory {self.recipe_dir}: move it out"
                )
            self._accept_kernels(path, meta)

        saved = list_checkpoints(self.recipe_dir)
        newest = saved[-1][0] if saved else 0
        missing = [
            s for s in self.snapshot_steps if s < newest and not layout.snapshot_stash(self.recipe_dir, s).is_file()
        ]
        meta = load_newest(
            self.recipe_dir, self.state, accept=accept, say=self.say, at_most=min(missing) if missing else None
        )
        if missing and meta is None:
            raise StreambackError(
                f"run {self.run} lacks the model of step(s) {', '.join(map(str, missing))} that "
                f"eval.last_checkpoints asks for (it was trained before they were asked for), and {self.recipe_dir} "
                f"keeps no checkpoint at or before step {min(missing)} to train them again from: delete "
                f"{self.recipe_dir} to train the run again, or change eval.last_checkpoints / checkpoint_spacing"
            )
        if missing:
            self.say(
                f"resuming from step {meta['step']}, before step(s) {', '.join(map(str, missing))} whose model "
                "eval.last_checkpoints asks for and this recipe directory lacks: training to the end writes them"
            )
        return (0, 0.0) if meta is None else (meta["step"], float(meta.get("elapsed_s", 0.0)))

    def _accept_kernels(self, path: Path, meta: dict) -> None:
        """Refuse a checkpoint trained on other kernels (StreambackError naming both and the setting
        that allows it) unless train.checkpoint.resume_on_other_kernels; keep its record of changes."""
        theirs = meta.get("kernels")  # None: written before checkpoints recorded their kernels
        self.kernel_changes = list(meta.get("kernel_changes", []))
        if theirs is None or theirs == self.kernels:
            return
        if not self.checkpoint_cfg["resume_on_other_kernels"]:
            raise StreambackError(
                f"checkpoint {path} was trained on {theirs}, but this process computes on {self.kernels} (cpu_bf16 "
                f"{compute.mode()}): set cpu_bf16 to match it, or train.checkpoint.resume_on_other_kernels: true to "
                f"resume anyway"
            )
        self.say(
            f"resuming checkpoint {path}, trained on {theirs}, on {self.kernels} "
            f"(train.checkpoint.resume_on_other_kernels)"
        )
        self.kernel_changes.append({"step": meta["step"], "from": theirs, "to": self.kernels})

    def save(self, directory: Path, step: int, keep: int, elapsed: float) -> Path:
        """Checkpoint the model and optimizer as of step `step` into `directory` (a collective),
        with the recipe, `elapsed` seconds and the kernels, keeping the newest `keep`; returns it."""
        meta = {"identity": self.identity, "elapsed_s": elapsed, "world_size": self.env.world_size}
        return save_checkpoint(directory, step, self.state, {**meta, **self.kernel_record()}, keep=keep)

    def restore(self, path: Path) -> dict:
        """Load the model and optimizer of the checkpoint `path` (a collective); returns its meta."""
        return load_checkpoint(path, self.state)

    def write_model(self, path: Path, step: int, model_args, manifest: dict) -> None:
        """The model as it is now (fp32, unsharded; a collective) to `path` (rank 0), with its corpus
        (the token manifest's fingerprint and tokenizer) and step."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        model = self.state.model
        state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if self.env.rank == 0:
            data = {"fingerprint": manifest["fingerprint"], "tokenizer_sha256": manifest["tokenizer"]["sha256"]}
            save_model(path, model_args, state, model.compute_dtype, step=step, data=data)

    def snapshot(self, step: int, model_args, manifest: dict) -> None:
        """Keep the model of snapshot step `step` in the recipe directory."""
        stash = layout.snapshot_stash(self.recipe_dir, step)
        self.write_model(stash, step, model_args, manifest)
        self.say(f"step {step}: kept the model for eval.last_checkpoints in {stash}")

    def snapshot_at_start(self, start_step: int, model_args, manifest: dict) -> None:
        """Before the first step: the snapshot of the resumed step itself, if it is one and not kept yet
        (`resume` resumes at or before every snapshot step the recipe directory lacks)."""
        if start_step in self.snapshot_steps and not layout.snapshot_stash(self.recipe_dir, start_step).is_file():
            self.snapshot(start_step, model_args, manifest)
