"""How this process computes: its CPU threads, its bf16 kernel path on the CPU (the config's
`cpu_bf16`, resolved on this CPU) and its device, decided once from the job's config and applied
around the work, never left behind.

`cli.main` decides it (`from_args`) for every stage that runs model code, before the stage runs,
applies it (`applied`) around the stage and hands it to the stage as `args.execution_context`.
An in-process caller (a test, a benchmark) does the same with `decide` and `applied`. Where the
kernel path comes from, first to last:
- the `cpu_bf16` of the config file a stage is given (`--config`): a hand run reads what its rule's
  job reads;
- `STREAMBACK_CPU_BF16`, which every Snakemake job gets from the config (workflow/rules/common.smk
  exports `jobs.execution_environment(config)` for each job, train's launcher and its processes
  included);
- the `cpu_bf16` of the default config, for a stage that reads it (no `--params`);
- `auto`.
"""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass

import torch

from streamback.config import DEFAULT_CONFIG, read_config_file, validate_config
from streamback.errors import StreambackError
from streamback.model import compute


@dataclass(frozen=True)
class Execution:
    """One process's execution: `cpu_bf16` as chosen (`source` says where), what it resolved to on
    this CPU (`emulated`: bf16 on fp32 kernels), the CPU threads (None: torch's choice) and the
    device (None: the stage's default, cuda when available)."""

    cpu_bf16: str
    source: str
    emulated: bool
    threads: int | None = None
    device: str | None = None

    def kernels(self, device: torch.device | str | None = None, dtype: torch.dtype = torch.bfloat16) -> str:
        """The kernels `dtype` compute runs on `device` (default: this execution's) with, as
        summary.json records them: 'bf16 on fp32 kernels on cpu', 'native bf16 on cuda', ..."""
        device = torch.device(device or self.torch_device())
        return f"{compute.kernels(self.emulated, device, dtype)} on {device.type}"

    def torch_device(self) -> torch.device:
        """The device: the one chosen, else cuda when available, else the CPU."""
        return torch.device(self.device or ("cuda" if torch.cuda.is_available() else "cpu"))


def decide(cpu_bf16: str, source: str = "cpu_bf16", threads: int | None = None, device: str | None = None) -> Execution:
    """The execution of `cpu_bf16` (a compute.CPU_BF16_MODES name, named `source` in errors) on
    this CPU, with `threads` and `device`; a bad value is a StreambackError of one line."""
    if threads is not None and threads < 1:
        raise StreambackError(f"--threads must be at least 1, got {threads}")
    chosen = compute.check_mode(cpu_bf16, source)
    return Execution(chosen, source, compute.resolves_to_emulated(chosen), threads, device)


def for_config(config: dict, threads: int | None = None, device: str | None = None) -> Execution:
    """The execution a job of `config` (a validated config) gets on this CPU."""
    return decide(config["cpu_bf16"], "cpu_bf16 of the config", threads, device)


def from_args(args, threads: int | None = None) -> Execution:
    """The execution of a stage's parsed arguments, as its workflow job gets it (see the module
    docstring); `threads`: the stage's default where `--threads` is not given. A set
    STREAMBACK_CPU_BF16 that a config file overrides is named on stderr."""
    env = os.environ.get(compute.ENV)
    config_file = getattr(args, "config", None)
    if config_file is not None:
        chosen, source = validate_config(read_config_file(config_file))["cpu_bf16"], f"cpu_bf16 of {config_file}"
    elif env:
        chosen, source = env, f"environment variable {compute.ENV}"
    elif getattr(args, "params", None) is None:
        chosen = validate_config(read_config_file(DEFAULT_CONFIG))["cpu_bf16"]
        source = f"cpu_bf16 of {DEFAULT_CONFIG}"
    else:
        chosen, source = "auto", "the default cpu_bf16"
    if env and env != chosen:
        print(f"warning: {compute.ENV}={env} is ignored: {source} says {chosen}", file=sys.stderr)
    given = getattr(args, "threads", None)
    return decide(chosen, source, given if given is not None else threads, getattr(args, "device", None))


@contextlib.contextmanager
def applied(execution: Execution):
    """Run the block with `execution`'s threads and kernel path; the previous ones come back after it."""
    threads = torch.get_num_threads()
    if execution.threads is not None:
        torch.set_num_threads(execution.threads)
    try:
        with compute.use(execution.cpu_bf16, execution.source, emulated=execution.emulated):
            yield execution
    finally:
        torch.set_num_threads(threads)
