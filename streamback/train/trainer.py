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
locked (`streamback.train.runlock`: a second trainer on the run is refused, naming the Slurm job,
host and PID of the first; the lock is checked again before every save), and every
token shard is verified against the manifest - sha256 and vocabulary bound, the ranks sharing the
hashing - except those the run's verification record (`verified-shards.json` in the checkpoint
directory) vouches for, whose files have not changed since this run hashed them.

Exit statuses:
- 0: done; the final model, metrics and summary are in the output directory.
- 75 (EX_TEMPFAIL, "try again"): stopped by SIGTERM, SIGURG or SIGUSR1 after saving a checkpoint
  of the last completed step. Slurm sends SIGTERM at the time limit and on preemption (then
  SIGKILL after KillWait), and SIGURG ahead of the limit: the train rule asks for it
  (`--signal=URG@<seconds>` in its slurm_extra, `streamback.jobs.signal_lead`: from the save and
  step the arm's preflight timed; SIGURG because the job step's Snakemake ignores it, where a
  SIGUSR1 would kill it and with it the step's processes). The signal is heard from the process's start and acted on at
  the next step boundary (all ranks agree on it in the all-reduce that already averages each
  step's loss), so the lead must cover one step plus one save. The rerun resumes from this
  checkpoint: Slurm's requeue of a preempted job submitted with --requeue (the profile's
  `slurm-requeue`: the same job again), or Snakemake's retry of a job that ended (`retries`; a
  train job exits with Snakemake's status, not the trainer's, so slurm.conf's RequeueExit never
  sees 75). torchrun reports a worker's failure as 1 whatever its status: with `--status-file`
  cli.main also writes the status there, and the rule's shell exits with it.
- 3: the loss or the gradient norm was NaN or infinite. Nothing of that step is applied or
  saved; the newest checkpoint is the last good state.
- 2: bad input (config, data, checkpoint), reported before training starts where possible.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from pathlib import Path

import torch

from streamback import layout
from streamback.errors import StreambackError
from streamback.model import compute
from streamback.model.model import ModelArgs, Transformer, count_params
from streamback.runs import RunSpec, check_runs, is_reversible, run_matrix, run_setting, train_steps
from streamback.train.batches import open_splits, rank_micro_batches, read_windows, train_windows
from streamback.train.checkpoint import TrainState, recipe_fingerprint, remove_partial
from streamback.train.checkpointing import CheckpointManager, claim_run, recipe_identity, snapshot_steps_of
from streamback.train.metrics import RunMetrics
from streamback.train.optim import Diverged, adamw, clip_gradients, diverged_message, step_seed
from streamback.train.parallel import StreamDtypeWatch, apply_activation_checkpointing, apply_compile, apply_fsdp
from streamback.train.processes import Distributed, StopRequest
from streamback.train.schedule import wsd_lr
from streamback.train.signals import StreamRecord, shadow_format
from streamback.train.summary import start_lines, summary_record, write_outputs
from streamback.train.validation import window_losses

EXIT_DIVERGED = 3
EXIT_REQUEUE = 75  # sysexits.h EX_TEMPFAIL


def train(
    train_cfg: dict, model_cfg: dict, run_name: str, data_dir, outdir, checkpoints, tensorboard=None, snapshot_steps=()
) -> int:
    """Train `run_name` to its end or to a stop signal; returns the exit status (see the docstring).
    `tensorboard`: the run's TensorBoard directory (None: no event files); `snapshot_steps`: the
    earlier steps whose models it also writes (eval.last_checkpoints)."""
    check_runs(train_cfg, model_cfg, processes=int(os.environ.get("WORLD_SIZE", "1")), only=run_name)
    stop = StopRequest()  # from the start: a signal during the setup is remembered, acted on after one step
    stop.__enter__()
    env = Distributed.start()
    outdir, checkpoints, lock = Path(outdir), Path(checkpoints), None
    try:
        # found now, not after the last step; rank 0 holds the run's lock while it trains
        lock = claim_run(env, checkpoints, outdir, lambda message: _say(run_name, message))
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
        status = trainer.fit(stop, lock)
        env.barrier()  # the ranks leave together, as the preflight's do (streamback.preflight.stage)
        return status
    finally:
        if lock is not None:
            lock.close()
        env.close()
        stop.__exit__(None, None, None)


