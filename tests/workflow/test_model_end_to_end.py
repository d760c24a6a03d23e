"""The end-to-end half of test_model.py (commands run as processes, compiled or multi-process runs, Snakemake): the same
subjects, at the pace of whole runs."""

import json

import pytest
import torch

from streamback.cli import main as cli_main
from streamback.config import DEFAULT_CONFIG, load_config
from streamback.model.formats import StreamFormat
from streamback.model.model import ModelArgs, Transformer, norm_gain_absmax
from streamback.train.parallel import apply_compile

# process_group: a fixture
from helpers.model import COMPILED_STREAMS, STREAMS, assert_stream, process_group, tiny, tokens  # noqa: F401


@pytest.mark.slow
def test_stream_dtype_compiled():
    """Per-block torch.compile (the trainer's) for every format, through dynamo and AOT autograd
    with inductor's decompositions and partitioner (`aot_eager_decomp_partition`: inductor
    without code generation, which keeps the graph's dtypes; inductor itself runs in
    test_reversible.py). Forward passes: the stream's dtype is a forward property."""
    for stream in ["baseline", *STREAMS]:
        args = tiny() if stream == "baseline" else tiny(block="streamback", stream=stream)
        model = Transformer(args)
        apply_compile(model, backend="aot_eager_decomp_partition")
        with torch.no_grad(), model.capture(("residual",)) as seen:
            model(tokens(args))
        assert_stream(seen["residual"], model.stream_format, 2)
        assert model.stream_format == (StreamFormat("bf16") if stream == "baseline" else StreamFormat.parse(stream))
    torch._dynamo.reset()


@pytest.mark.slow
@pytest.mark.parametrize("stream", COMPILED_STREAMS)
def test_compiled_blocks_round_as_eager(stream, device):
    """Inductor (apply_compile, per block) rounds where eager does. Each compiled block is fed the
    eager run's input to it and its output compared with the eager block's: they may differ
    only by rounding-order noise (fp32 reductions and transcendentals evaluated in another order
    flip a rounding now and then), so in at most a tenth as many elements as the same blocks
    compiled without emulate_precision_casts, which skip bf16 roundings inside each block (the
    control, measured in the same test on the same device). No absolute bound: in an fp32 stream
    one flipped rounding reaches a token's every element, so the noise depends on how alike the
    two GEMMs sum. Measured (baseline; fp32 stream), eager against compiled vs the control: AVX512-
    BF16 CPU 4.6e-6 vs 4.7e-3; 0 vs 0.55. AVX2 (ONEDNN_MAX_CPU_ISA=AVX2), bf16 on fp32 kernels
    (streamback.model.compute, auto there) 4.6e-6 vs 2.1e-2; 1.8e-4 vs 1.0; AVX2 forced onto torch's
    own bf16 GEMM 4.6e-6 vs 4.7e-3; 4.2e-3 vs 0.55. Judging one block at a time keeps the noise from
    compounding through the layers (whole-model logits: CPU 21 vs 4,536 of 49,664; CUDA 134-249 vs
    4,336). Every output is on the stream's grid in its dtype, stochastic streams included."""
    if device.type == "cpu" and stream not in ("baseline", "fp32"):
        pytest.skip(
            "Inductor on the CPU: the paper's two blocks only (the dtype of every format: test_stream_dtype_compiled)"
        )
    args = ModelArgs(
        dim=106,
        n_layers=4,
        n_heads=4,
        n_kv_heads=1,
        vocab_size=97,
        multiple_of=32,
        max_seq_len=128,
        block="baseline" if stream == "baseline" else "streamback",
        stream="fp32" if stream == "baseline" else stream,
    )
    tok = torch.randint(0, 97, (4, 128), generator=torch.Generator().manual_seed(0)).to(device)

    def build():
        with torch.device(device):
            model = Transformer(args)
        model.init_weights(0)
        return model

    eager = build()
    with torch.no_grad(), eager.capture(("residual",)) as stream_values:
        eager(tok)
    h = stream_values["residual"]
    cos, sin = eager.rope_cos[:128], eager.rope_sin[:128]
    fmt = eager.stream_format

    def differing(compile_blocks) -> float:
        torch._dynamo.reset()
        model = build()
        compile_blocks(model)
        differ = 0
        with torch.no_grad():
            for i, layer in enumerate(model.layers):
                out = layer(h[i], cos, sin)
                assert out.dtype == fmt.container_dtype and fmt.is_representable(out), (stream, i)
                differ += int((out != h[i + 1]).sum())
        return differ / (len(model.layers) * h[0].numel())

    emulated = differing(apply_compile)
    if fmt.rounding == "stochastic":
        return  # draws differ by design; the grid and dtype were checked
    skipped = differing(lambda model: [layer.compile(backend="inductor") for layer in model.layers])
    torch._dynamo.reset()
    assert emulated <= skipped / 10, (
        f"{stream}: {emulated:.2e} of the elements differ, {skipped:.2e} with roundings skipped"
    )


