"""`streamback preflight`: check one run arm on the resources and launcher its train job gets (one
process, or torchrun), and write its record only if every check passed.

A passed preflight writes results/preflight/<arm>.json (every check with its figure and bound,
the kernels its steps computed on, named as the run's summary.json names them, the device, the
software versions) and exits 0; a failed one prints one line per failed check
(check, figure, bound), writes its record to results/preflight/failed/<arm>.json instead, removes
any earlier passed record of the arm, and exits 1: nothing takes a failed preflight as passed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
from pathlib import Path

import torch

from streamback import layout
from streamback.config import DEFAULT_CONFIG, add_config_arguments, load_config, section_from_args, section_from_json
from streamback.errors import StreambackError
from streamback.io import write_if_changed, write_json
from streamback.preflight.probe import Preflight
from streamback.runs import check_runs, run_matrix, run_setting
from streamback.train.processes import Distributed

HELP = (
    "check a run arm before it trains: a few of its steps on its own resources (stream dtypes, losses, speed, memory, "
    "resume, shadow, disk)"
)
EXIT_FAILED = 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser, "train")
    parser.add_argument(
        "--model-params",
        default=None,
        help="the 'model' section as a JSON object (what the rule passes; default: from --config)",
    )
    parser.add_argument(
        "--arm",
        required=True,
        help="the run arm, `{shape}-{block}` or `{shape}-streamback-{stream}`: its first run is checked",
    )
    parser.add_argument(
        "--data", type=Path, default=None, help="token directory of the data stage (default: the config's)"
    )
    parser.add_argument(
        "--checkpoints",
        type=Path,
        default=None,
        help="the checked run's checkpoint directory: its free disk is checked (default: results/checkpoints/<run>)",
    )
    parser.add_argument(
        "--resources",
        default="{}",
        metavar="JSON",
        help="the train job's resources (mem_mb, gpus, processes), as the rule passes them",
    )
    parser.add_argument("--out", type=Path, default=None, help="the record (default: results/preflight/<arm>.json)")
    parser.add_argument(
        "--gate",
        type=Path,
        default=None,
        help="the verdict the train jobs wait for, written where it changes (default: beside the record, --out with "
        "the suffix .pass: results/preflight/<arm>.pass)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="CPU threads per process (default: with --params, torch's choice; else the run's train.resources.threads, "
        "as the rule passes)",
    )


def default_threads(args: argparse.Namespace) -> int | None:
    """The threads of a preflight run without `--threads`: with `--params` torch's choice (None),
    else its run's train.resources.threads of the config, as the rule passes them (its train job's)."""
    if args.params is not None:
        return None
    train_cfg = section_from_args(args, "train")
    runs = [name for name, spec in run_matrix(train_cfg).items() if spec.arm == args.arm]
    return run_setting(train_cfg, runs[0], "resources")["threads"] if runs else None


def run(args: argparse.Namespace) -> int:
    """Check the arm as the arguments say, on the execution cli.main applied (threads, kernels)."""
    train_cfg = section_from_args(args, "train")
    config = load_config(args.config or DEFAULT_CONFIG) if args.model_params is None or args.data is None else None
    model_cfg = (
        section_from_json(args.model_params, "model", "--model-params")
        if args.model_params is not None
        else config["model"]
    )
    try:
        resources = json.loads(args.resources)
    except json.JSONDecodeError as err:
        raise StreambackError(f"--resources is not a JSON object: {err}") from None
    runs = [name for name, spec in run_matrix(train_cfg).items() if spec.arm == args.arm]
    if not runs:
        raise StreambackError(f"run arm {args.arm!r} is not in the train.runs matrix")
    out = args.out or layout.preflight_file(args.arm)
    return preflight(
        train_cfg,
        model_cfg,
        args.arm,
        runs[0],
        args.data or layout.tokens_dir(config["data"]),
        args.checkpoints or layout.checkpoint_dir(runs[0]),
        out,
        resources,
        args.gate or layout.preflight_gate_of(out),
    )


def preflight(
    train_cfg: dict, model_cfg: dict, arm: str, run: str, data_dir, checkpoints, out, resources: dict, gate=None
) -> int:
    """Check `run` (of `arm`) and write its record, and `passed` to `gate` where it does not say so
    already (a failed one removes it); 0 if every check passed, EXIT_FAILED if not."""
    check_runs(train_cfg, model_cfg, processes=int(os.environ.get("WORLD_SIZE", "1")), only=run)
    env = Distributed.start()
    out = Path(out)
    try:
        per_node = resources.get("gpus") or resources.get("processes", 1)
        probe = Preflight(
            run_matrix(train_cfg)[run],
            train_cfg,
            model_cfg,
            Path(data_dir),
            Path(checkpoints),
            layout.preflight_scratch(out),
            env,
            resources.get("mem_mb", 2**40 // 2**20),
            per_node,
        )
        results = probe.run()
        status = (
            _report(results, probe, env, arm, run, out, gate, resources)
            if env.rank == 0
            else (0 if all(c.passed for c in results) else EXIT_FAILED)
        )
        # the ranks leave together: one that tears its process group down while rank 0 still
        # writes was once aborted by gloo at exit ("terminate called without an active exception")
        env.barrier()
        return status
    finally:
        env.close()


def _report(results, probe, env, arm: str, run: str, out: Path, gate, resources: dict) -> int:
    """Rank 0's part: the record (or the failed one) and the gate, the checks' lines; the status."""
    record = {
        "arm": arm,
        "run": run,
        "passed": all(c.passed for c in results),
        "checks": [c.as_dict() for c in results],
        "steps": probe.steps,
        "unit": probe.unit,
        "processes": env.world_size,
        "kernels": probe.trainer.kernels,  # as the run's summary.json names them
        "device": device_name(env.device),
        "software": software(env.device),
        "resources": resources,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    failed_record = layout.preflight_failed_file(out)
    for check in results:
        print(f"[preflight {arm}] {check.line()}", file=sys.stderr, flush=True)
    if record["passed"]:
        write_json(out, record)
        if gate is not None:
            write_if_changed(gate, layout.PASSED)
        failed_record.unlink(missing_ok=True)
        return 0
    out.unlink(missing_ok=True)
    if gate is not None:
        Path(gate).unlink(missing_ok=True)
    write_json(failed_record, record)
    for check in results:
        if not check.passed:
            print(f"preflight {arm}: FAILED {check.line()}", file=sys.stderr, flush=True)
    return EXIT_FAILED


def device_name(device: torch.device) -> str:
    """The GPU's name, or the CPU's model name (/proc/cpuinfo), else the platform's word for it."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def software(device: torch.device) -> dict:
    """The versions the checks hold for: Python, torch, and on CUDA its CUDA and NCCL."""
    versions = {"python": platform.python_version(), "torch": torch.__version__}
    if device.type == "cuda":
        versions["cuda"] = torch.version.cuda
        versions["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    return versions
