"""The public-model analysis (`streamback analyze public`) on a model of Baguettotron's size: time and peak memory.

Baguettotron (PleIAs) is an 80-layer, 321M-parameter decoder of a Llama/Qwen-like design. This
benchmark builds a Llama of that shape with random weights (transformers' `LlamaForCausalLM`:
hidden 576, 9 heads of 64 with 3 KV heads, SwiGLU width 1536, a tied 65,536-row embedding),
saves it as a Hugging Face directory with the study's tokenizer, and runs the whole analysis on
it as the rule does (`streamback.analysis.public.public_tables`: the layer error and sign flips of
every window against the ground truth, the swallowed updates, the flip ratios): by default 8
sequences of 128 tokens (1,024 tokens), the bf16 and fp32 streams, an fp64 ground truth.

    python benchmarks/bench_public.py [--tokens results/tokens/synthetic] [--threads 2] [--reference fp64|fp32]
    [--cpu-bf16 emulated]

Prints the parameter count, the wall-clock time of the analysis (the model's building and saving
apart) and the process's peak resident memory (ru_maxrss, which counts the saving too). Without
--tokens it tokenizes a small synthetic corpus first (as the tests' token fixture does).
"""

from __future__ import annotations

import argparse
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SHAPE = dict(
    vocab_size=65536,
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=80,
    num_attention_heads=9,
    num_key_value_heads=3,
    head_dim=64,
    max_position_embeddings=4096,
    rms_norm_eps=1e-5,
    tie_word_embeddings=True,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
)


def small_tokens(root: Path) -> Path:
    """A 600-document synthetic corpus through the data stage, its token directory."""
    from streamback.config import validate_config
    from streamback.data.corpus import write_part
    from streamback.data.tokenize import tokenize

    write_part(11, 0, 600, root / "part.parquet")
    data = validate_config(
        {"data": {"tokenizer": {"vocab_size": 2048}, "val_fraction": 0.1, "shard_tokens": 20000, "processes": 1}}
    )["data"]
    tokenize(data, root / "tokens", inputs=[root / "part.parquet"], progress=False)
    return root / "tokens"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--tokens",
        type=Path,
        default=None,
        help="a token directory of the data stage (default: a small one, made here)",
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reference", choices=["fp64", "fp32"], default="fp64")
    parser.add_argument("--sequences", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--variants", nargs="+", default=["bf16", "fp32"])
    parser.add_argument(
        "--cpu-bf16",
        choices=["auto", "native", "emulated"],
        default="emulated",
        help="how bf16 compute runs on the CPU (the config's cpu_bf16; the default study's: emulated)",
    )
    parser.add_argument("--layers", type=int, default=SHAPE["num_hidden_layers"], help="fewer layers for a quick try")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    import transformers

    from streamback.analysis.public import public_tables
    from streamback.config import validate_config
    from streamback.model import compute

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        tokens = args.tokens or small_tokens(tmp)
        torch.manual_seed(0)
        config = transformers.LlamaConfig(**{**SHAPE, "num_hidden_layers": args.layers})
        with torch.no_grad():
            model = transformers.LlamaForCausalLM(config)
        params = sum(p.numel() for p in model.parameters())
        model.save_pretrained(tmp / "hf")
        del model
        shutil.copy(tokens / "tokenizer.json", tmp / "hf" / "tokenizer.json")
        cfg = validate_config(
            {
                "analysis": {
                    "public_models": {"bench": str(tmp / "hf")},
                    "public_sequences": args.sequences,
                    "public_seq_len": args.seq_len,
                    "reference": args.reference,
                    "variants": args.variants,
                }
            }
        )["analysis"]
        began = time.perf_counter()
        with compute.use(args.cpu_bf16):
            tables = public_tables(cfg["public_models"], cfg, tokens, "cpu")
        took = time.perf_counter() - began
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB
    overall = tables["public_flip_ratio"]
    overall = overall[(overall.layer == "all") & (overall.kind == "gradients") & (overall.variant == "fp32")].iloc[0]
    print(
        f"bench_public: {args.layers} layers, {params / 1e6:.1f}M parameters, {args.sequences} x {args.seq_len} "
        f"tokens, "
        f"ground truth {args.reference}, streams {', '.join(dict.fromkeys(['bf16', 'fp32', *args.variants]))}, "
        f"{args.threads} threads, "
        f"cpu_bf16 {args.cpu_bf16}"
    )
    print(f"analysis {took:.1f} s, peak resident memory {peak:.2f} GiB")
    print(
        f"(random weights) gradient sign flips fp32 / bf16 over all layers {overall.flip_ratio:.3f} "
        f"[{overall.flip_ratio_low:.3f}, {overall.flip_ratio_high:.3f}]"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
