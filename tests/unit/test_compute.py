"""bf16 compute on fp32 kernels (streamback/model/compute.py) against native bf16 kernels, and both against fp64.

The criterion that separates reduction-order noise from a skipped or added rounding, op by op:
every GEMM and attention call of a native run (forward and backward) is replayed on its own
inputs on both paths, and each GEMM output's relative error against fp64 on the same bf16 inputs
must equal the native kernel's to within ERROR_BUDGET (measured: 0.0%); the same GEMM with its
output unrounded has 5e-5 of native's error. Attention keeps what a flash kernel rounds inside
in fp32 (streamback/model/compute.py), so its error is at most native's (measured 0.56-0.93x),
its outputs and gradients rounded to bf16; unrounded, its output would have 4e-5 of native's.

The whole trained model holds each path to fp64, not the paths to each other: the rounding model (every point
where bf16 compute rounds, in an fp64 copy of the model: `rounding_points`) gives the loss a bound from the
roundings (`loss_error_bound`) and the gradients an expected error (`simulated_gradient_errors`), neither of
which depends on the order in which a kernel sums, so they hold on any CPU's kernels (issue 63).
"""

import contextlib
import math
from unittest import mock

import pytest
import torch
import torch.nn.functional as F

from streamback.model import compute
from streamback.model import model as model_module
from streamback.model.formats import StreamFormat
from streamback.model.model import FeedForward, ModelArgs, RMSNorm, Transformer
from streamback.model.rounding import BF16, ulp

from helpers.data import windows

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.kernels,
]  # kernels: CI reruns them on the other kernel path (.ci/run)
# |error / native error - 1| for the same rounding points. measured: 0.0% on native, emulated and the AVX2 caps of an
# AMD EPYC, margin 0.02: the same GEMM's two outputs differ only where fp32 summation order flips a bf16 rounding
# (a fraction of order sqrt(k) 2^-24 / 2^-8 < 10^-3 of them, k <= 192), while a skipped rounding moves it by ~100%
ERROR_BUDGET = 0.02


def micro(block="baseline", stream="fp32", vocab=300):
    return ModelArgs(
        dim=64,
        n_layers=3,
        n_heads=4,
        n_kv_heads=1,
        vocab_size=vocab,
        multiple_of=32,
        max_seq_len=64,
        block=block,
        stream=stream,
    )


def trained(tokens_dir, steps=40, **kw):
    """A micro model after `steps` AdamW steps on real windows (native kernels)."""
    model = Transformer(micro(**kw))
    model.init_weights(0)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    with compute.use("native"):
        for step in range(steps):
            batch = windows(tokens_dir, 8, 32, seed=step)
            opt.zero_grad()
            model(batch[:, :-1], targets=batch[:, 1:]).backward()
            opt.step()
    return model


def record_ops(model, batch):
    """Every compute.linear / compute.attention call of one native forward + backward: the inputs
    (bf16, as the kernels got them), the keyword arguments and the gradient of the output."""
    calls, originals = [], (compute.linear, compute.attention)

    def recording(fn, kind):
        def call(*args, **kwargs):
            out = fn(*args, **kwargs)
            entry = {"kind": kind, "args": [a.detach().to(out.dtype) for a in args if a is not None], "kwargs": kwargs}
            out.register_hook(lambda grad: entry.__setitem__("grad", grad.detach()))
            calls.append(entry)
            return out

        return call

    compute.linear, compute.attention = recording(originals[0], "linear"), recording(originals[1], "attention")
    try:
        with compute.use("native"):
            model(batch[:, :-1], targets=batch[:, 1:]).backward()
    finally:
        compute.linear, compute.attention = originals
    assert {c["kind"] for c in calls} == {"linear", "attention"} and all("grad" in c for c in calls)
    return calls


def skip_gemm_rounding(x, w):
    return F.linear(x.float(), w.float())  # the fp32 result, not rounded to bf16


def skip_attention_rounding(q, k, v, **kwargs):
    return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), **kwargs)  # the fp32 result, not rounded


def replay(fn, call, mode, dtype=None):
    """[output, *input gradients] of `fn` on the call's inputs (as `dtype`), backward from its recorded gradient."""
    inputs = [None if a is None else a.to(dtype or a.dtype, copy=True).requires_grad_(True) for a in call["args"]]
    with compute.use(mode):
        out = fn(*inputs, **call["kwargs"])
        out.backward(call["grad"].to(out.dtype))
    return [out.detach(), *(i.grad for i in inputs if i is not None)]


