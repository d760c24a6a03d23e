"""The dose tier's pilot: which embedding std (`model.embedding_init_std`, the dose) puts the bf16
stream into the drift note's regime, where it swallows at least `--target` of its updates.

For each dose of `--doses`, the baseline (bf16 stream) of `--shape` of the tier's config is trained
for the first half of the tier's run (`--steps`; its recipe, schedule and data, seed 0) by the
trainer itself (`Trainer.train_step`, the preflight's way: a scratch directory, nothing of
results/runs touched), recording the live signals every step. A step's swallowed share is the
trainer's live signal (`streamback.model.swallow`), its layers averaged; the pilot's share is the
mean over its steps (the share at its last `--last` steps is printed beside it: the model grows
its updates against the dosed stream, so the share falls as it trains). The dose picked is the
smallest of `--doses` whose mean share reaches the target.

With `--ratios`, after the last step, one forward of the next batch through `Transformer.capture`
gives the model's own horizon for the drift simulation: over the 2L adds of a forward, per
(position, coordinate), the mean update (its coherent part, mu) and the spread about it (sigma),
each over the rms of h_0 (the stream's scale); printed as the (start, mu, sigma) of a drift run of
2L steps (docs/measurements.md runs them with `streamback drift --params`).

Needs the tier's tokens (`snakemake results/tokens/synthetic/manifest.json --cores 1 --configfile
config/dose.yaml`). One thread, this CPU's kernel path as the config sets it:

    PYTHONPATH=. python benchmarks/pilot_dose.py [--config config/dose.yaml] [--shape l20-dose1]
        [--doses 1,64,256,1024,4096,16384] [--steps 100] [--target 0.30] [--ratios] [--out results/pilot_dose.json]
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from streamback import layout
from streamback.config import DEFAULT_CONFIG, merge_config, read_config_file, validate_config
from streamback.model import execution
from streamback.model.swallow import swallow_counts, swallow_fractions
from streamback.runs import run_matrix
from streamback.train.processes import Distributed
from streamback.train.trainer import Trainer

PILOT = "pilot"  # the one shape of the pilot's matrix


def tier_config(path: Path) -> dict:
    """The tier as Snakemake sees it: `path` merged over config/config.yaml, validated."""
    return validate_config(merge_config(read_config_file(DEFAULT_CONFIG), read_config_file(path)))


def pilot_config(tier: dict, shape: str, dose: float, steps: int) -> dict:
    """The tier's recipe with one run, `pilot-baseline`: `shape` at `dose`, its first `steps` steps
    (the tier's schedule, whose decay starts later: warmup then the peak lr); the live signals every
    step, no shadow, no validation."""
    cfg = copy.deepcopy(tier)
    if shape not in cfg["model"]["shapes"]:
        sys.exit(f"--shape {shape!r} is not a shape of the config: {', '.join(cfg['model']['shapes'])}")
    cfg["model"]["shapes"] = {PILOT: {**cfg["model"]["shapes"][shape], "embedding_init_std": dose}}
    train = cfg["train"]
    train["runs"].update(shapes=[PILOT], blocks=["baseline"], streams=[], stream_shapes=None, seeds=None)
    train["per_run"] = {}
    tier_steps = train["tokens"] // (train["batch_size"] * train["seq_len"])
    if steps > tier_steps - train["schedule"]["decay_steps"]:
        stable = tier_steps - train["schedule"]["decay_steps"]
        sys.exit(f"--steps {steps} reaches into the tier's decay: at most {stable}")
    train["tokens"] = steps * train["batch_size"] * train["seq_len"]
    train["schedule"] = {**train["schedule"], "decay_steps": 0}  # the first `steps` of the tier's WSD
    train["log"].update(stream_every=1, signals=True, shadow_every=0, val_every=10**9, tensorboard=False)
    return validate_config(cfg)


def ratios(model, tokens: torch.Tensor) -> dict:
    """The model's own horizon from one forward of `tokens`: h_0's rms, and over the 2L adds per
    (position, coordinate) the mean update and the spread about it, each over h_0's rms."""
    with torch.no_grad(), model.capture(("residual", "attention", "feed_forward")) as cap:
        model(tokens)
    deltas = torch.stack([d for pair in zip(cap["attention"], cap["feed_forward"]) for d in pair]).double()
    scale = cap["residual"][0].double().pow(2).mean().sqrt().item()
    return {
        "adds": deltas.shape[0],
        "stream_rms": scale,
        "mu": deltas.mean(0).abs().mean().item() / scale,
        "sigma": deltas.std(0, correction=0).pow(2).mean().sqrt().item() / scale,
    }


def pilot(cfg: dict, data_dir: Path, last: int, with_ratios: bool) -> dict:
    """Train the pilot run: its live swallowed share over its steps and over the last `last` (and `ratios`)."""
    train_cfg, model_cfg = cfg["train"], cfg["model"]
    steps = train_cfg["tokens"] // (train_cfg["batch_size"] * train_cfg["seq_len"])
    spec = run_matrix(train_cfg)[f"{PILOT}-baseline"]
    env = Distributed.start()
    with tempfile.TemporaryDirectory(prefix="pilot-dose-") as scratch:
        trainer = Trainer(spec, train_cfg, model_cfg, data_dir, Path(scratch) / "out", Path(scratch) / "ckpt", env)
        began = time.perf_counter()
        records = [trainer.train_step(step) for step in range(steps)]
        seconds = time.perf_counter() - began
        # the live share of a step: its layers' shares averaged, each layer's two adds holding the same
        # batch x seq x dim updates (the layers weigh alike, as their summed counts would weigh them)
        shares = [sum(r["swallowed_fraction"]) / len(r["swallowed_fraction"]) for r in records]
        out = {
            "steps": steps,
            "seconds": seconds,
            "swallowed_share": sum(shares) / len(shares),
            "swallowed_share_last": sum(shares[-last:]) / len(shares[-last:]),
            "swallowed_share_by_step": shares,
            "final_loss": records[-1]["loss"],
            "stream_absmax_first_last": [records[-1]["stream_absmax"][0], records[-1]["stream_absmax"][-1]],
        }
        if with_ratios:
            tokens = trainer.first_micro_batch(steps)[:, :-1]
            out["horizon"] = ratios(trainer.model, tokens)
            with torch.no_grad(), trainer.model.capture(("residual",), add_fn=swallow_counts) as cap:
                trainer.model(tokens)
                counts = sum(cap["adds"])
            out["swallowed_share_next_batch"] = swallow_fractions(counts)["swallowed_fraction"]
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=Path("config/dose.yaml"), help="the tier's config")
    parser.add_argument("--shape", default="l20-dose1", help="the shape whose baseline is dosed (default: l20-dose1)")
    parser.add_argument("--doses", default="1,64,256,1024,4096,16384", help="comma-separated embedding stds")
    parser.add_argument("--target", type=float, default=0.30, help="the swallowed share the large dose must reach")
    parser.add_argument("--steps", type=int, default=None, help="steps to train (default: half the tier's run)")
    parser.add_argument("--last", type=int, default=5, help="steps at the end whose shares are averaged")
    parser.add_argument("--ratios", action="store_true", help="also the model's own horizon for the drift run")
    parser.add_argument("--data", type=Path, default=None, help="token directory (default: the config's)")
    parser.add_argument("--out", type=Path, default=None, help="JSON of the figures (default: print only)")
    args = parser.parse_args(argv)
    tier = tier_config(args.config)
    data_dir = args.data or layout.tokens_dir(tier["data"])
    if not (Path(data_dir) / "manifest.json").exists():
        sys.exit(
            f"{data_dir} holds no tokens: make them with `snakemake {data_dir}/manifest.json --cores 1 "
            f"--configfile {args.config}`"
        )
    doses = [float(d) for d in args.doses.split(",") if d]
    train = tier["train"]
    steps = args.steps or train["tokens"] // (train["batch_size"] * train["seq_len"]) // 2
    rows = []
    with execution.applied(execution.for_config(tier, threads=1)):
        for dose in doses:
            cfg = pilot_config(tier, args.shape, dose, steps)
            row = {"shape": args.shape, "dose": dose, **pilot(cfg, Path(data_dir), args.last, args.ratios)}
            rows.append(row)
            horizon = row.get("horizon")
            print(
                f"{args.shape} dose {dose:g}: live swallowed share {row['swallowed_share']:.3f} over steps 1-"
                f"{row['steps']}, {row['swallowed_share_last']:.3f} over its last {args.last} (loss "
                f"{row['final_loss']:.3f}, max |h| first/last boundary "
                + "/".join(f"{v:.3g}" for v in row["stream_absmax_first_last"])
                + f", {row['seconds']:.1f} s)"
                + (
                    f"; horizon {horizon['adds']} adds: start {horizon['stream_rms']:.4g}, mu "
                    f"{horizon['mu'] * horizon['stream_rms']:.4g} ({horizon['mu']:.3g} of it), sigma "
                    f"{horizon['sigma'] * horizon['stream_rms']:.4g} ({horizon['sigma']:.3g} of it)"
                    if horizon
                    else ""
                ),
                flush=True,
            )
    reached = [r["dose"] for r in rows if r["swallowed_share"] >= args.target]
    chosen = min(reached) if reached else None
    print(
        f"chosen dose: {chosen:g} (the smallest of {args.doses} reaching {args.target:.0%})"
        if chosen is not None
        else f"no dose of {args.doses} reaches {args.target:.0%}: try larger ones"
    )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"target": args.target, "chosen": chosen, "rows": rows}, indent=1))
    return 0 if chosen is not None else 1


if __name__ == "__main__":
    sys.exit(main())
