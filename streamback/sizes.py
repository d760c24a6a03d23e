"""How big each job of the workflow is, from the config alone: no model is built.

A shape's parameter count (`param_counts`, the model's own formula for the SwiGLU hidden width:
`ffn_hidden_dim`, which `ModelArgs` uses), its model file's bytes, the peak GPU memory of each
analysis job (`analysis_peak_bytes`) and the host memory and time limits that export_hf, the
analyses and evaluate ask Slurm for (`job_memory_mb`, `job_runtime_min`), each overridable by a
config key. `streamback plan` sets them against each job's request and the GPUs' memory.

The analyses' peak is counted from the code's own tensors (`streamback/analysis/precision.py`,
`streamback/model/model.py`), eager, at the moment it is highest: every block's tensors that
autograd keeps for the backward pass, the residuals the capture holds, both models' weights and
gradients, and at the loss three vocabulary-wide fp32 tensors at once (the logits' log-softmax,
its gradient and the logits' gradient). Attention keeps per layer q, k, v and its output for a
fused kernel (flash: bf16/fp16, head_dim padded to 8; memory-efficient: fp32 where head_dim is a
multiple of 4, torch's `minimum_gemm_alignment`) and the B x H x T x T probabilities where neither
applies (fp32 with head_dim 94: the medium shape's ground truth; fp64 always). The estimate is
tested against the peaks measured on an H200 (`tests/unit/test_sizes.py` reads the measurement
files). Standard library only: the rule files import it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from streamback import layout
from streamback.io import read_json_record
from streamback.runs import comparisons

GIB = 2**30
MB = 10**6
# the vocabulary of the Llama 3 tokenizer that config/paper.yaml and one-gpu.yaml name; the plan
# takes it for a hub tokenizer before the corpus is tokenized (then the manifest's)
LLAMA3_VOCAB = 128256
# bytes of an element of each stream format's container (streamback/model/formats.py's _CONTAINER)
STREAM_BYTES = {
    "fp64": 8,
    "fp32": 4,
    "bf16": 2,
    "fp16": 2,
    "fp8_e4m3": 2,
    "fp8_e5m2": 2,
    "mxfp8": 4,
    "nvfp4": 4,
}
REFERENCE_BYTES = {"fp64": 8, "fp32": 4}
# Host memory of a job beside its tensors: the interpreter with torch, pandas and lm-eval imported,
# and on a GPU the CUDA context and its kernels' images in host memory besides
HOST_BASE_MB = 1000
CUDA_HOST_MB = 3000
# What a Slurm job asks for beyond the estimate, so that an estimate a little under the truth does
# not kill it: the estimate counts tensors, not the allocator's rounding or library workspaces
MARGIN = 1.25


def ffn_hidden_dim(dim: int, multiple_of: int, ffn_dim_multiplier: float | None = None) -> int:
    """The SwiGLU hidden width: 8/3 x dim (times the multiplier), rounded up to `multiple_of` (TorchTitan's)."""
    hidden = int(2 * 4 * dim / 3)
    if ffn_dim_multiplier is not None:
        hidden = int(ffn_dim_multiplier * hidden)
    return multiple_of * math.ceil(hidden / multiple_of)


@dataclass(frozen=True)
class Shape:
    """A model's dimensions, as the config states them (model.shapes.<name>, the section's defaults)."""

    n_layers: int
    dim: int
    n_heads: int
    n_kv_heads: int
    ffn: int
    vocab: int
    tied: bool = False

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def block_params(self) -> int:
        """One block's parameters: wq, wk, wv, wo, w1, w2, w3 and the two norm gains."""
        q, kv = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        return self.dim * (q + 2 * kv) + q * self.dim + 3 * self.dim * self.ffn + 2 * self.dim

    def flops_per_token(self, seq_len: int) -> int:
        """TorchTitan's training FLOPs per token (streamback/measure/step.py's): 6 x the parameters but the token
        embedding + 12 x layers x heads x head_dim x seq_len."""
        embedding = self.vocab * self.dim
        return 6 * (self.params - embedding) + 12 * self.n_layers * self.n_heads * self.head_dim * seq_len

    @property
    def params(self) -> int:
        """Every parameter: the blocks, the token embedding, the output head (once where tied) and the final norm."""
        return self.n_layers * self.block_params + self.vocab * self.dim * (1 if self.tied else 2) + self.dim


def shape_of(model_cfg: dict, name: str, vocab: int) -> Shape:
    """The `Shape` of model.shapes.<name> (a shape's own multiple_of over the section's)."""
    spec = model_cfg["shapes"][name]
    multiple_of = spec.get("multiple_of", model_cfg["multiple_of"])
    return Shape(
        n_layers=spec["n_layers"],
        dim=spec["dim"],
        n_heads=spec["n_heads"],
        n_kv_heads=spec["n_kv_heads"],
        ffn=ffn_hidden_dim(spec["dim"], multiple_of, model_cfg["ffn_dim_multiplier"]),
        vocab=vocab,
        tied=model_cfg["tied_embeddings"],
    )


def param_counts(model_cfg: dict, name: str, vocab: int) -> dict[str, int]:
    shape = shape_of(model_cfg, name, vocab)
    return {"total": shape.params, "blocks": shape.n_layers * shape.block_params}


def model_file_bytes(shape: Shape) -> int:
    """A trained model file's tensors: the fp32 master weights (streamback/model/weights.py)."""
    return 4 * shape.params


def _fused_attention(head_dim: int, nbytes: int, cuda: bool) -> bool:
    """Does SDPA take a fused kernel (keeping no probabilities) for this head_dim and dtype? On the CPU always
    (its flash kernel takes every dtype and head_dim)."""
    if not cuda:
        return True
    if nbytes == 2:
        return head_dim <= 256  # flash attention pads head_dim to a multiple of 8
    if nbytes == 4:
        return head_dim % 4 == 0  # memory-efficient attention: fp32 needs a multiple of 4
    return False  # fp64: the math kernel


def _block_saved(
    shape: Shape, tokens: int, batch: int, seq_len: int, compute: int, stream: int, cuda: bool = True
) -> int:
    """Bytes one block keeps for its backward pass (eager), beside its input residual (the capture's)."""
    d, f, heads = shape.dim, shape.ffn, shape.n_heads
    hd = shape.head_dim
    if _fused_attention(hd, compute, cuda):
        padded = 8 * math.ceil(hd / 8) if compute == 2 and cuda else hd
        attention = compute * tokens * 4 * heads * padded + 4 * batch * heads * seq_len  # q, k, v, out; logsumexp
    else:
        # q and k scaled, v, and the softmax's output
        attention = compute * tokens * 3 * heads * hd + compute * batch * heads * seq_len * seq_len
    # the norms' outputs (2 x dim), wo's input (heads x head_dim), w1 and w3 outputs, silu's, the product (4 x ffn)
    dense = compute * tokens * (2 * d + heads * hd + 4 * f)
    return attention + dense + stream * tokens * d  # the residual between the sublayers, in the stream's dtype


def _pass_peak(
    shape: Shape, batch: int, seq_len: int, compute: int, stream: int, grad: bool, capture: bool, cuda: bool = True
) -> int:
    """Bytes of one pass's own tensors at its peak: with gradients, at the loss's backward (every block's saved
    tensors, the captured residuals and three fp32 vocabulary-wide tensors); without, the captured residuals (if
    held), one block's largest temporaries and the logits in the compute dtype and in fp32."""
    tokens = batch * seq_len
    residuals = (shape.n_layers + 1) * tokens * shape.dim * stream if capture else 0
    logit = max(compute, 4)
    if grad:
        saved = shape.n_layers * _block_saved(shape, tokens, batch, seq_len, compute, stream, cuda)
        return saved + residuals + 3 * tokens * shape.vocab * logit
    temporaries = 3 * tokens * shape.ffn * compute
    return residuals + temporaries + tokens * shape.vocab * (compute + logit)


def analysis_peak_bytes(
    kind: str,
    shape: Shape,
    batch: int,
    seq_len: int,
    variants: list[str],
    reference: str = "fp32",
    cuda: bool = True,
) -> int:
    """Estimated peak bytes of one analysis job of `kind` on a GPU (`cuda`) or the CPU (its models one after
    another, so one model's peak): layer-error (and public, on its windows) holds the ground truth and one
    variants' model; swallowed and envelope one model, forward only; loss-difference one model on `batch` windows
    (its micro-batch)."""
    params = shape.params
    if kind in ("layer-error", "public"):
        ref = REFERENCE_BYTES[reference]
        blocks = shape.n_layers * shape.block_params
        # the ground truth's pass: its parameters (in its dtype) and the variants' model's (fp32) already on the device
        truth = ref * params + 4 * params + _pass_peak(shape, batch, seq_len, ref, ref, True, True, cuda)
        # a variant's pass: both models, the truth's block gradients, the bf16 weight copies the matmuls keep,
        # the truth's residuals and their gradients, and this pass's own tensors in its widest stream
        widest = max(STREAM_BYTES[v.removesuffix("_sr").split(":")[0]] for v in variants)
        held = 2 * (shape.n_layers + 1) * batch * seq_len * shape.dim * ref
        variant = (ref + 4) * params + ref * blocks + 2 * blocks + held
        variant += _pass_peak(shape, batch, seq_len, 2, widest, True, True, cuda)
        return max(truth, variant)
    if kind == "swallowed":
        widest = max(STREAM_BYTES[v.removesuffix("_sr").split(":")[0]] for v in variants)
        return 4 * params + _pass_peak(shape, batch, seq_len, 2, widest, False, True)
    if kind in ("envelope", "loss-difference"):
        return 4 * params + _pass_peak(shape, batch, seq_len, 2, 4, False, False)
    raise ValueError(f"no estimate for analysis kind {kind!r}")


GPU_SHARE = 0.9  # of a GPU's memory a job may use: the preflight's memory bound (its check's 90%)


def shape_of_args(args) -> Shape:
    """The `Shape` of a built model's arguments (a ModelArgs: a trained model file's, an imported model's)."""
    return Shape(
        n_layers=args.n_layers,
        dim=args.dim,
        n_heads=args.n_heads,
        n_kv_heads=args.n_kv_heads,
        ffn=args.ffn_hidden_dim,
        vocab=args.vocab_size,
        tied=args.tied_embeddings,
    )


def fit_problem(
    kind: str, shape: Shape, batch: int, seq_len: int, variants: list[str], reference: str, capacity: int, where: str
) -> str | None:
    """None where analysis `kind` of `shape` fits GPU_SHARE of `capacity` bytes at `batch`; else one line naming the
    estimate, the GPU and the largest batch that fits (the key: analysis.batch_size, or micro_batch_size for
    loss-difference)."""
    need = analysis_peak_bytes(kind, shape, batch, seq_len, variants, reference)
    room = GPU_SHARE * capacity
    if need <= room:
        return None
    key = "micro_batch_size" if kind == "loss-difference" else "batch_size"
    fits = [
        b for b in range(batch - 1, 0, -1) if analysis_peak_bytes(kind, shape, b, seq_len, variants, reference) <= room
    ]
    fix = f"set analysis.{key} to {fits[0]} or less" if fits else "no batch fits: run it on a larger GPU"
    return (
        f"analyze {kind}: {where} needs an estimated {need / GIB:,.1f} GiB of GPU memory at analysis.{key} {batch} "
        f"x {seq_len} tokens, over {GPU_SHARE:.0%} of the GPU's {capacity / GIB:,.1f} GiB: {fix} (streamback/sizes.py; "
        "`streamback plan` checks every analysis before any job)"
    )


def export_memory_mb(shape: Shape) -> int:
    """Host memory of export_hf: the model file read (torch.load), the permuted and converted state dict, and
    safetensors' byte copy of it as it writes (3 x the fp32 model), plus the interpreter's."""
    return math.ceil(MARGIN * (3 * model_file_bytes(shape) / MB + HOST_BASE_MB))


def model_job_memory_mb(shape: Shape, on_gpu: bool, cpu_tensors: int = 0) -> int:
    """Host memory of a job that reads a model file and computes with it (an analysis, evaluate): the file's
    state dict and the model built from it (2 x the fp32 model), on the CPU the computation's own tensors
    (`cpu_tensors`), plus the interpreter's and on a GPU the CUDA context's."""
    base = HOST_BASE_MB + (CUDA_HOST_MB if on_gpu else 0)
    return math.ceil(MARGIN * ((2 * model_file_bytes(shape) + cpu_tensors) / MB + base))


def io_runtime_min(nbytes: int, mb_per_s: float, passes: int = 1) -> int:
    """Minutes for a job that reads or writes `nbytes` `passes` times at `mb_per_s`, with 10 minutes for its start
    (imports, a queue's node setup), times MARGIN."""
    return math.ceil(MARGIN * (10 + passes * nbytes / MB / mb_per_s / 60))


def slices(need_min: float, limit_min: int) -> int:
    """How many jobs of `limit_min` minutes a piece of work of `need_min` minutes takes (resumed between them)."""
    return max(1, math.ceil(need_min / limit_min))


# ---- the jobs of a config ------------------------------------------------------------------------

# The rate the analyses' time limits assume for their eager passes (fp32 ground truth, stream
# variants, fp64 comparisons): under the H200's measured layer-error rates slowed by H100_SLOWDOWN
# (docs/measurements/h200-2026-12-04; tests/unit/test_sizes.py checks it against the measured times)
ANALYSIS_TFLOPS = 20.0
# The H200's memory bandwidth over the H100 SXM's (4.8 / 3.35 TB/s, NVIDIA's datasheets): the most an
# H100 can be slower at the same SM count and clocks, where a kernel is bound by memory
H100_SLOWDOWN = 4.8 / 3.35
CPU_RUNTIME_MIN = 60  # an analysis on the CPU: no rate to derive a time from


def tokens_manifest(data: dict) -> dict | None:
    """The tokenized corpus's manifest (results/tokens/<corpus>/manifest.json, or data.dir's) where it exists and
    reads as JSON: the sizes fall back on the config where it does not (an empty file `snakemake --touch` made)."""
    return read_json_record(layout.tokens_dir(data) / "manifest.json")


def vocab_of(config: dict) -> int:
    """The vocabulary the sizes assume: plan.vocab_size, else the tokenized corpus's (its manifest), else a BPE's
    asked size, else Llama 3's."""
    if config["plan"]["vocab_size"] is not None:
        return config["plan"]["vocab_size"]
    manifest = tokens_manifest(config["data"])
    if manifest is not None and "vocab_size" in manifest:
        return manifest["vocab_size"]
    tokenizer = config["data"]["tokenizer"]
    return tokenizer["vocab_size"] if tokenizer["kind"] == "bpe" else LLAMA3_VOCAB


def _matrix_shapes(config: dict) -> list[str]:
    return list(dict.fromkeys(config["train"]["runs"]["shapes"]))


def public_shapes(config: dict, runs: dict) -> dict[str, str]:
    """analysis.public_models that are a run's own export (results/hf/<run>) -> that run's shape; the others' shapes
    are read from their directories by `streamback plan`, not here."""
    shapes = {}
    for name, directory in config["analysis"]["public_models"].items():
        if directory is None:
            continue
        run = str(directory).rstrip("/").rsplit("/", 1)[-1]
        if run in runs and str(directory).rstrip("/").endswith(f"hf/{run}"):
            shapes[name] = runs[run].shape
    return shapes


def analysis_batch(config: dict, kind: str) -> tuple[int, int]:
    """(sequences, tokens each) of one pass of analysis `kind`."""
    cfg = config["analysis"]
    if kind == "loss-difference":
        return cfg["micro_batch_size"], config["train"]["seq_len"]
    if kind == "public":
        return 1, cfg["public_seq_len"]  # its windows one at a time (streamback/analysis/public.py)
    return cfg["batch_size"], config["train"]["seq_len"]


def analysis_passes(config: dict, kind: str) -> int:
    """Forward-equivalent passes (a backward counts two) of one model in analysis `kind`."""
    cfg = config["analysis"]
    variants = len(cfg["variants"])
    if kind == "layer-error":
        return 3 * (variants + 1)
    if kind == "public":
        return 3 * (variants + 1) * cfg["public_sequences"] + variants * cfg["public_sequences"]
    if kind == "swallowed":
        return variants
    if kind == "envelope":
        return 1
    if kind == "loss-difference":
        windows = cfg["loss_windows"] or config["train"]["log"]["val_sequences"]
        return 2 * math.ceil(windows / cfg["micro_batch_size"])  # both splits
    raise ValueError(f"no passes for analysis kind {kind!r}")


def analysis_job(config: dict, kind: str, runs: dict, vocab: int) -> dict:
    """One analysis job's estimate over its models: `gpu_bytes` (the largest model's peak), `mem_mb` and `runtime`
    (minutes) as the job asks for them (the config's where set), `need_mb` and `need_min` (the estimates)."""
    cfg, res = config["analysis"], config["analysis"]["resources"]
    if kind == "public":
        shapes = list(public_shapes(config, runs).values())
    elif kind == "loss-difference":
        shapes = list(dict.fromkeys(shape for shape, _, _ in comparisons(runs)))
    else:
        shapes = _matrix_shapes(config)
    models = {"public": len(shapes)}.get(kind, sum(1 for spec in runs.values() if spec.shape in shapes))
    batch, seq_len = analysis_batch(config, kind)
    built = [shape_of(config["model"], s, vocab) for s in shapes]
    peaks = [
        analysis_peak_bytes(kind, s, batch, seq_len, cfg["variants"], cfg["reference"], bool(res["gpus"]))
        for s in built
    ]
    gpu_bytes = max(peaks, default=0)
    biggest = max(built, key=lambda s: s.params, default=None)
    on_gpu = bool(res["gpus"])
    need_mb = model_job_memory_mb(biggest, on_gpu, 0 if on_gpu else gpu_bytes) if biggest else HOST_BASE_MB
    if on_gpu and biggest is not None:
        per_model = max(
            analysis_passes(config, kind) * 2 * batch * seq_len * s.params / (ANALYSIS_TFLOPS * 1e12)
            + model_file_bytes(s) / MB / config["plan"]["disk_mb_per_s"]
            for s in built
        )
        need_min = math.ceil(MARGIN * (10 + models * per_model / 60))
    else:
        need_min = None
    return {
        "shapes": shapes,
        "models": models,
        "gpu_bytes": gpu_bytes if on_gpu else 0,
        "host_tensors_bytes": 0 if on_gpu else gpu_bytes,
        "need_mb": need_mb,
        "need_min": need_min,
        "mem_mb": res["mem_mb"] if res["mem_mb"] is not None else need_mb,
        "runtime": res["runtime"] if res["runtime"] is not None else (need_min or CPU_RUNTIME_MIN),
    }


def export_job(config: dict, shape: str, vocab: int) -> dict:
    """export_hf of a run of `shape`: `mem_mb` and `runtime` as asked, `need_mb` and `need_min` as estimated."""
    built = shape_of(config["model"], shape, vocab)
    res = config["analysis"]["export_resources"]
    need_mb = export_memory_mb(built)
    need_min = io_runtime_min(model_file_bytes(built), config["plan"]["disk_mb_per_s"], passes=2)
    return {
        "need_mb": need_mb,
        "need_min": need_min,
        "mem_mb": res["mem_mb"] if res["mem_mb"] is not None else need_mb,
        "runtime": res["runtime"] if res["runtime"] is not None else need_min,
    }


def evaluate_job(config: dict, shape: str, vocab: int) -> dict:
    """evaluate of a run of `shape`: `mem_mb` as asked and `need_mb` as estimated (its runtime is the config's)."""
    built = shape_of(config["model"], shape, vocab)
    res = config["eval"]["resources"]
    need_mb = model_job_memory_mb(built, bool(res["gpus"]))
    return {"need_mb": need_mb, "mem_mb": res["mem_mb"] if res["mem_mb"] is not None else need_mb}