def relative_errors(calls):
    """{(op, which, path): relative L2 error against fp64} over all calls, for native, emulated and the skipped-rounding
    control."""
    sums = {}
    for call in calls:
        op = compute.linear if call["kind"] == "linear" else compute.attention
        reference = F.linear if call["kind"] == "linear" else F.scaled_dot_product_attention
        truth = replay(reference, call, "native", torch.float64)
        paths = {
            "native": replay(op, call, "native"),
            "emulated": replay(op, call, "emulated"),
            "skipped": replay(
                skip_gemm_rounding if call["kind"] == "linear" else skip_attention_rounding, call, "native"
            ),
        }
        for name, results in paths.items():
            for which, (got, true) in enumerate(zip(results, truth)):
                if name != "skipped":
                    assert got.dtype == torch.bfloat16, (call["kind"], which, name)  # on the bf16 grid
                err, norm = sums.get((call["kind"], which, name), (0.0, 0.0))
                sums[(call["kind"], which, name)] = (
                    err + float((got.double() - true).pow(2).sum()),
                    norm + float(true.pow(2).sum()),
                )
    return {key: math.sqrt(err / norm) for key, (err, norm) in sums.items()}


# --- the rounding model of bf16 compute, in fp64: what the whole-model test holds each kernel path to ---
FP32_U = 2.0**-24  # fp32's unit roundoff
LAMBDA = 6.0  # Hoeffding: P(|loss error| > LAMBDA * sqrt(sum c_i^2)) <= 2 exp(-LAMBDA^2 / 2) = 3e-8


def gamma(k):
    """Higham's gamma_k = k u / (1 - k u) for fp32: |fl(sum of k terms) - sum| <= gamma_k sum |terms|, any order."""
    return k * FP32_U / (1 - k * FP32_U)


def half_ulp(y):
    """Half bf16's spacing at each |y|: the most round-to-nearest to bf16 moves y (at most 2^-8 |y|)."""
    return ulp(y.detach(), BF16) / 2


class RoundingPoints:
    """`tap(y, acc=None, rounds=True)` at each point where bf16 compute rounds a forward value (in an fp64 model).

    Recording (no generator): keeps y, the loss's gradient at y and `acc`, a bound on the fp32 accumulation error a
    kernel may make there in any order of summation. Simulating (a generator): moves y, and on the backward pass its
    gradient, by a uniform draw within half a bf16 ulp, as a round-to-nearest of a value with random low bits does.
    """

    def __init__(self, generator=None):
        self.entries, self.generator = [], generator

    def noise(self, y):
        return (2 * torch.rand(y.shape, generator=self.generator, dtype=y.dtype) - 1) * half_ulp(y)

    def noise_added(self, y):
        return y + self.noise(y)

    def __call__(self, y, acc=None, rounds=True):
        if self.generator is not None:
            if rounds:
                y = self.noise_added(y)
                y.register_hook(self.noise_added)
            return y
        entry = {"y": y.detach(), "acc": acc, "rounds": rounds}
        y.register_hook(lambda g: entry.__setitem__("g", g.detach()))
        self.entries.append(entry)
        return y


@contextlib.contextmanager
def rounding_points(tap):
    """An fp64 model's forward with `tap` at every point where the baseline's bf16 compute rounds: each GEMM's
    output, RoPE's, each norm's, SiLU's and the SwiGLU product, each stream add (the baseline's stream is bf16),
    and attention's probabilities (native's flash kernel rounds them to bf16 before they multiply v) and output;
    with the fp32 accumulation bounds of the GEMMs, the attention's scores and sums, the norms and RoPE."""
    rope, norm, add = model_module.apply_rope, RMSNorm.forward, StreamFormat.add

    def linear(x, weight, bias=None):
        w = weight.to(x.dtype)
        return tap(F.linear(x, w, bias), gamma(x.shape[-1]) * F.linear(x.detach().abs(), w.detach().abs()))

    def attention(q, k, v, *, is_causal=False, attn_mask=None, scale=None):
        assert is_causal and attn_mask is None and scale is None  # what the model asks for
        D, T = q.shape[-1], q.shape[-2]
        scores = q @ k.transpose(-2, -1) * D**-0.5
        bound = gamma(D + 1) * (q.detach().abs() @ k.detach().abs().transpose(-2, -1)) * D**-0.5
        scores = tap(scores, bound, rounds=False).masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), -math.inf)
        p = torch.softmax(scores, -1)
        p = tap(p, gamma(T + 2) * p.detach())  # the exponentials' normaliser: a sum of T terms
        return tap(p @ v, gamma(T) * (p.detach() @ v.detach().abs()))

    def rope_tapped(x, cos, sin):
        pairs = x.detach().abs().unflatten(-1, (-1, 2)).sum(-1, keepdim=True)  # |x0| + |x1| >= |x0 cos -+ x1 sin|
        return tap(rope(x, cos, sin), gamma(3) * pairs.expand(*pairs.shape[:-1], 2).flatten(-2))

    def norm_tapped(self, x, dtype):
        y = norm(self, x, dtype)
        return tap(y, gamma(x.shape[-1] + 4) * y.detach().abs())  # the mean of squares, rsqrt and two products

    def feed_forward(self, x):  # FeedForward.forward, each bf16 op's output tapped
        gate = self.w1(x)
        return self.w2(tap(tap(F.silu(gate), gamma(4) * gate.detach().abs()) * self.w3(x)))

    def add_tapped(self, h, delta):
        return tap(add(self, h, delta))

    with (
        mock.patch.object(compute, "linear", linear),
        mock.patch.object(compute, "attention", attention),
        mock.patch.object(model_module, "apply_rope", rope_tapped),
        mock.patch.object(RMSNorm, "forward", norm_tapped),
        mock.patch.object(FeedForward, "forward", feed_forward),
        mock.patch.object(StreamFormat, "add", add_tapped),
    ):
        yield


