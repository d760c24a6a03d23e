"""How a `streamback.model.model.Transformer` is laid on hardware: checkpointing, compile, FSDP2.

Kept apart from the model as in TorchTitan; apply in TorchTitan's order, after
`model.init_weights(seed)`: `apply_activation_checkpointing` (optional), `apply_compile`
(optional), `apply_fsdp` (one process or many: under torchrun, or on CPU with gloo).

FSDP2's mixed-precision policy casts the floating-point forward inputs of every sharded module
to `param_dtype` by default (`cast_forward_inputs=True`). Each block's input is the residual
stream, so that default would turn an fp32 StreamBack stream into a bf16 one at every block
boundary, silently making it a baseline model (Megatron-LM's fp32 residual was broken this way).
`apply_fsdp` turns the cast off; the model casts what it computes with itself (see
`streamback.model.model`), so the stream keeps its format and the compute is the same as without FSDP.
"""

from __future__ import annotations

import torch

from streamback.errors import StreambackError
from streamback.model.reversible import step_back_block


def apply_activation_checkpointing(model) -> None:
    """Recompute every block on the backward pass (torch.utils.checkpoint, non-reentrant)."""
    for layer in model.layers:
        layer.activation_checkpoint = True


def apply_compile(model, backend: str = "inductor") -> None:
    """torch.compile each block in place (TorchTitan's per-block compile; names unchanged).

    Inductor runs with `emulate_precision_casts`: by default its fused kernels keep bf16
    intermediates in fp32 and skip their rounding, which would leave the baseline's residual
    between attention and feed-forward unrounded (an fp32 stream inside each block). With it,
    compiled blocks round where eager ones do. They are still not always bit-identical to eager:
    fp32 reductions (the norms' mean of squares) and transcendentals (silu's exp) are evaluated
    in another order or by other code, and a last-bit difference sometimes flips one bf16
    rounding downstream (on the CPU, dim 106 x 4 layers x 512 tokens: 14 of 49,664 logits
    differ by one bf16 step with an fp32 stream, none for the baseline; without the option, the
    baseline differs in 3,869; benchmarks/gpu_checks.py measures both on CUDA). The reversible
    stream's rebuild of a block's residuals (`step_back_block`) is compiled too (one kernel), and
    the output head with the loss (`Transformer.head_loss`: no fp32 logits written out).
    """
    options = {"emulate_precision_casts": True} if backend == "inductor" else None
    for layer in model.layers:
        layer.compile(backend=backend, options=options)
    model.rebuild_block = torch.compile(step_back_block, backend=backend, options=options, dynamic=False)
    model.head_loss = torch.compile(model.head_loss, backend=backend, options=options)


def apply_fsdp(model, mesh=None, param_dtype: torch.dtype = torch.bfloat16, reduce_dtype: torch.dtype = torch.float32):
    """fully_shard each block, then the root, with fp32 gradient reduction and no input casts.

    `param_dtype` must be the model's compute dtype (the dtype it casts weights to anyway).
    Needs an initialised process group; `mesh` defaults to all ranks on the current device type.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if param_dtype != model.compute_dtype:
        raise StreambackError(
            f"FSDP param_dtype {param_dtype} differs from the model's compute dtype {model.compute_dtype}"
        )
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype, cast_forward_inputs=False)
    last = len(model.layers) - 1
    for i, layer in enumerate(model.layers):
        # the last block's parameters are needed again first on the backward pass: keep them
        fully_shard(layer, mesh=mesh, mp_policy=policy, reshard_after_forward=i < last)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


class StreamDtypeWatch:
    """Checks, on the first forward, that every block receives the stream in its format's dtype.

    Guards against a wrapper (FSDP2's forward-input cast) silently turning an fp32 StreamBack
    stream into a bf16 one. The hooks are registered after FSDP2's own, so they see what the
    block really receives.
    """

    def __init__(self, model):
        self.expected = model.stream_format.container_dtype
        self.seen: list[torch.dtype] = []
        self.handles = [layer.register_forward_pre_hook(self._hook) for layer in model.layers]

    def _hook(self, module, args):
        self.seen.append(args[0].dtype)

    def check_and_remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        wrong = [i for i, dtype in enumerate(self.seen) if dtype != self.expected]
        if wrong:
            raise RuntimeError(
                f"the residual stream reaches blocks {wrong} as {self.seen[wrong[0]]}, not {self.expected}: "
                "a wrapper casts the blocks' inputs (FSDP2's cast_forward_inputs?)"
            )
