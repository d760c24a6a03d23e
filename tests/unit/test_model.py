"""The Llama 3 model: shapes and parameter counts, building blocks against references, init,
the residual stream's dtype at every layer boundary (eager, compiled, FSDP2) for every format,
and the bench command."""

import math

import pytest
import torch
import torch.nn.functional as F

from streamback.cli import main as cli_main
from streamback.config import DEFAULT_CONFIG, ROOT, load_config
from streamback.errors import StreambackError
from streamback.model.formats import StreamFormat
from streamback.model.model import (
    STREAM_POINTS,
    ModelArgs,
    Transformer,
    _RMSNormFunction,
    apply_rope,
    count_params,
    norm_gain_absmax,
    rope_tables,
)

from helpers.model import STREAMS, assert_stream, tiny, tokens

# --- shapes -----------------------------------------------------------------------------------


def test_paper_shapes_parameter_counts():
    """Counted by hand (vocabulary 128256, untied): per layer q,o: dim x 16*head_dim each; k,v:
    dim x 4*head_dim each; SwiGLU 3 x dim x hidden; two norms 2 x dim."""
    cfg = load_config(ROOT / "config" / "paper.yaml")["model"]
    expected = {
        # 80 x (2*1024*1024 + 2*1024*256 + 3*1024*2816 + 2*1024) + 2*128256*1024 + 1024
        "skinny-tall": (64, 2816, 80 * 11_274_240 + 262_668_288 + 1024),
        # 40 x (2*1512*1504 + 2*1512*376 + 3*1512*4096 + 2*1512) + 2*128256*1512 + 1512
        "medium": (94, 4096, 40 * 24_267_600 + 387_846_144 + 1512),
        # 20 x (2*2048*2048 + 2*2048*512 + 3*2048*5632 + 2*2048) + 2*128256*2048 + 2048
        "fat-short": (128, 5632, 20 * 45_092_864 + 525_336_576 + 2048),
    }
    for shape, (head_dim, hidden, total) in expected.items():
        args = ModelArgs.from_config(cfg, shape, 128256)
        with torch.device("meta"):
            model = Transformer(args)
        assert (args.head_dim, args.ffn_hidden_dim, count_params(model)) == (head_dim, hidden, total)
        assert count_params(model, exclude_embeddings=True) == total - 128256 * args.dim


def test_tiny_shapes_keep_the_trade_off():
    cfg = load_config(DEFAULT_CONFIG)["model"]
    blocks = {}
    for shape in ("tiny-skinny-tall", "tiny-medium", "tiny-fat-short"):
        args = ModelArgs.from_config(cfg, shape, 512)
        with torch.device("meta"):
            model = Transformer(args)
        blocks[shape] = (args.n_layers, args.dim, count_params(model) - 2 * 512 * args.dim - args.dim)
    layers, dims, params = zip(*blocks.values())
    assert layers == (8, 4, 2) and list(dims) == sorted(dims)
    assert all(3e5 < p < 5e5 for p in params) and max(params) / min(params) < 1.2


def test_ffn_hidden_matches_llama3_8b():
    # Llama 3 8B: dim 4096, ffn_dim_multiplier 1.3, multiple_of 1024 -> intermediate size 14336
    assert ModelArgs(4096, 1, 32, 8, 10, multiple_of=1024, ffn_dim_multiplier=1.3).ffn_hidden_dim == 14336


@pytest.mark.parametrize(
    "kw, words",
    [
        (dict(block="resnet"), "block"),
        (dict(n_heads=3, n_kv_heads=2), "multiple of n_kv_heads"),
        (dict(dim=60, n_heads=4), "even"),
        (dict(block="streamback", stream="fp12"), "fp12"),
        (dict(block="streamback", stream="bf16", reversible=True), "fp32"),
        (dict(block="baseline", reversible=True), "streamback"),
        (dict(dim=0), "dim"),
        (dict(embedding_init_std=0.0), "embedding_init_std must be a positive number"),
        (dict(embedding_init_std=4.0, tied_embeddings=True), "no effect with tied embeddings"),
    ],
)
def test_bad_model_args_are_named(kw, words):
    with pytest.raises(StreambackError, match=words):
        tiny(**kw)