def _say(run_name: str, message: str) -> None:
    print(f"[{run_name}] {message}", file=sys.stderr, flush=True)


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
        verify_all_shards: bool = True,
    ):
        self.spec, self.cfg, self.env = spec, cfg, env
        self.outdir, self.ckpt_dir = outdir, ckpt_dir
        self.seq_len, self.batch_size, self.seed = cfg["seq_len"], cfg["batch_size"], spec.data_seed
        self.micro_batch_size = run_setting(cfg, spec.name, "micro_batch_size")  # check_runs: it divides the batch
        self.accum = self.batch_size // (self.micro_batch_size * env.world_size)
        self.tokens_per_step = self.batch_size * self.seq_len
        self.steps = train_steps(cfg)
        self.snapshot_steps = snapshot_steps_of(snapshot_steps, self.steps)

        verified = ckpt_dir / layout.VERIFIED_SHARDS
        splits = open_splits(Path(data_dir), cfg, self.steps, env, verified, self.say, verify_all_shards)
        self.train_data, self.val_data = splits.train, splits.val
        self.n_train, self.val_windows = splits.n_train, splits.val_windows

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
        self.identity = recipe_identity(spec, self.model_args, cfg, self.train_data.manifest)
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

    def fit(self, stop: StopRequest | None = None, lock=None) -> int:
        """Train from the newest checkpoint of the recipe to the end or to a stop signal (`stop`,
        already listening, or one of its own); the exit status. `lock`: the run's lock
        (`streamback.train.runlock.RunLock`, rank 0), checked before every save."""
        self.lock = lock
        if self.env.rank == 0:
            self.recipe_dir.mkdir(exist_ok=True)
        remove_partial(self.recipe_dir, say=self.say)
        start_step, self.elapsed = self.checkpoints.resume()
        self.checkpoints.snapshot_at_start(start_step, self.model_args, self.train_data.manifest)
        self.metrics = self._open_metrics(start_step)
        step, last_saved = start_step, start_step if start_step else None
        watch = StreamDtypeWatch(self.model)
        try:
            with contextlib.nullcontext(stop) if stop is not None else StopRequest() as heard:
                while step < self.steps:
                    record, stop_now = self._step(step, heard, watch)
                    watch, step = None, step + 1
                    if step % self.cfg["log"]["val_every"] == 0 or step == self.steps:
                        record["val_loss"] = self.validate(step)
                    self.metrics.append(step, record)
                    if step in self.snapshot_steps:
                        self.checkpoints.snapshot(step, self.model_args, self.train_data.manifest)
                    stop_now = stop_now and step < self.steps
                    if step % self.cfg["checkpoint"]["every"] == 0 or step == self.steps or stop_now:
                        self._save(step)
                        last_saved = step
                    if stop_now:
                        self.metrics.write(heard.message(self.spec.name, step, EXIT_REQUEUE))
                        return EXIT_REQUEUE
        except Diverged as err:
            self.metrics.write(diverged_message(self.spec.name, err, self.recipe_dir, last_saved))
            return EXIT_DIVERGED
        finally:
            self.metrics.close()
        self._finish(step)
        return 0

    def _open_metrics(self, start_step: int) -> RunMetrics:
        """The run's records from `start_step` on (`streamback.train.metrics.RunMetrics`), its start announced."""
        metrics = RunMetrics(
            self.spec.name,
            self.steps,
            start_step,
            self.env.rank,
            self.cfg,
            self.recipe_dir,
            self.tensorboard_dir,
            self.identity,
            self.checkpoints.kernel_record(),
            self.model.stream_format.label,
            self.say,
        )
        batch = (
            f"{self.tokens_per_step:,} tokens ({self.batch_size} x {self.seq_len}; {self.env.world_size} "
            f"process(es) x {self.accum} micro-batches of {self.micro_batch_size})"
        )
        for line in start_lines(
            self.spec,
            start_step,
            self.steps,
            batch,
            count_params(self.model),
            f"{self.env.device.type} ({compute.path(self.env.device)})",
            self.model.stream_format.label,
            self.recipe_dir,
            self.tensorboard_dir if metrics.board is not None else None,
        ):
            metrics.write(line)
        return metrics

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
        torch.manual_seed(step_seed(self.seed, step, env.rank, 0))
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

    def validate(self, step: int) -> float:
        """Mean next-token loss over the first `val_sequences` windows of the val split (a collective)."""
        torch.manual_seed(step_seed(self.seed, step, self.env.rank, 1))
        losses = window_losses(
            self.model, self.val_data, self.val_windows, self.seq_len, self.micro_batch_size, self.env.device
        )
        total = self.env.all_reduce(
            torch.stack([losses.sum(), torch.tensor(float(len(losses)), dtype=torch.float64, device=self.env.device)])
        )
        return (total[0] / total[1]).item()

    # ---- checkpoints and outputs -----------------------------------------------------------

    def _save(self, step: int) -> None:
        error = None
        if getattr(self, "lock", None) is not None:  # another trainer took the run over (this one judged gone)?
            try:
                self.lock.check()
            except StreambackError as err:
                error = str(err)
        self.env.agree(error, "the run's lock check")  # then no rank writes anything more
        self.metrics.sync()
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
            embedding_init_std=self.model_args.embedding_init_std,
        )
        write_outputs(self.outdir, self.recipe_dir, self.snapshot_steps, summary)
        self.metrics.write(f"[{self.spec.name}] done: {step} steps; final model in {self.outdir / layout.MODEL_FILE}")
