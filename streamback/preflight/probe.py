"""What the preflight measures: a few steps of the run's own `Trainer` (its model, compile and
FSDP2 settings, micro-batch, data and optimizer), on the run's resources, each measurement judged
by `streamback.preflight.checks`.

In order: the free disk under the run's checkpoint directory (before any step: a full disk stops
the preflight there); one micro-batch's forward and backward with the stream captured at every
layer boundary (`Transformer.capture` with gradients); `train.preflight.steps - 1` training steps
(the losses; the tokens/s of all but the first two, which warm up, and the peak memory); a
checkpoint of them (its seconds and the slowest step's go in the resume check's values, `save_s`
and `step_s`: the train job's signal lead, `streamback.jobs.signal_lead`); the next step, with the
full-precision shadow; the checkpoint loaded and that step again, which must match it.

The tokens/s is the run's own: each step's `tokens_per_s` is the record `Trainer.train_step`
returns, the field the run writes to its metrics.jsonl (a step's tokens over the seconds of the
step: its batches read, forward and backward, the stream's record on a `log.stream_every` step,
clipping and the optimizer; not validation, logging or checkpoints), and the preflight's figure is
their median over the timed steps (`timed_tokens_per_s`), as a run's is over its steps.
"""

from __future__ import annotations

import copy
import math
import os
import resource
import statistics
import time
from pathlib import Path

import torch

from streamback.io import free_bytes, remove, tree_bytes, writable_dir
from streamback.model.model import count_params
from streamback.preflight import checks
from streamback.runs import RunSpec, train_steps
from streamback.train.optim import Diverged, clip_gradients
from streamback.train.processes import Distributed
from streamback.train.signals import shadow_gap_bound
from streamback.train.trainer import Trainer
from streamback.train.validation import next_token_loss

WARMUP_STEPS = 2  # steps not timed: the first compiles (torch.compile) and fills the allocator's caches


def timed_tokens_per_s(records: list[dict]) -> tuple[float, int]:
    """The preflight's tokens/s from the records of `Trainer.train_step` (steps 1, 2, ... of the
    run): the median of their `tokens_per_s` after the first WARMUP_STEPS (the last record's
    alone where there are no more), and the number of steps it is the median of."""
    timed = [r["tokens_per_s"] for r in records[WARMUP_STEPS:]] or [records[-1]["tokens_per_s"]]
    return statistics.median(timed), len(timed)