def fp64_copy(model):
    copy = Transformer(micro(), compute_dtype=torch.float64)
    copy.load_state_dict(model.state_dict())
    return copy.double()


def loss_error_bound(model, batch):
    """(fp64 loss, parameter gradients, a bound on any bf16 path's loss error): first order in the roundings,
    each rounding i moving the loss by g_i * e_i, |e_i| <= c_i = half a bf16 ulp of its value (weights cast to bf16
    included) plus its fp32 accumulation bound; as independent mean-zero errors (the standard probabilistic model,
    Higham & Mary 2019), Hoeffding bounds their sum by LAMBDA * sqrt(sum (g_i c_i)^2). The fp32 loss itself
    (log-softmax over V logits, the mean over N tokens) adds at most gamma_(V+1) + 3u (|lse| + |z_t|) + gamma_N L.
    No term depends on the order in which a kernel sums: each accumulation is bounded by gamma_k for any order."""
    copy, points = fp64_copy(model), RoundingPoints()
    with rounding_points(points):
        loss = copy(batch[:, :-1], targets=batch[:, 1:])
        loss.backward()
    sum_c2 = sum(float((p.grad * half_ulp(p)).pow(2).sum()) for p in copy.parameters())
    for e in points.entries:
        c = (half_ulp(e["y"]) if e["rounds"] else 0) + (0 if e["acc"] is None else e["acc"])
        sum_c2 += float((e["g"] * c).pow(2).sum())
    logits, targets = points.entries[-1]["y"].flatten(0, 1), batch[:, 1:].flatten()  # the last tap: the logits
    lse, picked = torch.logsumexp(logits, -1), logits.gather(1, targets[:, None])[:, 0]
    fp32_loss = gamma(logits.shape[1] + 1) + 3 * FP32_U * float((lse.abs() + picked.abs()).mean())
    fp32_loss += gamma(len(targets)) * float(loss.detach())
    return float(loss.detach()), [p.grad.detach() for p in copy.parameters()], LAMBDA * math.sqrt(sum_c2) + fp32_loss


def simulated_gradient_errors(model, batch, truth, draws=4):
    """Each draw's [(squared error, squared norm)] per parameter tensor of the fp64 gradients under the rounding
    model (`RoundingPoints`, simulating): every rounding point of the forward pass, each weight's cast to bf16, the
    gradient at each rounded value and each weight's gradient moved by a uniform draw within half a bf16 ulp."""
    results = []
    for draw in range(draws):
        copy, points = fp64_copy(model), RoundingPoints(torch.Generator().manual_seed(draw))
        with torch.no_grad():
            for p in copy.parameters():
                p += points.noise(p)
        for p in copy.parameters():
            p.register_hook(points.noise_added)  # the weight gradient, bf16 where the cast is
        with rounding_points(points):
            copy(batch[:, :-1], targets=batch[:, 1:]).backward()
        results.append(
            [(float((p.grad - t).pow(2).sum()), float(t.pow(2).sum())) for p, t in zip(copy.parameters(), truth)]
        )
    return results


