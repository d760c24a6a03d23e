"""Tiny models' shared test pieces: their args and tokens, the stream formats checked eager and compiled, the check of
the stream's dtype and grid, and a one-process group."""

import pytest
import torch

from streamback.model.formats import STREAM_LABELS
from streamback.model.model import ModelArgs

# every stream format, with each rounding it has (fp32 has no stochastic variant)
STREAMS = list(STREAM_LABELS)


def tiny(**kw) -> ModelArgs:
    """A tiny model's ModelArgs (2 layers x 64, vocabulary 97), with `kw` changed."""
    base = dict(dim=64, n_layers=2, n_heads=4, n_kv_heads=1, vocab_size=97, multiple_of=32, max_seq_len=64)
    return ModelArgs(**{**base, **kw})


def tokens(args, batch=2, seq=16, seed=0):
    """Random token ids [batch, seq] for a model of `args`, drawn on the CPU (the same ids on every
    device, also under a `with torch.device("cuda")` block, whose default would not take a CPU
    generator)."""
    return torch.randint(0, args.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(seed), device="cpu")


def assert_stream(seen, fmt, n_layers):
    """`seen`: the residuals of a forward, h_0 .. h_L (`Transformer.capture`)."""
    assert len(seen) == n_layers + 1
    for h in seen:
        assert h.dtype == fmt.container_dtype, (fmt, h.dtype)
        assert fmt.is_representable(h.detach()), fmt


# streams whose compiled blocks are checked against eager ones; on the CPU only the paper's two
# blocks (Inductor's C++ code generation takes ~10 s a model there)
COMPILED_STREAMS = ["baseline", "fp32", "bf16", "mxfp8", "nvfp4", "nvfp4_sr"]


@pytest.fixture
def process_group(tmp_path, device):
    """A one-process group on `device`: gloo on the CPU (FSDP2 runs there with it), NCCL on CUDA
    (the trainer's backend); torn down afterwards."""
    import torch.distributed as dist

    if device.type == "cuda":
        device = torch.device("cuda", torch.cuda.current_device())  # NCCL's device_id needs the index
        dist.init_process_group(
            "nccl", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1, device_id=device
        )
    else:
        dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        with torch.device(device):
            yield device
    finally:
        dist.destroy_process_group()