class Preflight:
    """One run's preflight: `run()` returns its checks (a collective under several processes)."""

    def __init__(
        self,
        spec: RunSpec,
        cfg: dict,
        model_cfg: dict,
        data_dir: Path,
        checkpoints: Path,
        scratch: Path,
        env: Distributed,
        mem_mb: int,
        processes_per_node: int,
    ):
        self.steps = cfg["preflight"]["steps"]
        cfg = copy.deepcopy(cfg)
        cfg["log"]["shadow_every"] = self.steps  # the shadow on the last step (the one run twice)
        self.env, self.checkpoints, self.scratch = env, Path(checkpoints), Path(scratch)
        self.mem_limit = mem_mb * 2**20 // processes_per_node
        self.rss_start, self.ram_start = _rss_bytes(), _available_ram()
        writable_dir(self.checkpoints, "checkpoint directory")
        # only the shards its steps read are hashed, each as it is first read (the run hashes every one)
        self.trainer = Trainer(
            spec, cfg, model_cfg, Path(data_dir), self.scratch / "out", self.checkpoints, env, verify_all_shards=False
        )
        self.results: list[checks.Check] = []
        self.records: list[dict] = []  # the records of the training steps (not the one run twice)

    @property
    def unit(self) -> str:
        return "GPU-hours" if self.env.device.type == "cuda" else "CPU process-hours"

    def run(self) -> list[checks.Check]:
        if not self._agreed(self.disk(estimate=True)):
            return self.results  # before any step
        self.stream_dtype()
        if self.env.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.env.device)  # the training steps' peak, not the probe's
        try:
            for step in range(self.steps - 1):
                self.records.append(self.trainer.train_step(step))
        except Diverged as err:
            self.results.append(checks.Check("losses", False, str(err), "finite steps", {}))
            return self.results
        self.speed_and_memory(self.records)
        self.resume_and_shadow(self.records)
        at = next(i for i, c in enumerate(self.results) if c.name == "speed")
        self.results.insert(at, self.learning(self.records))  # last: its steps leave the state changed
        return self.results

    def _agreed(self, check: checks.Check) -> bool:
        """Did `check` pass on every rank."""
        failed = self.env.all_reduce(torch.tensor(float(not check.passed), device=self.env.device)).item()
        return failed == 0

    def disk(self, estimate: bool, checkpoint_bytes: int | None = None) -> checks.Check:
        """Room under the checkpoint directory for train.checkpoint.keep checkpoints, the one being
        written beside them and the final fp32 model; a checkpoint estimated (fp32 weights and
        AdamW's two moments: 12 bytes a parameter) or as measured."""

        params = count_params(self.trainer.model)
        size = 12 * params if estimate else max(12 * params, checkpoint_bytes)
        needed = (self.trainer.cfg["checkpoint"]["keep"] + 1) * size + 4 * params
        check = checks.disk(free_bytes(self.checkpoints), needed, str(self.checkpoints))
        check.values["checkpoint_bytes"] = size
        self.results = (
            [check if c.name == "disk" else c for c in self.results] if not estimate else [check, *self.results]
        )
        return check

    def stream_dtype(self) -> None:
        """One micro-batch of step 1 forward and backward, the stream captured at every boundary."""
        t = self.trainer
        batch = t.first_micro_batch(0)
        with t.model.capture(("residual",), grad=True) as seen:
            t.model(batch[:, :-1], targets=batch[:, 1:]).backward()
            forward = [str(h.dtype) for h in seen["residual"]]
            gradients = [None if h.grad is None else str(h.grad.dtype) for h in seen["residual"]]
        t.optimizer.zero_grad(set_to_none=True)
        self.results.append(
            checks.stream_dtype(str(t.model.stream_format.container_dtype), forward, gradients, t.kernels)
        )

    def speed_and_memory(self, records: list[dict]) -> None:
        t = self.trainer
        tokens_per_s, timed_steps = timed_tokens_per_s(records)
        hours = train_steps(t.cfg) * t.tokens_per_step / tokens_per_s / 3600 * self.env.world_size
        self.results.append(checks.speed(tokens_per_s, hours, self.unit, t.kernels, timed_steps))
        self.results.append(checks.budget(hours, t.cfg["budget_gpu_hours"], self.unit))
        self.results.append(self._memory())

    def learning(self, records: list[dict]) -> checks.Check:
        """Does the model learn, whatever the schedule: one fixed micro-batch's loss before and after
        optimizer steps on it at the recipe's peak learning rate held fixed (train.optimizer.lr; a
        warmup's first steps move the weights too little to show in a loss that changes batch at
        every step), through the run's model, optimizer and gradient clipping, until the loss has
        fallen by more than the batch's own noise (`checks.learned`), at most `checks.LEARN_STEPS`.
        Each step's forward measures the loss its predecessors left. The steps change the state,
        which the preflight throws away."""
        t, env = self.trainer, self.env
        lr = t.cfg["optimizer"]["lr"]
        for group in t.optimizer.param_groups:
            group["lr"] = lr
        batch = t.first_micro_batch(0)
        before = self._token_loss_stats(batch)
        after, taken = before["mean"], 0
        while True:
            loss = t.model(batch[:, :-1], targets=batch[:, 1:])
            after = env.all_reduce(loss.detach().double().reshape(1)).item() / env.world_size
            if taken and (checks.learned(before, after) or taken == checks.LEARN_STEPS) or not math.isfinite(after):
                break
            loss.backward()
            clip_gradients(t.params, t.cfg["optimizer"])
            t.optimizer.step()
            t.optimizer.zero_grad(set_to_none=True)
            taken += 1
        t.optimizer.zero_grad(set_to_none=True)
        return checks.losses([r["loss"] for r in records], before, after, taken, lr)

    @torch.no_grad()
    def _token_loss_stats(self, batch: torch.Tensor) -> dict:
        """The mean next-token loss over every rank's batch, its tokens' standard deviation and count."""
        losses = next_token_loss(self.trainer.model(batch[:, :-1]), batch[:, 1:], reduction="none").double()
        sums = torch.stack(
            [
                losses.sum(),
                (losses**2).sum(),
                torch.tensor(float(losses.numel()), dtype=torch.float64, device=losses.device),
            ]
        )
        total, squares, n = self.env.all_reduce(sums).tolist()
        mean = total / n
        return {"mean": mean, "sd": math.sqrt(max(squares / n - mean**2, 0.0) * n / max(n - 1, 1)), "tokens": int(n)}

    def _memory(self) -> checks.Check:
        if self.env.device.type == "cuda":
            peak = torch.cuda.max_memory_reserved(self.env.device)
            total = torch.cuda.get_device_properties(self.env.device).total_memory
            what = f"the caching allocator's peak reservation on {torch.cuda.get_device_name(self.env.device)}"
        else:
            peak = _peak_rss_bytes()
            total = min(self.ram_start + self.rss_start, self.mem_limit)
            what = (
                "the process's peak resident set, against the lesser of the RAM available and the job's mem_mb per "
                "process"
            )
        peak = int(
            self.env.all_reduce(torch.tensor(float(peak), dtype=torch.float64, device=self.env.device), op=_MAX).item()
        )
        return checks.memory(peak, total, what)

    def resume_and_shadow(self, records: list[dict]) -> None:
        """Save the state after the steps so far, take the next step, load the state, take it again."""
        t, last = self.trainer, self.steps - 1
        if self.env.rank == 0:
            self.scratch.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        path = t.save(self.scratch, last, keep=1)
        save_s = time.perf_counter() - started  # what a stop signal's lead must leave room for (jobs.signal_lead)
        size = float(tree_bytes(path)) if self.env.rank == 0 else 0.0  # every rank's files (one filesystem)
        size = self.env.all_reduce(torch.tensor(size, dtype=torch.float64, device=self.env.device)).item()
        self.disk(estimate=False, checkpoint_bytes=int(size))
        first = t.train_step(last)
        after = _local_weights(t.params)
        t.restore(path)
        again = t.train_step(last)
        diffs = [(a - b).abs() for a, b in zip(after, _local_weights(t.params))]
        top = max((float(d.max()) for d in diffs if d.numel()), default=0.0)
        top = self.env.all_reduce(torch.tensor([top], dtype=torch.float64, device=self.env.device), op=_MAX).item()
        sums = torch.tensor(
            [sum(float(d.sum()) for d in diffs), sum(d.numel() for d in diffs)],
            dtype=torch.float64,
            device=self.env.device,
        )
        total, count = self.env.all_reduce(sums).tolist()
        resumed = checks.resume(
            abs(first["loss"] - again["loss"]),
            top,
            total / count,
            first["lr"],
            bitwise=self.env.device.type == "cpu",
        )
        # the slowest rank's save and the slowest step: the train job's signal lead (jobs.signal_lead)
        slowest = self.env.all_reduce(
            torch.tensor(
                [save_s, max(t.tokens_per_step / r["tokens_per_s"] for r in [*records, first, again])],
                dtype=torch.float64,
                device=self.env.device,
            ),
            op=_MAX,
        ).tolist()
        resumed.values.update(save_s=slowest[0], step_s=slowest[1])
        self.results.append(resumed)
        self.results.append(self._shadow(first))
        if self.env.rank == 0:
            remove(self.scratch, self.scratch.parent)

    def _shadow(self, record: dict) -> checks.Check:
        fmt = self.trainer.model.stream_format
        if "shadow_gap" not in record:
            return checks.shadow(None, None, None, fmt.label)
        run, shadow = record["stream_absmax"], record["shadow_absmax"]
        rounding = shadow_gap_bound(fmt, run, shadow)
        steps = (
            fmt.spacing(torch.tensor(shadow)) / torch.tensor(shadow).clamp_min(torch.finfo(torch.float32).tiny)
        ).tolist()
        return checks.shadow(record["shadow_gap"], rounding, record["shadow_loss"], fmt.label, grid=steps)


_MAX = torch.distributed.ReduceOp.MAX


def _local_weights(params) -> list[torch.Tensor]:
    """This rank's share of every parameter (its FSDP2 shard), in fp64 on the CPU."""
    return [(p.detach().to_local() if hasattr(p, "to_local") else p.detach()).double().cpu() for p in params]


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def _rss_bytes() -> int:
    try:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return _peak_rss_bytes()


def _available_ram() -> int:
    """MemAvailable of /proc/meminfo (Linux), else the machine's physical memory."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
