"""Accuracy of the reversible stream: per-layer reconstruction error and the gradient error.

For a StreamBack model (fp32 stream), runs a forward pass keeping every residual h_i and mid_i,
rebuilds them from the top one as the reversible stream does (`streamback.reversible.step_back`),
and prints per layer: max |h_i| and the worst rebuild error of the layer's two residuals, in
absolute terms and in units of the fp32 spacing (ulp) at max |h_i|. Then the gradient error the reversible stream
causes (reversible model vs the plain one: same weights, tokens and compute dtype), per layer,
next to the gradient difference between the baseline (bf16 stream) and StreamBack models, the
effect the study measures (with --compute fp32 the baseline's stream is fp32 too, so that
column is 0). Gradient errors are max |difference| / max |gradient| over each layer's parameters.

    python benchmarks/reversible_error.py                       # tiny-skinny-tall, random init
    python benchmarks/reversible_error.py --n-layers 80          # the skinny-tall depth, tiny width
    python benchmarks/reversible_error.py --stream-scale 100     # a stream reaching ~+-500
    python benchmarks/reversible_error.py --checkpoint results/runs/<run>/model.pt
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from streamback.config import DEFAULT_CONFIG, load_config  # noqa: E402
from streamback.model.model import ModelArgs, Transformer  # noqa: E402
from streamback.model.reversible import forward_residuals, step_back  # noqa: E402
from streamback.model.rounding import FP32, ulp  # noqa: E402
from streamback.model.weights import read_model  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def build(args) -> tuple[ModelArgs, dict]:
    if args.checkpoint:
        trained = read_model(args.checkpoint)
        return dataclasses.replace(trained.args, block="streamback", stream="fp32", reversible=False), trained.state
    cfg = load_config(args.config)["model"]
    margs = ModelArgs.from_config(cfg, args.shape, args.vocab_size, block="streamback")
    if args.n_layers:
        margs = dataclasses.replace(margs, n_layers=args.n_layers)
    model = Transformer(margs)
    model.init_weights(args.seed)
    with torch.no_grad():
        model.tok_embeddings.weight.mul_(args.stream_scale)
    return margs, model.state_dict()


def layer_grads(model: Transformer, tokens: torch.Tensor) -> list[torch.Tensor]:
    model.zero_grad(set_to_none=True)
    logits = model(tokens[:, :-1])
    F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()).backward()
    return [torch.cat([p.grad.flatten() for p in layer.parameters()]) for layer in model.layers]


def rel_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    parser.add_argument("--shape", default="tiny-skinny-tall")
    parser.add_argument("--n-layers", type=int, default=None, help="override the shape's depth")
    parser.add_argument(
        "--checkpoint",
        type=Path,
        default=None,
        help="a trained model (export-hf's input format) instead of random init",
    )
    parser.add_argument(
        "--stream-scale", type=float, default=1.0, help="multiply the embedding (the stream's start) by this"
    )
    parser.add_argument("--compute", choices=list(DTYPES), default="bf16")
    parser.add_argument("--vocab-size", type=int, default=512)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    margs, state = build(args)
    compute = DTYPES[args.compute]
    models = {}
    for name, block, reversible in (
        ("plain", "streamback", False),
        ("reversible", "streamback", True),
        ("baseline", "baseline", False),
    ):
        models[name] = Transformer(dataclasses.replace(margs, block=block, reversible=reversible), compute)
        models[name].load_state_dict(state)
    tokens = torch.randint(
        0, margs.vocab_size, (args.batch, args.seq_len + 1), generator=torch.Generator().manual_seed(args.seed)
    )

    slots, deltas = forward_residuals(models["plain"], tokens[:, :-1])
    rebuilt = [slots[-1]]
    for delta in reversed(deltas):
        rebuilt.append(step_back(rebuilt[-1], delta))
    rebuilt.reverse()
    grads = {name: layer_grads(model, tokens) for name, model in models.items()}

    print(
        f"{margs.n_layers} layers x {margs.dim}, compute {args.compute}, tokens {args.batch}x{args.seq_len}, stream "
        f"scale {args.stream_scale}"
    )
    print(f"{'layer':>5} {'max|h|':>10} {'rebuild err':>12} {'ulps':>6} {'grad err rev':>13} {'baseline vs sb':>15}")
    worst = {"ulps": 0.0, "rev": 0.0, "ref": float("inf")}
    for i in range(margs.n_layers):
        pair = (2 * i, 2 * i + 1)
        hmax = max(float(slots[k].abs().max()) for k in pair)
        err = max(float((rebuilt[k] - slots[k]).abs().max()) for k in pair)
        ulps = err / float(ulp(torch.tensor(hmax), FP32))
        rev = rel_error(grads["reversible"][i], grads["plain"][i])
        ref = rel_error(grads["baseline"][i], grads["plain"][i])
        worst = {"ulps": max(worst["ulps"], ulps), "rev": max(worst["rev"], rev), "ref": min(worst["ref"], ref)}
        print(f"{i:>5} {hmax:>10.3g} {err:>12.3g} {ulps:>6.2f} {rev:>13.3g} {ref:>15.3g}")
    print(
        f"worst rebuild error {worst['ulps']:.2f} fp32 ulps of max|h|; worst gradient error {worst['rev']:.3g} "
        f"(relative); smallest baseline-vs-StreamBack gradient difference {worst['ref']:.3g}"
    )


if __name__ == "__main__":
    main()