def test_unknown_shape_is_named():
    with pytest.raises(StreambackError, match="huge.*tiny-medium"):
        ModelArgs.from_config(load_config(DEFAULT_CONFIG)["model"], "huge", 10)


def test_sequence_longer_than_max_seq_len_is_refused():
    model = Transformer(tiny(max_seq_len=8))
    with pytest.raises(StreambackError, match="max_seq_len"):
        model(torch.zeros(1, 9, dtype=torch.long))


# --- building blocks against references -------------------------------------------------------


def test_rmsnorm_forward_and_gradient():
    x = torch.randn(3, 5, 16, dtype=torch.float64, requires_grad=True)
    w = torch.randn(16, dtype=torch.float64, requires_grad=True)
    out = _RMSNormFunction.apply(x, w, 1e-5, torch.float64)
    # derived: two fp64 evaluations of one formula over 16 terms differ by a few 2^-53; fp64's default rtol 1e-7 holds
    # them
    torch.testing.assert_close(out, F.rms_norm(x, (16,), w, 1e-5))
    assert torch.autograd.gradcheck(lambda x, w: _RMSNormFunction.apply(x, w, 1e-5, torch.float64), (x, w))


def test_rope_matches_complex_rotation():
    """TorchTitan's formulation: view (x[2i], x[2i+1]) as complex, multiply by e^{i pos theta_i}."""
    x = torch.randn(2, 10, 3, 94)
    cos, sin = rope_tables(94, 10, 500000.0)
    freqs = 1.0 / 500000.0 ** (torch.arange(0, 94, 2).double() / 94)
    cis = torch.polar(torch.ones(10, 47, dtype=torch.float64), torch.outer(torch.arange(10).double(), freqs))
    reference = torch.view_as_real(torch.view_as_complex(x.double().unflatten(-1, (-1, 2))) * cis[:, None, :]).flatten(
        -2
    )
    # derived: fp32 angles (position x frequency <= 9 rad: 2^-24 x 9 = 5e-7) and 3 fp32 roundings of |x| ~ 4: ~2e-6;
    # 1e-5 holds 5x
    torch.testing.assert_close(apply_rope(x, cos, sin).double(), reference, atol=1e-5, rtol=1e-5)


def test_depth_scaled_init_and_seed():
    args = tiny(dim=256, n_heads=4, n_kv_heads=1, n_layers=4, multiple_of=256)
    model = Transformer(args, torch.float32)
    model.init_weights(seed=3)
    for i, layer in enumerate(model.layers):
        # TorchTitan depth_init: wo, w2, w3 ~ N(0, 0.02 / sqrt(2 (i + 1))); wq, wk, wv, w1 ~ N(0, 0.02)
        # derived: a sample std of n draws has relative sd 1/sqrt(2n): 0.003 for wo, wq (256 x 256) and w3; 0.0045 for
        # the
        # embeddings (97 x 256): 0.02 is 4.4 sd or more (seeded: the same draws on every CPU)
        assert layer.attention.wo.weight.std().item() == pytest.approx(0.02 / math.sqrt(2 * (i + 1)), rel=0.02)
        assert layer.feed_forward.w3.weight.std().item() == pytest.approx(0.02 / math.sqrt(2 * (i + 1)), rel=0.02)
        assert layer.attention.wq.weight.std().item() == pytest.approx(0.02, rel=0.02)
    assert model.tok_embeddings.weight.std().item() == pytest.approx(1.0, rel=0.02)
    out = model.output.weight
    # derived: 0.986 is the std of a normal truncated at 3 sd; 97 x 256 draws: relative sd 0.0045, 0.03 is 6.7 sd
    assert out.abs().max().item() <= 3 * 256**-0.5 and out.std().item() == pytest.approx(256**-0.5 * 0.986, rel=0.03)
    assert norm_gain_absmax(model) == {
        **{f"layers.{i}.{n}": 1.0 for i in range(4) for n in ("attention_norm", "ffn_norm")},
        "norm": 1.0,
    }
    again = Transformer(args, torch.float32)
    again.init_weights(seed=3)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))
    again.init_weights(seed=4)
    assert not torch.equal(model.layers[0].attention.wq.weight, again.layers[0].attention.wq.weight)


