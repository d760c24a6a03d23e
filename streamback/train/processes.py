"""A training process's place among the others and how it is asked to stop: `Distributed` (rank,
number of processes and device from torchrun's environment, with the few collectives the trainer
uses, each a no-op in a single process) and `StopRequest` (SIGTERM, SIGUSR1 and SIGURG remembered,
not fatal, for the loop to act on at a step boundary)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal

import torch
import torch.distributed as dist

from streamback.errors import StreambackError

# Slurm's time limit and preemption (SIGTERM); the train rule's lead ahead of the limit (sbatch --signal=URG@<s>: a
# signal that a process without a handler ignores, as the job step's own Snakemake does); SIGUSR1, sent by hand
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGURG)


@dataclasses.dataclass
class Distributed:
    """This process's place: rank, number of processes, device (torchrun's environment variables)."""

    rank: int
    world_size: int
    device: torch.device

    @classmethod
    def start(cls) -> Distributed:
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if torch.cuda.is_available():
            device = torch.device("cuda", local_rank)
            torch.cuda.set_device(device)
        else:
            device = torch.device("cpu")
        if world_size > 1:
            dist.init_process_group(
                "nccl" if device.type == "cuda" else "gloo", device_id=device if device.type == "cuda" else None
            )
        return cls(int(os.environ.get("RANK", "0")), world_size, device)

    def all_reduce(self, tensor: torch.Tensor, op=dist.ReduceOp.SUM) -> torch.Tensor:
        if self.world_size > 1:
            dist.all_reduce(tensor, op=op)
        return tensor

    def gather(self, obj) -> list:
        """`obj` (picklable) from every rank, in rank order."""
        if self.world_size == 1:
            return [obj]
        out = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def agree(self, error: str | None, what: str) -> None:
        """Raise StreambackError on every rank if any rank has an `error` (its own, or that `what` failed elsewhere)."""
        failed = self.all_reduce(torch.tensor(float(error is not None), device=self.device)).item()
        if error is not None:
            raise StreambackError(error)
        if failed:
            raise StreambackError(f"{what} failed on another rank (see its message)")

    def barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier()

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


class StopRequest(contextlib.AbstractContextManager):
    """Remembers a SIGTERM/SIGUSR1/SIGURG instead of dying of it; the loop saves and exits at a step boundary."""

    def __init__(self):
        self.signal: int | None = None
        self._previous = {}

    def __enter__(self):
        for sig in STOP_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        self.signal = signum

    def message(self, run: str, step: int, status: int) -> str:
        """The line of run `run` stopping on this request after saving the checkpoint of `step`, with exit `status`."""
        heard = signal.Signals(self.signal).name if self.signal else "a stop signal"
        return (
            f"[{run}] {heard} received: saved the checkpoint of step {step}; exiting with status {status} to be resumed"
        )

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        return False
