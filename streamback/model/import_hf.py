"""`streamback import-hf`: a Hugging Face Llama-family model directory -> a model file, the inverse of `export-hf`.

Input: a directory with `config.json` and the weights as safetensors (`model.safetensors`, or
shards listed in `model.safetensors.index.json`) of a decoder of one of the families public deep
models use: `LlamaForCausalLM` (also with Llama 3.1's `llama3` RoPE scaling), `MistralForCausalLM`
without sliding window, `Qwen2ForCausalLM` (q/k/v biases) and `Qwen3ForCausalLM` (per-head q/k
RMSNorm), each with any head_dim and tied or untied embeddings (what `streamback export-hf`
writes, and most public models of these families).
Output: a model file (`streamback.model.weights.save_model`, fp32 weights) that every analysis
and `load_model` read like a trained run's, so the analyses run on a public model too (the paper
measured an 80-layer one). When the directory holds a `tokenizer.json`, the file records that
tokenizer (as the data stage identifies one), so an analysis refuses the tokens of another tokenizer
(`weights.check_corpus`).

Conversion: `export_hf.NAMES` read backwards, and wq/wk rows put back from transformers'
rotate-half layout to this model's interleaved RoPE pairs (the inverse of export_hf's
permutation, computed from it). Architecture: `config.json`'s sizes; the SwiGLU width
(`intermediate_size`) is recovered exactly as `multiple_of` (the largest power of two that gives
it, else the width itself) with no `ffn_dim_multiplier` (or one below 1 for a narrower width).
The block and stream are those `export-hf` recorded under "streamback", else the baseline's (a
public model is a plain bf16 model). Refused in one line naming the config key: another RoPE
scaling (`rope_parameters` rope_type), partial rotary, an output-projection or MLP bias
(`attention_bias` outside Qwen2, `mlp_bias`), an activation other than SiLU (`hidden_act`), a
sliding window (`sliding_window`, `use_sliding_window`, `layer_types`).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from types import SimpleNamespace

import torch

from streamback.data import tokenizer as tk
from streamback.errors import StreambackError
from streamback.model.export_hf import NAMES, _rotate_half_rows, rotary_rows
from streamback.model.model import ROPE_SCALING_KEYS, ModelArgs, Transformer
from streamback.model.weights import TrainedModel, save_model

FAMILIES = ("llama", "mistral", "qwen2", "qwen3")  # transformers' model_type
HELP = "import a Hugging Face Llama directory (config.json + safetensors) as a model file, the inverse of export-hf"

# transformers' names -> this model's ("{}" the layer number), NAMES read backwards
_OURS = [(re.compile("^" + re.escape(theirs).replace(r"\{\}", r"(\d+)") + "$"), ours) for ours, theirs in NAMES.items()]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--hf", type=Path, required=True, help="the Hugging Face model directory (config.json, *.safetensors)"
    )
    parser.add_argument(
        "--out", type=Path, required=True, help="model file to write, e.g. results/imported/<name>/model.pt"
    )


def run(args: argparse.Namespace) -> int:
    model_args = import_hf(args.hf, args.out)
    print(
        f"wrote {args.out}: {model_args.n_layers} layers x {model_args.dim}, {model_args.n_heads} heads "
        f"({model_args.n_kv_heads} KV), vocabulary {model_args.vocab_size}, block {model_args.block}"
    )
    return 0


def _swiglu_width(dim: int, width: int) -> tuple[int, float | None]:
    """(multiple_of, ffn_dim_multiplier) for which ModelArgs.ffn_hidden_dim is `width`."""
    plain = int(2 * 4 * dim / 3)
    multiplier = None if plain <= width else width / plain
    for multiple_of in [2**k for k in range(12, -1, -1)] + [width]:
        if (
            ModelArgs.ffn_hidden_dim.fget(
                SimpleNamespace(dim=dim, multiple_of=multiple_of, ffn_dim_multiplier=multiplier)
            )
            == width
        ):
            return multiple_of, multiplier
    raise StreambackError(f"intermediate_size {width} cannot be expressed for hidden_size {dim}")


def model_args(config: dict, where: Path) -> ModelArgs:
    """ModelArgs from a transformers config.json, refusing what this model does not compute."""

    def need(key):
        if key not in config:
            raise StreambackError(f"{where}: config.json has no {key!r}")
        return config[key]

    kind = config.get("model_type")
    if kind not in FAMILIES:
        raise StreambackError(
            f"{where}: model_type {kind!r} is not a decoder family this model computes ({', '.join(FAMILIES)})"
        )
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ("default", "llama3"):
        raise StreambackError(
            f"{where}: rope_parameters rope_type {rope_type!r} is not supported (default, or llama3's scaling)"
        )
    scaling = None
    if rope_type == "llama3":
        absent = [key for key in ROPE_SCALING_KEYS if key not in rope]
        if absent:
            raise StreambackError(f"{where}: rope_parameters of type llama3 lack {', '.join(absent)}")
        scaling = {key: rope[key] for key in ROPE_SCALING_KEYS}
    theta = rope.get("rope_theta", config.get("rope_theta", 10000.0))
    unsupported = [
        ("mlp_bias", False),
        ("hidden_act", "silu"),
        ("use_sliding_window", False),
        ("partial_rotary_factor", 1.0),
    ]
    if kind != "qwen2":  # Qwen2's q/k/v biases are built in; elsewhere attention_bias also biases o_proj
        unsupported.append(("attention_bias", False))
    if kind == "mistral":  # Qwen2 and Qwen3 keep a sliding_window that only use_sliding_window turns on
        unsupported.append(("sliding_window", None))
    settings = {**config, **{key: rope[key] for key in ("partial_rotary_factor",) if key in rope}}  # either place
    for key, wanted in unsupported:
        value = settings.get(key, wanted)
        if value != wanted:
            raise StreambackError(f"{where}: {key} = {value!r} is not supported (this model has {wanted!r})")
    if "sliding_attention" in (config.get("layer_types") or []):
        raise StreambackError(
            f"{where}: layer_types has sliding_attention layers, which are not supported (full attention only)"
        )
    dim, heads = need("hidden_size"), need("num_attention_heads")
    head_dim = config.get("head_dim")
    multiple_of, multiplier = _swiglu_width(dim, need("intermediate_size"))
    recorded = config.get("streamback") or {}
    block = recorded.get("block", "baseline")
    stream = recorded.get("stream", "fp32") if block == "streamback" else "fp32"
    try:
        return ModelArgs(
            dim=dim,
            n_layers=need("num_hidden_layers"),
            n_heads=heads,
            n_kv_heads=config.get("num_key_value_heads") or heads,
            vocab_size=need("vocab_size"),
            multiple_of=multiple_of,
            ffn_dim_multiplier=multiplier,
            norm_eps=config.get("rms_norm_eps", 1e-5),
            rope_theta=float(theta),
            max_seq_len=config.get("max_position_embeddings", 2048),
            tied_embeddings=bool(config.get("tie_word_embeddings", False)),
            block=block,
            stream=stream,
            attention_head_dim=None if head_dim in (None, dim // heads) else head_dim,
            qkv_bias=kind == "qwen2",
            qk_norm=kind == "qwen3",
            rope_scaling=scaling,
        )
    except StreambackError as err:
        raise StreambackError(f"{where}: config.json: {err}") from None


def _interleave_rows(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """The inverse of export_hf's `_rotate_half_rows`: each head's rows (a vector's entries) from halves back to
    interleaved pairs."""
    source = _rotate_half_rows(torch.arange(w.shape[0], dtype=torch.float64), n_heads).long()
    return w[torch.argsort(source)]


def read_safetensors(directory: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the directory's safetensors weights (one file, or the shards its index lists)."""
    from safetensors.torch import load_file

    index = directory / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (directory / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        raise StreambackError(
            f"{directory}: no model.safetensors or model.safetensors.index.json (only safetensors weights are read)"
        )
    tensors = {}
    for name in files:
        tensors.update(load_file(str(directory / name)))
    return tensors


def state_dict(args: ModelArgs, tensors: dict[str, torch.Tensor], where: Path) -> dict[str, torch.Tensor]:
    """This model's fp32 state dict from transformers' tensors."""
    state = {}
    rotary = rotary_rows(args)
    for theirs, value in tensors.items():
        if theirs.endswith("rotary_emb.inv_freq"):  # a buffer older transformers saved; recomputed here
            continue
        for pattern, ours in _OURS:
            found = pattern.match(theirs)
            if found:
                break
        else:
            raise StreambackError(f"{where}: weight {theirs!r} has no counterpart in this model")
        if ours in rotary:
            value = _interleave_rows(value, rotary[ours])
        state[ours.format(*found.groups())] = value.to(torch.float32).contiguous()
    if args.tied_embeddings and "tok_embeddings.weight" in state:
        state["output.weight"] = state["tok_embeddings.weight"]  # one matrix (transformers may also write the copy)
    return state


def read_hf(directory: str | Path) -> TrainedModel:
    """The Hugging Face model in `directory` as a model file's contents (fp32 weights, the baseline's bf16 stream
    unless export-hf recorded another, the tokenizer.json's record if there is one), checked against its config."""
    directory = Path(directory)
    config_file = directory / "config.json"
    if not config_file.is_file():
        raise StreambackError(
            f"{directory}: no config.json (a Hugging Face model directory holds config.json and *.safetensors)"
        )
    args = model_args(json.loads(config_file.read_text()), directory)
    state = state_dict(args, read_safetensors(directory), directory)
    with torch.device("meta"):
        expected = {k: v.shape for k, v in Transformer(args).state_dict().items()}
    missing = sorted(set(expected) - set(state))
    if missing:
        raise StreambackError(
            f"{directory}: the weights lack {', '.join(missing[:5])}" + (" ..." if len(missing) > 5 else "")
        )
    for key, shape in expected.items():
        if state[key].shape != shape:
            raise StreambackError(
                f"{directory}: {key} has shape {tuple(state[key].shape)}, config.json gives {tuple(shape)}"
            )
    return TrainedModel(
        args, state, args.stream_format(torch.bfloat16).label, torch.bfloat16, tokenizer_record(directory)
    )


def import_hf(directory: str | Path, out: str | Path) -> ModelArgs:
    """Convert the Hugging Face model in `directory` and write it to `out` (a model file); returns its ModelArgs."""
    trained = read_hf(directory)
    save_model(out, trained.args, trained.state, data=trained.data)
    return trained.args


def tokenizer_record(directory: Path) -> dict | None:
    """{"tokenizer_sha256"} of the directory's tokenizer.json as the data stage records a
    tokenizer (the sha256 of its canonical JSON), or None without one."""

    path = directory / "tokenizer.json"
    return {"tokenizer_sha256": tk.sha256_text(tk.load_file(path).to_str())} if path.is_file() else None