@pytest.mark.parametrize("block", ["baseline", "streamback"])
def test_embedding_init_std_scales_the_initial_stream_and_nothing_else(block):
    """The dose (model.embedding_init_std) multiplies the embedding's draws, so h_0, by its value
    and leaves every other parameter bit for bit; the first update, read through RMSNorm, stays
    as it was, so the update-to-stream ratio falls by the same factor."""
    dose = 32.0  # a power of two: scaling by it is exact in fp32 and bf16, so the checks below are too
    one, scaled = (Transformer(tiny(block=block, embedding_init_std=s)) for s in (1.0, dose))
    for model in (one, scaled):
        model.init_weights(seed=3)
    a, b = one.state_dict(), scaled.state_dict()
    assert torch.equal(b["tok_embeddings.weight"], dose * a["tok_embeddings.weight"])
    assert b["tok_embeddings.weight"].std() / a["tok_embeddings.weight"].std() == dose
    assert all(torch.equal(a[k], b[k]) for k in a if k != "tok_embeddings.weight")
    tok = tokens(one.args)
    with torch.no_grad(), one.capture(("residual", "attention")) as s1, scaled.capture(("residual", "attention")) as s2:
        one(tok), scaled(tok)

    def rms(x):
        return x.double().pow(2).mean().sqrt().item()

    assert torch.equal(s2["residual"][0], dose * s1["residual"][0])  # exact: h_0 is the scaled rows, rounded
    assert rms(s2["residual"][0]) / rms(s1["residual"][0]) == pytest.approx(dose, rel=1e-12)  # fp64 rms of exact x32
    # RMSNorm's eps (1e-5 against a mean square near 1 at dose 1) and the bf16 rounding of the
    # normed input move the first update by at most about one bf16 step relative: 2^-8
    first = rms(s2["attention"][0] - s1["attention"][0]) / rms(s1["attention"][0])
    assert first <= 2**-8
    ratio_one = rms(s1["attention"][0]) / rms(s1["residual"][0])
    ratio_scaled = rms(s2["attention"][0]) / rms(s2["residual"][0])
    assert ratio_one / ratio_scaled == pytest.approx(dose, rel=2**-8)  # the same one-step bound


def test_embedding_init_std_comes_from_the_section_or_the_shape():
    model_cfg = load_config(DEFAULT_CONFIG)["model"]
    assert model_cfg["embedding_init_std"] == 1.0  # TorchTitan's
    assert ModelArgs.from_config(model_cfg, "tiny-medium", 10).embedding_init_std == 1.0
    shapes = {**model_cfg["shapes"], "dosed": {**model_cfg["shapes"]["tiny-medium"], "embedding_init_std": 16}}
    cfg = {**model_cfg, "shapes": shapes, "embedding_init_std": 2.0}
    assert ModelArgs.from_config(cfg, "tiny-medium", 10).embedding_init_std == 2.0
    assert ModelArgs.from_config(cfg, "dosed", 10).embedding_init_std == 16.0