@pytest.mark.filterwarnings("error:FSDP2-wrapped module")
def test_fsdp_stream_dtype(process_group):
    """FSDP2 (apply_fsdp, bf16 params, fp32 reduce): every format keeps its dtype at every block
    boundary, and gradients reach the fp32 master weights, also compiled per block and then
    sharded (the trainer's order; the paper's two blocks). FSDP2's default policy would not.
    No block returns a view (FSDP2 warns, as an error here: an in-place op on one would drop its
    pre-backward hook; the MX and NVFP4 quantisers returned one until formats._StraightThrough
    gave them tensors of their own), and every parameter's gradient under FSDP2 is the
    single-process one, bit for bit, in those formats."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from streamback.train.parallel import StreamDtypeWatch, apply_fsdp

    backend = (
        "inductor" if process_group.type == "cuda" else "aot_eager_decomp_partition"
    )  # no codegen on the CPU: quick
    for stream in ("mxfp8", "nvfp4"):
        plain = Transformer(tiny(block="streamback", stream=stream))
        sharded = Transformer(plain.args)
        sharded.load_state_dict(plain.state_dict())
        apply_fsdp(sharded)
        tok = tokens(plain.args, seq=17).to(process_group)
        for model in (plain, sharded):
            model(tok[:, :-1], targets=tok[:, 1:]).backward()
        for (name, p), q in zip(plain.named_parameters(), sharded.parameters(), strict=True):
            assert torch.equal(p.grad, q.grad.full_tensor()), (stream, name)
    for stream, compiled in [
        ("baseline", False),
        *((s, False) for s in STREAMS),
        ("baseline", True),
        ("fp32", True),
        ("mxfp8", True),
    ]:
        args = tiny() if stream == "baseline" else tiny(block="streamback", stream=stream)
        model = Transformer(args)
        if compiled:
            apply_compile(model, backend=backend)
        apply_fsdp(model)
        watch = StreamDtypeWatch(model)
        tok = tokens(args, seq=17).to(process_group)
        with model.capture(
            ("residual",)
        ) as seen:  # compiled: the training step's loss, its compiled head_loss under FSDP2
            (model(tok[:, :-1], targets=tok[:, 1:]) if compiled else model(tok[:, :-1]).sum()).backward()
        watch.check_and_remove()  # what the blocks receive, after FSDP2's hooks
        assert_stream(seen["residual"], model.stream_format, 2)
        grad = model.layers[0].attention.wq.weight.grad
        assert grad.dtype == torch.float32 and grad.to_local().abs().sum() > 0
    assert set(norm_gain_absmax(model).values()) == {1.0}  # gathers the sharded gains
    # the reversible stream under FSDP2: same loss, gradients within bf16 rounding, residuals dropped
    plain, twin = (Transformer(tiny(block="streamback", reversible=r)) for r in (False, True))
    twin.load_state_dict(plain.state_dict())
    losses = []
    for model in (plain, twin):
        apply_fsdp(model)
        losses.append(model(tokens(model.args).to(process_group)).logsumexp(-1).mean())
        losses[-1].backward()
    assert torch.equal(*losses) and twin.reversible_stats["dropped_bytes"] == 2 * 2 * 2 * 16 * 64 * 4
    for p, q in zip(plain.parameters(), twin.parameters()):
        assert (p.grad.full_tensor() - q.grad.full_tensor()).abs().max() <= 1e-2 * p.grad.full_tensor().abs().max()
    # the trap apply_fsdp avoids: the default policy casts the fp32 stream to bf16 at each block
    model = Transformer(tiny(block="streamback"))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.layers:
        fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    watch = StreamDtypeWatch(model)
    model(tokens(model.args).to(process_group))
    assert watch.seen == [torch.bfloat16, torch.bfloat16]
    torch._dynamo.reset()
    with pytest.raises(RuntimeError, match="a wrapper casts the blocks' inputs"):
        watch.check_and_remove()


def test_compiled_block_keeps_its_mid_residual_for_the_backward():
    """Under torch.compile a StreamBack block keeps the residual between its two sublayers for the
    backward pass (`_kept_for_backward`; the partitioner keeps it normalised, mid * rstd, the
    same bytes), rather than the first delta and a recompute of the residual from the block's
    input (which makes Inductor split the norms' backward kernels). AOT autograd's partitioner,
    the one inductor runs, without code generation."""
    args = tiny(block="streamback", n_layers=1)
    compiled = Transformer(args)
    apply_compile(compiled, backend="aot_eager_decomp_partition")
    tok = tokens(args)
    with torch.no_grad(), compiled.capture(("residual", "mid")) as stream:
        compiled(tok)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda x: saved.append(x.detach()) or x, lambda x: x):
        compiled(tok)
    residuals = [t for t in saved if t.dtype == torch.float32 and t.shape == stream["mid"][0].shape]
    assert len(residuals) == 3  # h_0 and mid_0 in the block, h_1 by the final norm
    mid = stream["mid"][0]
    normalised = mid * torch.rsqrt(mid.pow(2).mean(-1, keepdim=True) + args.norm_eps)
    assert any(torch.equal(t, mid) or torch.equal(t, normalised) for t in residuals)
    assert any(torch.equal(t, stream["residual"][0]) for t in residuals)
    torch._dynamo.reset()


@pytest.mark.slow
def test_bench_cpu(tmp_path, capsys):
    """The CPU's defaults (2 x 64 tokens, a 2048-word vocabulary, eager, one thread), the kernels
    bf16 compute takes (here forced onto fp32 kernels), a line per configuration as it finishes,
    and a warning for too few timed steps."""
    from streamback.model import compute

    out = tmp_path / "bench.json"
    with compute.use("emulated"):
        assert (
            cli_main(["bench", "--shapes", "tiny-fat-short", "--steps", "2", "--warmup", "0", "--out", str(out)]) == 0
        )
    printed = capsys.readouterr().out
    assert "bf16 compute on cpu: bf16 on fp32 kernels (cpu_bf16 emulated); its matmul" in printed
    assert "bf16 compute: bf16 on fp32 kernels)" in out.with_suffix(".md").read_text()
    assert "warning: 2 timed step(s) per configuration are too few for a stable ratio" in printed
    assert printed.index("tiny-fat-short  streamback  eager  ") < printed.index("Training step (forward + backward")
    result = json.loads(out.read_text())
    assert (result["batch"], result["seq_len"], result["vocab_size"], result["threads"]) == (2, 64, 2048, 1)
    assert "too few" in result["warnings"][0] and "Warning: 2 timed step(s)" in out.with_suffix(".md").read_text()
    rows = {r["variant"]: r for r in result["rows"]}
    assert {r["mode"] for r in result["rows"]} == {"eager"} and set(rows) == {
        "baseline",
        "streamback",
        "streamback-reversible",
    }
    assert all(r["median_noise"] is None for r in rows.values())  # no 95% interval of a median from 2 steps
    assert all(r["error"] is None and r["tokens_per_s"] > 0 and 0 < r["mfu"] for r in rows.values())
    assert all(r["peak_mem_gib"] is None for r in rows.values())  # no GPU
    assert all(r["step_spread"] >= 1 for r in rows.values())
    estimates = {k: r["est_peak_gib"] for k, r in rows.items()}  # streamback.measure.memory's, in GiB
    assert estimates["streamback"] > estimates["baseline"] == estimates["streamback-reversible"] > 0  # peak at the loss
    # 2 layers x 2 residuals of 128 tokens x 128 dims: fp32 residuals dropped, bf16 deltas kept but
    # the first (h_0 is recomputed from the tokens)
    saved = {k: r["saved_activation_bytes"] for k, r in rows.items()}
    assert saved["streamback"] - saved["streamback-reversible"] == 2 * 2 * 128 * 128 * (4 - 2) + 128 * 128 * 2
    assert "| tiny-fat-short | streamback-reversible | eager |" in out.with_suffix(".md").read_text()
    # the live signals' cost at the config's stream_every: measured, and counted (bytes well above FLOPs:
    # elementwise work)
    assert result["stream_every"] == load_config(DEFAULT_CONFIG)["train"]["log"]["stream_every"] and all(
        r["signals_step_s"] > 0 for r in rows.values()
    )
    assert all(0 < r["signals_flops_share"] < r["signals_bytes_share"] < 0.1 for r in rows.values())


@pytest.mark.slow
def test_loss_with_targets_is_next_token_loss_of_the_logits(device):
    """`model(tokens, targets)` (the training step's loss, `head_loss`) is `next_token_loss` of the
    logits: bit for bit eagerly, loss and gradients alike; compiled (apply_compile compiles the
    head with the loss, so no fp32 logits are written) up to fp32 reduction order."""
    from streamback.train.validation import next_token_loss

    args = tiny(block="streamback", vocab_size=1000)
    with torch.device(device):
        model, compiled = Transformer(args), Transformer(args)
    compiled.load_state_dict(model.state_dict())
    tok = tokens(args, seq=33).to(device)
    losses, grads = [], []
    for loss_of in (
        lambda m: next_token_loss(m(tok[:, :-1]), tok[:, 1:]),
        lambda m: m(tok[:, :-1], targets=tok[:, 1:]),
    ):
        model.zero_grad(set_to_none=True)
        losses.append(loss_of(model))
        losses[-1].backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    assert torch.equal(losses[0], losses[1]) and all(torch.equal(a, b) for a, b in zip(*grads))
    apply_compile(compiled)
    loss = compiled(tok[:, :-1], targets=tok[:, 1:])
    loss.backward()
    torch.testing.assert_close(loss, losses[0], rtol=1e-5, atol=0)
    for (name, p), q in zip(model.named_parameters(), compiled.parameters()):
        assert (p.grad - q.grad).abs().max() <= 1e-2 * p.grad.abs().max(), (
            name
        )  # a flipped bf16 rounding here and there
    torch._dynamo.reset()
