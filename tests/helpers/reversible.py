"""The reversible stream's shared test pieces: a plain StreamBack model and its reversible twin, a batch, the loss
and the gradient check."""

import dataclasses

import torch
import torch.nn.functional as F

from streamback.model.model import ModelArgs, Transformer

# derived: subtraction rebuilds each fp32 residual to one fp32 ulp (2^-24 = 6e-8 relative), carried through a block's
# backward: 1e-5 holds ~160 ulps
GRAD_RTOL = 1e-5
B, T, DIM, LAYERS = 2, 24, 64, 4
N = B * T * DIM  # elements of one residual


def pair(compute=torch.float32, layers=LAYERS, device="cpu"):
    """A plain StreamBack model and its reversible twin with the same weights."""
    args = ModelArgs(
        dim=DIM, n_layers=layers, n_heads=4, n_kv_heads=1, vocab_size=101, multiple_of=32, block="streamback"
    )
    plain = Transformer(args, compute)
    plain.init_weights(0)
    with torch.no_grad():  # larger stream values than the init's, so rebuilding has rounding to do
        plain.tok_embeddings.weight.mul_(30)
    twin = Transformer(dataclasses.replace(args, reversible=True), compute)
    twin.load_state_dict(plain.state_dict())
    return plain.to(device), twin.to(device)


def batch(seed=0, device="cpu"):
    """A batch of B sequences of T + 1 random tokens (inputs and targets)."""
    return torch.randint(0, 101, (B, T + 1), generator=torch.Generator().manual_seed(seed)).to(device)


def loss(model, tok):
    """The cross-entropy of `model` predicting each next token of `tok`."""
    return F.cross_entropy(model(tok[:, :-1]).flatten(0, 1), tok[:, 1:].flatten())


def assert_grads_close(plain, twin, rtol=GRAD_RTOL):
    """Every parameter's gradient of `twin` within `rtol` of `plain`'s, relative to its largest entry."""
    for (name, p), q in zip(plain.named_parameters(), twin.parameters()):
        error = ((p.grad - q.grad).abs().max() / p.grad.abs().max()).item()
        assert error <= rtol, (name, error)
