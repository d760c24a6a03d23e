"""`streamback export-hf`: a trained model -> a Hugging Face Llama-family model directory.

Input, a trained model file (`streamback.model.weights`: fp32 master weights under the model's
own, TorchTitan's, names, and its model_args and stream). Output, a directory that
`transformers.AutoModelForCausalLM.from_pretrained`
loads: `model.safetensors` (fp32), the run's tokenizer for `transformers.AutoTokenizer`
(`tokenizer.json` from the run's token directory, `tokenizer_config.json`,
`special_tokens_map.json`: a fast tokenizer with the corpus's end-of-text token and no BOS, as the
model was trained) and `config.json`, written last (each file atomically), so a directory with a
config.json is complete: `lm_eval --model hf --model_args pretrained=<dir>` runs it as it is.
Neither transformers nor tokenizers is needed to export.

Conversion (TorchTitan's Llama 3 state-dict adapter): names map one to one; wq and wk rows are
permuted per head from the interleaved RoPE pairs of this model (and Meta's/TorchTitan's) to
the rotate-half layout of transformers' Llama (the permutation of transformers'
convert_llama_weights_to_hf.py); a tied output projection is written once.

The architecture is `LlamaForCausalLM` whenever transformers' LlamaConfig accepts the shape.
transformers 5 refuses a hidden size that is not n_heads * head_dim (the medium shape: 1512 =
16 * 94 + 8), which its Llama modules themselves support; such shapes are written as
`MistralForCausalLM` with no sliding window, transformers' same decoder (same norm, rotary,
attention and MLP code) under a config that takes an explicit head_dim.

transformers runs the residual stream in the dtype it loads the weights in, so the exported
model is a plain Llama: loaded in fp32 it computes the StreamBack model's fp32 stream with fp32
sublayers; in bf16 it is the baseline. `config.json` records, under "streamback", the block and
the stream the model was trained with (`bf16` for a baseline run), for the record.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch

from streamback import layout
from streamback.config import load_config
from streamback.errors import StreambackError
from streamback.io import atomic_path, output_dir, write_text
from streamback.model.model import ModelArgs
from streamback.model.weights import check_corpus, read_model

HELP = "export a trained checkpoint to a Hugging Face Llama directory (model.safetensors, tokenizer, config.json)"

# this model's parameter names -> transformers' Llama names ("{}" is the layer number)
NAMES = {
    "tok_embeddings.weight": "model.embed_tokens.weight",
    "layers.{}.attention.wq.weight": "model.layers.{}.self_attn.q_proj.weight",
    "layers.{}.attention.wk.weight": "model.layers.{}.self_attn.k_proj.weight",
    "layers.{}.attention.wv.weight": "model.layers.{}.self_attn.v_proj.weight",
    "layers.{}.attention.wo.weight": "model.layers.{}.self_attn.o_proj.weight",
    "layers.{}.attention.wq.bias": "model.layers.{}.self_attn.q_proj.bias",  # Qwen2
    "layers.{}.attention.wk.bias": "model.layers.{}.self_attn.k_proj.bias",
    "layers.{}.attention.wv.bias": "model.layers.{}.self_attn.v_proj.bias",
    "layers.{}.attention.q_norm.weight": "model.layers.{}.self_attn.q_norm.weight",  # Qwen3
    "layers.{}.attention.k_norm.weight": "model.layers.{}.self_attn.k_norm.weight",
    "layers.{}.feed_forward.w1.weight": "model.layers.{}.mlp.gate_proj.weight",
    "layers.{}.feed_forward.w3.weight": "model.layers.{}.mlp.up_proj.weight",
    "layers.{}.feed_forward.w2.weight": "model.layers.{}.mlp.down_proj.weight",
    "layers.{}.attention_norm.weight": "model.layers.{}.input_layernorm.weight",
    "layers.{}.ffn_norm.weight": "model.layers.{}.post_attention_layernorm.weight",
    "norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", type=Path, required=True, help="the trained model, results/runs/<run>/model.pt")
    parser.add_argument(
        "--out", type=Path, required=True, help="output directory (created; existing files in it are replaced)"
    )
    parser.add_argument(
        "--data",
        type=Path,
        default=None,
        help="token directory of the run's corpus, whose tokenizer is exported (default: the default config's, "
        "results/tokens/<corpus>, if it exists)",
    )


def run(args: argparse.Namespace) -> int:
    default = None
    if args.data is None:
        default = layout.tokens_dir(load_config()["data"])
    export(args.checkpoint, args.out, args.data, default_tokens=default)
    print(f"wrote {args.out / 'model.safetensors'} and {args.out / 'config.json'}")
    return 0


# each family's model_type -> its architecture
ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}


def rotary_rows(args: ModelArgs) -> dict[str, int]:
    """The tensors whose rows transformers' rotate-half RoPE orders otherwise: this model's name -> its
    number of heads."""
    return {
        "layers.{}.attention.wq.weight": args.n_heads,
        "layers.{}.attention.wk.weight": args.n_kv_heads,
        "layers.{}.attention.wq.bias": args.n_heads,
        "layers.{}.attention.wk.bias": args.n_kv_heads,
        "layers.{}.attention.q_norm.weight": 1,
        "layers.{}.attention.k_norm.weight": 1,
    }


def hf_architecture(args: ModelArgs) -> str:
    """The transformers family that computes this model: Qwen3 for the q/k norms, Qwen2 for the
    q/k/v biases, else Llama, or Mistral where Llama's config refuses the width (see above)."""
    if args.qk_norm and args.qkv_bias:
        raise StreambackError(
            "no transformers family has q/k norms with q/k/v biases alone (Qwen3's attention_bias also "
            "biases o_proj): this model cannot be exported"
        )
    if args.qk_norm:
        return "qwen3"
    if args.qkv_bias:
        return "qwen2"
    return "llama" if args.n_heads * args.head_dim == args.dim else "mistral"