def test_a_model_built_on_the_meta_device_is_the_model_built_on_the_cpu():
    """Built on meta, moved with to_empty and initialised: the same weights and RoPE tables as a
    model built on the CPU with the same seed. Building it imports no torch._dynamo (a second of
    every process that only reads a model in; meta arithmetic goes through torch._refs)."""
    import subprocess
    import sys

    args = tiny()
    with torch.device("meta"):
        model = Transformer(args, torch.float32)
    assert all(t.is_meta for t in model.state_dict().values()) and model.rope_cos.is_meta
    model.to_empty(device="cpu")
    model.init_weights(seed=5)
    cpu = Transformer(args, torch.float32)
    cpu.init_weights(seed=5)
    for (name, a), b in zip(model.state_dict().items(), cpu.state_dict().values()):
        assert torch.equal(a, b), name
    assert torch.equal(model.rope_cos, cpu.rope_cos) and torch.equal(model.rope_sin, cpu.rope_sin)
    probe = (
        "import sys, torch\n"
        "from streamback.model.model import ModelArgs, Transformer\n"
        "with torch.device('meta'):\n"
        "    model = Transformer(ModelArgs(dim=64, n_layers=2, n_heads=4, n_kv_heads=1, vocab_size=97, multiple_of=32))\n"
        "model.to_empty(device='cpu')\n"
        "print('torch._dynamo' in sys.modules, 'sympy' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split() == [
        "False",
        "False",
    ]


def test_tied_embeddings_stay_tied_through_the_meta_device():
    """A tied model built on the meta device, moved with `to_empty` and initialised, has one
    matrix, as one built on the CPU (torch's own `to_empty` would give the output its own)."""
    with torch.device("meta"):
        model = Transformer(tiny(tied_embeddings=True))
    model.to_empty(device="cpu")
    assert model.output.weight is model.tok_embeddings.weight, "the tie was lost"
    assert not model.output.weight.is_meta
    model.init_weights(seed=3)
    cpu = Transformer(tiny(tied_embeddings=True))
    cpu.init_weights(seed=3)
    assert model.output.weight is model.tok_embeddings.weight
    assert count_params(model) == count_params(cpu)
    for (name, a), b in zip(model.state_dict().items(), cpu.state_dict().values()):
        assert torch.equal(a, b), name


def test_tied_embeddings_share_one_matrix():
    model = Transformer(tiny(tied_embeddings=True))
    assert model.output.weight is model.tok_embeddings.weight
    assert count_params(model) == count_params(Transformer(tiny())) - 97 * 64


# --- the two blocks ---------------------------------------------------------------------------


def test_baseline_is_streamback_with_a_bf16_stream():
    """The baseline block is exactly a bf16 stream (logits and gradients, bit for bit)."""
    base = Transformer(tiny())
    bf16 = Transformer(tiny(block="streamback", stream="bf16"))
    bf16.load_state_dict(base.state_dict())
    tok = tokens(base.args)
    for model in (base, bf16):
        model(tok).logsumexp(-1).mean().backward()
    # exact
    torch.testing.assert_close(base(tok), bf16(tok), rtol=0, atol=0)
    for p, q in zip(base.parameters(), bf16.parameters()):
        assert torch.equal(p.grad, q.grad)


def test_fp32_stream_is_closer_to_fp32_compute_than_bf16_stream():
    """With bf16 sublayers, only the stream differs: the fp32 stream stays nearer an all-fp32 model."""
    args = tiny(n_layers=6)
    reference = Transformer(args, torch.float32)
    tok = tokens(args, seq=32)
    errors = {}
    for block in ("baseline", "streamback"):
        model = Transformer(tiny(n_layers=6, block=block))
        model.load_state_dict(reference.state_dict())
        with model.capture(("residual",), fn=lambda h: h.abs().amax()) as stream:
            errors[block] = (model(tok) - reference(tok)).abs().max().item()
        assert len(stream["residual"]) == 7 and all(m.ndim == 0 for m in stream["residual"])
    assert errors["streamback"] < errors["baseline"]


# --- the stream's dtype at every layer boundary -----------------------------------------------


@pytest.mark.parametrize("stream", STREAMS)
def test_stream_dtype_eager(stream, device):
    with torch.device(device):
        model = Transformer(tiny(block="streamback", stream=stream))
    with model.capture(("residual",)) as seen:
        model(tokens(model.args).to(device)).sum().backward()
    assert_stream(seen["residual"], StreamFormat.parse(stream), 2)
    grad = model.layers[0].attention.wq.weight.grad
    assert grad.dtype == torch.float32 and bool(grad.isfinite().all()) and grad.abs().sum() > 0