@pytest.mark.parametrize("model_of", ["random", "trained"])
def test_every_op_rounds_where_native_bf16_rounds(model_of, tokens):
    """Forward and backward of each GEMM and attention: the emulated GEMMs' error against fp64 is
    the native kernel's (rounding order aside), attention's at most native's; skipping an output
    rounding is caught."""
    model = trained(tokens) if model_of == "trained" else Transformer(micro())
    if model_of == "random":
        model.init_weights(3)
    calls = record_ops(model, windows(tokens, 8, 48, seed=99))
    errors = relative_errors(calls)
    for (op, which, name), error in errors.items():
        ratio = error / errors[(op, which, "native")]
        what = f"{op} {['output', 'gradient 0', 'gradient 1', 'gradient 2'][which]}: {ratio:.4f}x native's error"
        if name == "emulated" and op == "linear":
            assert abs(ratio - 1) <= ERROR_BUDGET, what
        elif name == "emulated":
            assert 0.5 <= ratio <= 1 + ERROR_BUDGET, what  # measured: 0.56-0.93 (module docstring), margin 1.1x below
    # the control: a GEMM's or the attention's output unrounded is far more accurate than either path (derived: fp32's
    # unit roundoff is 2^-16 of bf16's, plus gamma_k of the summation: measured 4e-5 to 5e-5 of native's, 0.01 holds
    # 200x)
    assert errors[("linear", 0, "skipped")] < 0.01 * errors[("linear", 0, "native")]
    assert errors[("attention", 0, "skipped")] < 0.01 * errors[("attention", 0, "native")]


def test_a_trained_model_s_loss_and_gradients_agree_to_rounding_order(tokens):
    """The whole model, trained, on each kernel path: the loss within its rounding bound of fp64 compute's, and the
    parameter gradients' error against fp64 the rounding model's, simulated in fp64. Both bounds come from the
    roundings at the values of this model and batch, so neither depends on the order in which a CPU's kernels
    sum (issue 63: native and emulated differed by 1.04e-4 relative on a Xeon, past a fixed 1e-4 between them)."""
    model = trained(tokens)
    batch = windows(tokens, 8, 48, seed=5)
    fp64_loss, truth, bound = loss_error_bound(model, batch)
    simulated = simulated_gradient_errors(model, batch, truth, draws=8)
    results = {}
    for name, dtype, mode in (
        ("native", torch.bfloat16, "native"),
        ("emulated", torch.bfloat16, "emulated"),
        ("fp32", torch.float32, "native"),
    ):
        copy = Transformer(micro(), compute_dtype=dtype)
        copy.load_state_dict(model.state_dict())
        with compute.use(mode):
            loss = copy(batch[:, :-1], targets=batch[:, 1:])
            loss.backward()
        results[name] = (float(loss.detach()), [p.grad.double() for p in copy.parameters()])

    names = [name for name, _ in model.named_parameters()]
    norms = [i for i, name in enumerate(names) if "norm" in name]
    matrices = [i for i, name in enumerate(names) if "norm" not in name]

    def pick(items, tensors):
        return items[tensors] if isinstance(tensors, slice) else [items[i] for i in tensors]

    def error(grads, tensors=slice(None)):
        pairs = pick(list(zip(grads, truth)), tensors)
        return math.sqrt(
            sum(float((g - t).pow(2).sum()) for g, t in pairs) / sum(float(t.pow(2).sum()) for _, t in pairs)
        )

    def simulated_error(tensors=slice(None)):  # the mean over the draws
        draws = [pick(d, tensors) for d in simulated]
        return sum(math.sqrt(sum(e for e, _ in d) / sum(n for _, n in d)) for d in draws) / len(draws)

    for name in ("native", "emulated"):
        loss, grads = results[name]
        # derived: Hoeffding's bound on the sum of every rounding's first-order effect (loss_error_bound), which
        # fails with probability <= 3e-8 under the rounding model; 0.08-0.11 of it on every path of an AMD EPYC
        # (native, emulated, ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2); GEMM outputs rounded to 3 bits fail it
        assert abs(loss - fp64_loss) <= bound, (name, loss, fp64_loss, bound)
        # measured: the gradients' error is 0.92-0.97 of the simulated rounding model's on those paths of an AMD EPYC
        # and with ATEN_CPU_CAPABILITY=avx2 alone (8 draws; they spread +-4%), margin 1.2x below and 1.3x above:
        # fp16 compute (0.13) and GEMM outputs rounded to 5 bits (2.24) fail it; one bit fewer (1.24-1.32) is at its
        # edge
        ratio = error(grads) / simulated_error()
        assert 3 / 4 <= ratio <= 5 / 4, (name, ratio)
        # measured: each weight matrix's 0.55-1.23 of the model's there, margin 1.6x; the norm gains (64 entries each,
        # too few alone) together 1.13-1.24, margin 1.6x
        for i in matrices:
            ratio = error(grads, slice(i, i + 1)) / simulated_error(slice(i, i + 1))
            assert 1 / 3 <= ratio <= 3, (name, names[i], ratio)
        ratio = error(grads, norms) / simulated_error(norms)
        assert 1 / 2 <= ratio <= 2, (name, "norm gains", ratio)
    # derived: fp32 compute rounds at the same points with 2^-16 of bf16's unit roundoff
    assert error(results["fp32"][1]) < 1e-3 * error(results["native"][1])