def hf_rope(args: ModelArgs) -> dict:
    """transformers' rope_parameters: the default RoPE, or Llama 3.1's scaling (`rope_type` llama3)."""
    if args.rope_scaling is None:
        return {"rope_type": "default", "rope_theta": args.rope_theta}
    return {"rope_type": "llama3", "rope_theta": args.rope_theta, **args.rope_scaling}


def hf_config(args: ModelArgs, stream: str) -> dict:
    """config.json for transformers (4.45+ and 5; rope given both ways, which both read)."""
    arch = hf_architecture(args)
    config = {
        "architectures": [ARCHITECTURES[arch]],
        "model_type": arch,
        "vocab_size": args.vocab_size,
        "hidden_size": args.dim,
        "intermediate_size": args.ffn_hidden_dim,
        "num_hidden_layers": args.n_layers,
        "num_attention_heads": args.n_heads,
        "num_key_value_heads": args.n_kv_heads,
        "head_dim": args.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": args.max_seq_len,
        "rms_norm_eps": args.norm_eps,
        "rope_theta": args.rope_theta,
        "rope_parameters": hf_rope(args),
        "tie_word_embeddings": args.tied_embeddings,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "initializer_range": 0.02,
        "bos_token_id": None,
        "eos_token_id": None,
        "torch_dtype": "float32",
        "streamback": {"block": args.block, "stream": stream},
    }
    if args.rope_scaling is not None:
        config["rope_scaling"] = hf_rope(args)  # transformers 4's key
    if arch != "llama":
        config["sliding_window"] = None
    if arch in ("qwen2", "qwen3"):  # no mlp_bias key; Qwen2's q/k/v biases are built in (no attention_bias key either)
        config["use_sliding_window"] = False
        del config["mlp_bias"]
        if arch == "qwen2":
            del config["attention_bias"]
    return config


def _rotate_half_rows(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Reorder each head's output rows (a vector's entries) from interleaved pairs (0,1),(2,3).. to halves (0,D/2),.."""
    if w.dim() == 1:
        return _rotate_half_rows(w[:, None], n_heads)[:, 0]
    rows, cols = w.shape
    return w.view(n_heads, rows // n_heads // 2, 2, cols).transpose(1, 2).reshape(rows, cols)


def hf_state_dict(args: ModelArgs, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    rotary = rotary_rows(args)
    for key, value in state.items():
        parts = key.split(".")
        layer = parts[1] if parts[0] == "layers" else None
        generic = ".".join(["layers", "{}", *parts[2:]]) if layer is not None else key
        if generic == "output.weight" and args.tied_embeddings:
            continue
        if generic in rotary:
            value = _rotate_half_rows(value, rotary[generic])
        out[NAMES[generic].format(layer)] = value.detach().to(torch.float32).contiguous()
    return out


def hf_tokenizer_files(manifest: dict, args: ModelArgs) -> dict[str, dict]:
    """tokenizer_config.json and special_tokens_map.json beside the copied tokenizer.json."""
    eos = manifest["eos_token"]
    return {
        "tokenizer_config.json": {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "eos_token": eos,
            "bos_token": None,
            "add_bos_token": False,
            "model_max_length": args.max_seq_len,
            "clean_up_tokenization_spaces": False,
        },
        "special_tokens_map.json": {"eos_token": eos},
    }


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def export(
    checkpoint: str | Path, out: str | Path, tokens: str | Path | None = None, default_tokens: str | Path | None = None
) -> None:
    """Write the export directory, with the tokenizer of `tokens` (the run's token directory), which
    a model file that records the corpus it was trained on requires; `default_tokens` stands in for
    it when not given and it exists. A model without a recorded corpus (e.g. random weights) is
    exported without a tokenizer."""
    from safetensors.torch import save_file

    out = Path(out)
    with output_dir(out, "export directory"):  # checked before a model that may be large is read
        trained = read_model(checkpoint)
        args, state = trained.args, trained.state
        if (
            tokens is None
            and trained.data is not None
            and default_tokens is not None
            and (Path(default_tokens) / "manifest.json").is_file()
        ):
            tokens = default_tokens
        if tokens is None and trained.data is not None:
            raise StreambackError(
                f"{checkpoint} was trained on a tokenized corpus: give its token directory (--data) so that the "
                "export carries its tokenizer"
            )
        corpus = check_corpus(trained, checkpoint, tokens) if tokens is not None else None
        with atomic_path(out / "model.safetensors") as tmp:
            save_file(hf_state_dict(args, state), str(tmp), metadata={"format": "pt"})
            os.chmod(tmp, 0o666 & ~_umask())  # safetensors writes 0600; readable like any other output
        config = hf_config(args, trained.stream)
        if corpus is not None:
            manifest, tokenizer_file = corpus
            write_text(out / "tokenizer.json", tokenizer_file.read_text())
            for name, content in hf_tokenizer_files(manifest, args).items():
                write_text(out / name, json.dumps(content, indent=2) + "\n")
            config["eos_token_id"] = manifest["eos_id"]
        write_text(out / "config.json", json.dumps(config, indent=2) + "\n")