def test_baseline_stream_dtype_is_the_compute_dtype():
    for compute in (torch.bfloat16, torch.float32):
        model = Transformer(tiny(), compute)
        with model.capture(("residual",)) as seen:
            model(tokens(model.args))
        assert {h.dtype for h in seen["residual"]} == {compute}


def test_apply_fsdp_refuses_a_param_dtype_other_than_the_compute_dtype():
    from streamback.train.parallel import apply_fsdp

    with pytest.raises(StreambackError, match="compute dtype"):
        apply_fsdp(Transformer(tiny()), param_dtype=torch.float16)


# --- the bench command ------------------------------------------------------------------------


def test_the_median_interval_is_the_binomial_one():
    """bench's distribution-free interval of the median: the widest pair of order statistics whose
    coverage, by scipy's binomial distribution, is at least 95%."""
    from scipy.stats import binom

    from streamback.measure.bench import median_interval, median_noise

    for n in range(1, 41):
        times = [float(k) for k in range(n, 0, -1)]  # sorted: x_(j) = j
        got = median_interval(times)
        covering = [j for j in range(1, n // 2 + 1) if binom.cdf(n - j, n, 0.5) - binom.cdf(j - 1, n, 0.5) >= 0.95]
        assert got == ((max(covering), n + 1 - max(covering)) if covering else None), n
    assert median_interval([1.0] * 5) is None and median_interval(list(range(1, 11))) == (2, 9)
    # exact: the median deviation is 0 (approx's 1e-12 absolute only admits -0.0 and fp64 noise)
    assert median_noise([1.0, 1.0, 1.0, 1.0, 1.0, 1.2, 0.8, 1.0, 1.0, 1.0]) == pytest.approx(0.0)


def test_bench_refuses_unknown_names(tmp_path):
    assert cli_main(["bench", "--shapes", "gigantic", "--out", str(tmp_path / "b.json")]) == 2
    assert not (tmp_path / "b.json").exists()


# --- the one way to read the stream: Transformer.capture ---------------------------------------


def test_capture_gives_every_residual_and_delta_and_their_gradients():
    model = Transformer(tiny(block="streamback", n_layers=3))
    tok = tokens(model.args)
    with model.capture(grad=True) as stream:
        model(tok).logsumexp(-1).mean().backward()
    assert [len(stream[p]) for p in STREAM_POINTS] == [4, 3, 3, 3]
    add = model.stream_format.add
    with torch.no_grad():
        for i in range(3):  # h_i -> mid_i = h_i + attention_i -> h_{i+1} = mid_i + feed_forward_i, bit for bit
            assert torch.equal(stream["mid"][i], add(stream["residual"][i], stream["attention"][i]))
            assert torch.equal(stream["residual"][i + 1], add(stream["mid"][i], stream["feed_forward"][i]))
    assert {h.dtype for h in stream["residual"] + stream["mid"]} == {torch.float32}
    assert {d.dtype for d in stream["attention"] + stream["feed_forward"]} == {torch.bfloat16}
    assert all(h.grad is not None and h.grad.shape == h.shape and h.grad.abs().sum() > 0 for h in stream["residual"])
    # the reversible stream's forward is the same; the capture reads it through ReversibleStream.step
    twin = Transformer(tiny(block="streamback", n_layers=3, reversible=True))
    twin.load_state_dict(model.state_dict())
    with twin.capture(("residual", "feed_forward")) as again:
        twin(tok)
    assert all(torch.equal(a.detach(), b) for a, b in zip(stream["residual"], again["residual"]))
    assert all(torch.equal(a, b) for a, b in zip(stream["feed_forward"], again["feed_forward"]))
    with pytest.raises(KeyError):
        again["mid"]
    with model.capture(("residual",)), pytest.raises(RuntimeError, match="already active"):
        with model.capture():
            pass
