"""`streamback train`: train one run of the matrix, from one CPU process to many GPUs and nodes.

One process (`python -m streamback train ...`) trains on the CPU or one GPU; under `torchrun`
every process takes a share of each global batch and the model is sharded with FSDP2
(`streamback.train.parallel.apply_fsdp`: bf16 parameters for compute, fp32 master weights, AdamW state
and gradient reduction; the stream keeps its format). The recipe - AdamW, warmup-stable-decay,
gradient clipping, a global batch reached by gradient accumulation - is the `train` section; what
is trained is `model.shapes[shape]` with the run's block and stream (`streamback.runs`).

Resumable and reproducible: batches (`streamback.train.batches`) and the random numbers of stochastic
rounding (reseeded every step from (seed, step, rank)) depend only on the step, so a run resumed
from a checkpoint computes what an uninterrupted one would. Checkpoints are kept per recipe (model
arguments, seed, token budget, batch, optimizer, schedule and data: the run's identity), in
`recipe-<fingerprint>/` under the run's checkpoint directory, so a changed recipe trains from its
own first step and never meets, or removes, another recipe's checkpoints (`streamback checkpoints`
lists and prunes them). A run starts from the newest complete checkpoint of its recipe that passes
its content hashes, if there is one (a corrupt one is named and set aside); it saves one every
`checkpoint.every` steps and at the end (`streamback.train.checkpoint`: atomic, hashed, the last K
kept). A recipe trained to its end resumes at its end and writes the same outputs again.

`--snapshot-steps` (the rule's, from eval.last_checkpoints: `streamback.runs.snapshot_steps`):
the model at each of these earlier steps is written as the final one is (`weights.save_model`),
kept in the recipe directory (`snapshots/`, so a failed or requeued job keeps it) and, at the end,
put into the output directory as last/step_<N>.pt. A run whose newest checkpoint lies after such
a step whose snapshot it lacks (trained before it was asked for) resumes from its newest
checkpoint before that step, and so writes the snapshot and the same final model again; without
one it is refused before its first step, naming what to delete.

Before the first step, in this order: every run setting is checked (`streamback.runs.check_runs`),
the output and checkpoint directories are checked for writing, the run's checkpoint directory is
locked (a second trainer on the run is refused, naming the PID and host of the first), and every
token shard is verified against the manifest - sha256 and vocabulary bound, the ranks sharing the
hashing - except those the run's verification record (`verified-shards.json` in the checkpoint
directory) vouches for, whose files have not changed since this run hashed them.

Exit statuses:
- 0: done; the final model, metrics and summary are in the output directory.
- 75 (EX_TEMPFAIL, "try again"): stopped by SIGTERM or SIGUSR1 after saving a checkpoint of the
  last completed step. Slurm sends SIGTERM at the time limit and on preemption (then SIGKILL
  after KillWait), and SIGUSR1 ahead of time with `sbatch --signal=USR1@<seconds>`. The signal is
  acted on at the next step boundary (all ranks agree on it in the all-reduce that already
  averages each step's loss), so the grace time must cover one step plus one save. Slurm
  requeues a preempted job submitted with --requeue (the profile's `slurm-requeue`), Snakemake
  resubmits a failed one (`retries`), and a site may add 75 to slurm.conf's RequeueExit; each
  way the rerun resumes from this checkpoint. torchrun reports a worker's failure as 1 whatever
  its status: with `--status-file` cli.main also writes the status there, and the rule's
  shell exits with it.
- 3: the loss or the gradient norm was NaN or infinite. Nothing of that step is applied or
  saved; the newest checkpoint is the last good state.
- 2: bad input (config, data, checkpoint), reported before training starts where possible.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import signal
import sys
import time
from pathlib import Path

import numpy as np
import torch

from streamback import layout
from streamback.data.shards import TokenDataset, verify_datasets
from streamback.errors import StreambackError
from streamback.io import writable_dir
from streamback.model import compute
from streamback.model.model import ModelArgs, Transformer, count_params
from streamback.progress import Progress
from streamback.runs import (
    RunSpec,
    check_runs,
    data_passes,
    is_reversible,
    run_matrix,
    run_setting,
    token_budget_problem,
    train_steps,
)
from streamback.train.batches import num_windows, rank_micro_batches, read_windows, train_windows, val_windows
from streamback.train.checkpoint import TrainState, lock_run, recipe_fingerprint, remove_partial
from streamback.train.checkpointing import CheckpointManager
from streamback.train.metrics import MetricsLog
from streamback.train.parallel import StreamDtypeWatch, apply_activation_checkpointing, apply_compile, apply_fsdp
from streamback.train.processes import Distributed, StopRequest
from streamback.train.schedule import wsd_lr
from streamback.train.signals import StreamRecord, shadow_format
from streamback.train.summary import summary_record, write_outputs
from streamback.train.tensorboard import open_writer
from streamback.train.validation import window_losses
from streamback.train.wandb_sink import open_run as open_wandb
from streamback.train.watch import Watch

EXIT_DIVERGED = 3
EXIT_REQUEUE = 75  # sysexits.h EX_TEMPFAIL


def train(
    train_cfg: dict, model_cfg: dict, run_name: str, data_dir, outdir, checkpoints, tensorboard=None, snapshot_steps=()
) -> int:
    """Train `run_name` to its end or to a stop signal; returns the exit status (see the docstring).
    `tensorboard`: the run's TensorBoard directory (None: no event files); `snapshot_steps`: the
    earlier steps whose models it also writes (eval.last_checkpoints)."""
    check_runs(train_cfg, model_cfg, processes=int(os.environ.get("WORLD_SIZE", "1")), only=run_name)
    env = Distributed.start()
    outdir, checkpoints, lock = Path(outdir), Path(checkpoints), None
    try:
        # found now, not after the last step: every rank writes checkpoints, rank 0 the outputs
        env.agree(_error_of(writable_dir, checkpoints, "checkpoint directory"), "the checkpoint directory check")
        env.agree(
            _error_of(writable_dir, outdir, "output directory", keep=False) if env.rank == 0 else None,
            "the output directory check",
        )
        error = None
        if env.rank == 0:  # rank 0 holds the run's lock (an open file) while it trains
            try:
                lock = lock_run(checkpoints, lambda message: _say(run_name, message))
            except StreambackError as err:
                error = str(err)
        env.agree(error, "locking the run")
        board = Path(tensorboard) if tensorboard is not None and train_cfg["log"]["tensorboard"] else None
        trainer = Trainer(
            run_matrix(train_cfg)[run_name],
            train_cfg,
            model_cfg,
            Path(data_dir),
            outdir,
            checkpoints,
            env,
            tensorboard=board,
            snapshot_steps=snapshot_steps,
        )
        return trainer.fit()
    finally:
        if lock is not None:
            lock.close()
        env.close()


def _say(run_name: str, message: str) -> None:
    print(f"[{run_name}] {message}", file=sys.stderr, flush=True)


class Diverged(Exception):
    """The loss or gradient norm of a step is NaN or infinite."""


def _seed(*parts: int) -> int:
    """A 63-bit seed for torch from integers (seed, step, rank, purpose), well mixed by numpy."""
    return int(np.random.SeedSequence(list(parts)).generate_state(1, dtype=np.uint64)[0] >> np.uint64(1))


def adamw(params, opt: dict) -> torch.optim.AdamW:
    """The optimizer of `train.optimizer` over `params`: AdamW, fused (one kernel per parameter
    group on CUDA and the CPU alike; on the CPU faster than foreach in a tiny step)."""
    return torch.optim.AdamW(
        params, lr=opt["lr"], betas=tuple(opt["betas"]), eps=opt["eps"], weight_decay=opt["weight_decay"], fused=True
    )


def clip_gradients(params, opt: dict) -> torch.Tensor:
    """Clip the gradients' global norm to `train.optimizer.grad_clip` (0: no clipping); the norm before
    clipping (a DTensor under FSDP2)."""
    return torch.nn.utils.clip_grad_norm_(params, opt["grad_clip"] or math.inf, foreach=True)


class Trainer:
    """One run: the model, its optimizer, the data, checkpoints and metrics, and the loop."""

    def __init__(
        self,
        spec: RunSpec,
        cfg: dict,
        model_cfg: dict,
        data_dir: Path,
        outdir: Path,
        ckpt_dir: Path,
        env: Distributed,
        tensorboard: Path | None = None,
        snapshot_steps=(),
    ):
        self.spec, self.cfg, self.env = spec, cfg, env
        self.outdir, self.ckpt_dir = outdir, ckpt_dir
        self.seq_len, self.batch_size, self.seed = cfg["seq_len"], cfg["batch_size"], spec.data_seed
        self.micro_batch_size = run_setting(cfg, spec.name, "micro_batch_size")  # check_runs: it divides the batch
        self.accum = self.batch_size // (self.micro_batch_size * env.world_size)
        self.tokens_per_step = self.batch_size * self.seq_len
        self.steps = train_steps(cfg)
        outside = [s for s in snapshot_steps if not 0 < s < self.steps]
        if outside:
            raise StreambackError(
                f"--snapshot-steps {' '.join(map(str, outside))}: a snapshot step lies between 0 "
                f"and the run's {self.steps} steps (the final model is written anyway)"
            )
        self.snapshot_steps = sorted(set(snapshot_steps))

        self._open_data(Path(data_dir))

        self.model_args = ModelArgs.from_config(
            model_cfg,
            spec.shape,
            self.train_data.vocab_size,
            block=spec.block,
            stream=spec.stream,
            reversible=is_reversible(cfg, spec),
        )
        self.model = self._build_model()
        self.shadow_format = shadow_format(self.model, env.device)  # None: the run's stream is the shadow's
        self.params = list(self.model.parameters())
        self.optimizer = adamw(self.params, cfg["optimizer"])
        self.state = TrainState(self.model, self.optimizer)
        self.identity = {
            "run": spec.name,
            "model_args": dataclasses.asdict(self.model_args),
            "seed": spec.data_seed,
            **({"init_seed": spec.init_seed} if spec.init_seed != spec.data_seed else {}),
            **{key: cfg[key] for key in ("tokens", "seq_len", "batch_size", "optimizer", "schedule")},
            "data": self.train_data.manifest["fingerprint"],  # what the data stage tokenized, and how
        }
        self.recipe_dir = layout.recipe_dir(ckpt_dir, recipe_fingerprint(self.identity))
        # the kernels of this process (not the recipe: a record of how the steps were computed)
        self.kernels = f"{compute.path(env.device, self.model.compute_dtype)} on {env.device.type}"
        self.checkpoints = CheckpointManager(
            spec.name,
            self.recipe_dir,
            self.state,
            self.identity,
            self.kernels,
            cfg["checkpoint"],
            self.snapshot_steps,
            env,
            self.say,
        )
        self.elapsed = 0.0  # seconds of training steps so far (fit: from the checkpoint it resumes)
        self.tensorboard_dir = tensorboard / self.recipe_dir.name if tensorboard is not None and env.rank == 0 else None

    def say(self, message: str) -> None:
        """A line in the run's log (rank 0)."""
        if self.env.rank == 0:
            _say(self.spec.name, message)

    def _open_data(self, data_dir: Path) -> None:
        """The run's train and val splits, checked against its token budget and val_sequences, and
        their shards verified against the manifest."""
        cfg, env, ckpt_dir = self.cfg, self.env, self.ckpt_dir
        self.train_data = TokenDataset(data_dir, "train")
        self.val_data = TokenDataset(data_dir, "val")
        self.n_train = num_windows(self.train_data.num_tokens, self.seq_len)
        if self.n_train < 1:
            raise StreambackError(
                f"{data_dir}: the train split has {self.train_data.num_tokens} tokens, fewer than train.seq_len + 1"
            )
        problem = token_budget_problem(cfg, self.train_data.num_tokens, f"the train split of {data_dir}")
        if problem:
            raise StreambackError(problem)
        passes = data_passes(cfg, self.train_data.num_tokens)
        if passes > 1:
            self.say(
                f"train.repeat_data is on: the run reads its train split {passes:.2f} times "
                f"({self.steps * self.batch_size:,} "
                f"windows of the {self.n_train:,} it holds), each pass in a new order"
            )
        n_val = num_windows(self.val_data.num_tokens, self.seq_len)
        self.val_windows = val_windows(n_val, cfg["log"]["val_sequences"], env.rank, env.world_size)
        if len(self.val_windows) < 1:
            raise StreambackError(
                f"{data_dir}: the val split has {self.val_data.num_tokens} tokens, too few for one sequence per process"
            )
        # the token shards against their manifest (the ranks share the hashing), bar those the run verified before
        self.say(
            verify_datasets(
                [self.train_data, self.val_data],
                ckpt_dir / layout.VERIFIED_SHARDS,
                env.rank,
                env.world_size,
                env.gather,
                torch.get_num_threads(),
            )
        )

    def _build_model(self):
        with torch.device("meta"):
            model = Transformer(self.model_args)
        model.to_empty(device=self.env.device)
        model.init_weights(self.spec.init_seed)
        if run_setting(self.cfg, self.spec.name, "activation_checkpointing"):
            apply_activation_checkpointing(model)
        if run_setting(self.cfg, self.spec.name, "compile"):
            apply_compile(model)
        if self.env.world_size > 1:
            from torch.distributed.device_mesh import init_device_mesh

            apply_fsdp(model, mesh=init_device_mesh(self.env.device.type, (self.env.world_size,)))
        return model

    # ---- the loop -------------------------------------------------------------------------

    def fit(self) -> int:
        if self.env.rank == 0:
            self.recipe_dir.mkdir(exist_ok=True)
        remove_partial(self.recipe_dir, say=self.say)
        start_step, self.elapsed = self.checkpoints.resume()
        self.checkpoints.snapshot_at_start(start_step, self.model_args, self.train_data.manifest)
        self._open_logs(start_step)
        self.progress = Progress(
            self.spec.name, self.steps, unit="step", initial=start_step, active=self.env.rank == 0, every_s=None
        )
        self._announce(start_step)
        step, last_saved = start_step, start_step if start_step else None
        watch = StreamDtypeWatch(self.model)
        try:
            with StopRequest() as stop:
                while step < self.steps:
                    record, stop_now = self._step(step, stop, watch)
                    watch = None
                    step += 1
                    self._after_step(step, record)
                    if step in self.snapshot_steps:
                        self.checkpoints.snapshot(step, self.model_args, self.train_data.manifest)
                    stop_now = stop_now and step < self.steps
                    if step % self.cfg["checkpoint"]["every"] == 0 or step == self.steps or stop_now:
                        self._save(step)
                        last_saved = step
                    if stop_now:
                        self.progress.write(
                            f"[{self.spec.name}] "
                            f"{signal.Signals(stop.signal).name if stop.signal else 'a stop signal'} "
                            f"received: saved the checkpoint of step {step}; exiting with status {EXIT_REQUEUE} to be "
                            f"resumed"
                        )
                        return EXIT_REQUEUE
        except Diverged as err:
            where = (
                f"{self.recipe_dir}/step_{last_saved:09d} (step {last_saved})"
                if last_saved
                else "none (the run diverged before its first checkpoint)"
            )
            self.progress.write(
                f"[{self.spec.name}] stopped: {err}. Nothing of this step was applied or saved; the last good "
                f"checkpoint is {where}. "
                "A rerun resumes from it and meets the same batches again: change the recipe (e.g. a lower "
                "train.optimizer.lr), "
                "which trains from its first step in a directory of its own."
            )
            return EXIT_DIVERGED
        finally:
            self.progress.close()
            if self.log is not None:
                self.log.close()
        self._finish(step)
        return 0

    def _open_logs(self, start_step: int) -> None:
        """Rank 0's logs of a run starting at `start_step`: the metrics log (with TensorBoard and W&B
        behind it, as configured) and the watch over its records; None elsewhere."""
        self.log, self.watch, self.board = None, None, None
        if self.env.rank == 0:
            self.board = (
                open_writer(self.tensorboard_dir, start_step + 1, self.say)
                if self.tensorboard_dir is not None
                else None
            )
            mirrors = [self.board] if self.board is not None else []
            if self.cfg["log"]["wandb"]["project"] is not None:
                mirrors.append(
                    open_wandb(
                        self.cfg["log"]["wandb"],
                        f"{self.spec.name}-{self.recipe_dir.name.removeprefix('recipe-')}",
                        self.spec.name,
                        self.recipe_dir,
                        {"identity": self.identity},
                    )
                )
            self.log = MetricsLog(
                self.recipe_dir / layout.METRICS_FILE,
                start_step,
                mirrors=mirrors,
                header=self.checkpoints.kernel_record(),
            )
            self.watch = Watch(
                self.cfg["log"]["warnings"], self.cfg["schedule"]["warmup_steps"], self.model.stream_format.label
            )
            self.watch.replay(self.log.resumed)

    def train_step(self, step: int) -> dict:
        """Take step `step` (0-based) outside `fit`'s loop, with no stop signal heard and no stream
        watch, and return its record: step, tokens, loss, lr, grad_norm, tokens_per_s, elapsed_s
        (and on a `log.stream_every` step the stream's, on a `log.shadow_every` step the shadow's)."""
        record, _ = self._step(step, StopRequest(), None)
        return record

    def first_micro_batch(self, step: int) -> torch.Tensor:
        """This process's first micro-batch of step `step` (0-based) on its device: windows of
        seq_len + 1 tokens, as `train_step` reads them."""
        windows = train_windows(self.seed, step, self.batch_size, self.n_train)
        micro = rank_micro_batches(windows, self.env.rank, self.env.world_size, self.micro_batch_size)[0]
        return read_windows(self.train_data, micro, self.seq_len).to(self.env.device)

    def save(self, directory: Path, step: int, keep: int) -> Path:
        """Checkpoint the model and optimizer as of step `step` into `directory` (a collective),
        with the recipe, the elapsed seconds and the kernels, keeping the newest `keep`; returns it."""
        return self.checkpoints.save(directory, step, keep, self.elapsed)

    def restore(self, path: Path) -> dict:
        """Load the model and optimizer of the checkpoint `path` (a collective); returns its meta."""
        return self.checkpoints.restore(path)

    def _step(self, step: int, stop: StopRequest, watch) -> tuple[dict, bool]:
        started = time.perf_counter()
        env, cfg = self.env, self.cfg
        lr = wsd_lr(
            step, cfg["optimizer"]["lr"], self.steps, cfg["schedule"]["warmup_steps"], cfg["schedule"]["decay_steps"]
        )
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        torch.manual_seed(_seed(self.seed, step, env.rank, 0))
        shadow = (
            self.shadow_format if cfg["log"]["shadow_every"] and (step + 1) % cfg["log"]["shadow_every"] == 0 else None
        )
        record_stream = (step + 1) % cfg["log"][
            "stream_every"
        ] == 0 or shadow is not None  # the shadow is compared with the step's record
        windows = train_windows(self.seed, step, self.batch_size, self.n_train)
        loss_sum = torch.zeros((), device=env.device)
        stream_record = StreamRecord(self.model, cfg["log"]["signals"]) if record_stream else None
        batches = []  # this step's micro-batches, kept for the shadow
        with stream_record.capture() if record_stream else contextlib.nullcontext() as stream:
            for micro in rank_micro_batches(windows, env.rank, env.world_size, self.micro_batch_size):
                batch = read_windows(self.train_data, micro, self.seq_len).to(env.device, non_blocking=True)
                if shadow is not None:
                    batches.append(batch)
                loss = self.model(batch[:, :-1], targets=batch[:, 1:])  # next_token_loss, fused with the output head
                if watch is not None:
                    watch.check_and_remove()
                    watch = None
                (loss / self.accum).backward()
                loss_sum += loss.detach()
                if record_stream:
                    stream_record.add(stream)
        if shadow is not None:
            stream_record.shadow(batches, shadow)
        # one all-reduce per step: the mean loss over the global batch and whether any rank was signalled
        agreed = env.all_reduce(
            torch.stack([loss_sum / self.accum, torch.tensor(float(stop.signal is not None), device=env.device)])
        )
        loss_value, stop_now = agreed[0].item() / env.world_size, agreed[1].item() > 0
        if not math.isfinite(loss_value):
            raise Diverged(f"the training loss is {loss_value} at step {step + 1}")
        grad_norm = clip_gradients(self.params, cfg["optimizer"])
        if hasattr(grad_norm, "full_tensor"):
            grad_norm = grad_norm.full_tensor()
        grad_norm = grad_norm.item()
        if not math.isfinite(grad_norm):
            raise Diverged(f"the gradient norm is {grad_norm} at step {step + 1} (loss {loss_value:.4f})")
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        seconds = time.perf_counter() - started
        self.elapsed += seconds
        record = {
            "step": step + 1,
            "tokens": (step + 1) * self.tokens_per_step,
            "loss": loss_value,
            "lr": lr,
            "grad_norm": grad_norm,
            "tokens_per_s": self.tokens_per_step / seconds,
            "elapsed_s": self.elapsed,
        }
        if record_stream:
            record.update(stream_record.finish(env))
        return record, stop_now

    def _after_step(self, step: int, record: dict) -> None:
        if step % self.cfg["log"]["val_every"] == 0 or step == self.steps:
            record["val_loss"] = self.validate(step)
        if self.watch is not None:
            events = self.watch.observe(record)
            if events:
                record["warnings"] = events
            for event in events:
                self.progress.write(f"[{self.spec.name}] {event['message']}")
        if self.log is not None:
            self.log.append(record)
        val = f" val {record['val_loss']:.4f}" if "val_loss" in record else ""
        self.progress.update(
            1,
            f"loss {record['loss']:.4f}{val} lr {record['lr']:.3e} grad_norm {record['grad_norm']:.3f} "
            f"{record['tokens_per_s']:,.0f} tok/s",
            log=step % self.cfg["log"]["every"] == 0 or step == self.steps or bool(val),
        )

    def validate(self, step: int) -> float:
        """Mean next-token loss over the first `val_sequences` windows of the val split (a collective)."""
        torch.manual_seed(_seed(self.seed, step, self.env.rank, 1))
        losses = window_losses(
            self.model, self.val_data, self.val_windows, self.seq_len, self.micro_batch_size, self.env.device
        )
        total = self.env.all_reduce(
            torch.stack([losses.sum(), torch.tensor(float(len(losses)), dtype=torch.float64, device=self.env.device)])
        )
        return (total[0] / total[1]).item()

    # ---- checkpoints and outputs -----------------------------------------------------------

    def _save(self, step: int) -> None:
        if self.log is not None:
            self.log.sync()
        self.save(self.recipe_dir, step, keep=self.cfg["checkpoint"]["keep"])

    def _finish(self, step: int) -> None:
        """Write the final model (fp32, unsharded), then the snapshots, the metrics and summary.json."""
        self.checkpoints.write_model(self.outdir / layout.MODEL_FILE, step, self.model_args, self.train_data.manifest)
        if self.env.rank != 0:
            return
        summary = summary_record(
            self.spec,
            str(self.model.stream_format.label),
            count_params(self.model),
            step,
            self.tokens_per_step,
            self.elapsed,
            self.env.world_size,
            self.env.device.type,
            self.recipe_dir,
            self.checkpoints.kernel_record(),
        )
        write_outputs(self.outdir, self.recipe_dir, self.snapshot_steps, summary)
        self.progress.write(f"[{self.spec.name}] done: {step} steps; final model in {self.outdir / layout.MODEL_FILE}")

    def _announce(self, start_step: int) -> None:
        what = f"resuming from step {start_step}" if start_step else "starting"
        self.progress.write(
            f"[{self.spec.name}] {what}: {self.steps} steps of {self.tokens_per_step:,} tokens "
            f"({self.batch_size} x {self.seq_len}; {self.env.world_size} process(es) x {self.accum} micro-batches of "
            f"{self.micro_batch_size}); {count_params(self.model):,} parameters on {self.env.device.type} "
            f"({compute.path(self.env.device)}); "
            f"block {self.spec.block}, stream {self.model.stream_format.label}; checkpoints in {self.recipe_dir}"
            + (
                f"; TensorBoard event files in {self.tensorboard_dir}"
                if self.log is not None and self.board is not None
                else ""
            )
        )
        if start_step == self.steps:
            self.progress.write(
                f"[{self.spec.name}] this recipe was trained to its end: its outputs are written again from its last "
                f"checkpoint, "
                "the same weights and metrics as before (training is deterministic). To train it again from its first "
                f"step, "
                f"delete {self.recipe_dir} and rerun"
            )
        others = [p.name for p in layout.recipe_dirs(self.ckpt_dir) if p != self.recipe_dir]
        if others:
            self.progress.write(
                f"[{self.spec.name}] the checkpoints of this run's other recipes are kept ({', '.join(others)}); "
                "`streamback checkpoints` says how they differ, `streamback checkpoints --prune` removes them"
            )


def _error_of(check, *args, **kwargs) -> str | None:
    """The message of the StreambackError `check(*args, **kwargs)` raises, or None."""
    try:
        check(*args, **kwargs)
    except StreambackError as err:
        return str(err)
    return None
