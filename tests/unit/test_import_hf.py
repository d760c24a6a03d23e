"""`streamback import-hf`, the inverse of export-hf: a round trip gives identical weights and logits;
a Llama built by transformers (sharded safetensors) imports and computes what transformers does,
in fp32 and, through the analyses' fp64 path, in fp64; what the model cannot compute is refused."""

import json

import pytest
import torch

from streamback.cli import main as cli_main
from streamback.errors import StreambackError
from streamback.model.export_hf import export
from streamback.model.import_hf import import_hf
from streamback.model.model import ModelArgs, Transformer
from streamback.model.weights import load_model, read_model, save_model

transformers = pytest.importorskip("transformers")


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize(
    "kw",
    [
        dict(dim=64, n_heads=4, n_kv_heads=2),
        dict(dim=189, n_heads=2, n_kv_heads=1),  # head_dim 94, a query width (188) other than dim: written as Mistral
        dict(dim=64, n_heads=4, n_kv_heads=4, tied_embeddings=True, block="streamback", stream="mxfp8_sr"),
    ],
    ids=["llama", "head-dim-94", "tied-streamback"],
)
def test_export_then_import_gives_identical_weights_and_logits(tmp_path, kw):
    args = ModelArgs(n_layers=2, vocab_size=211, multiple_of=32, max_seq_len=128, **kw)
    model = Transformer(args)
    model.init_weights(seed=3)
    with torch.no_grad():  # norm gains away from 1, so a misplaced norm would show
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    save_model(tmp_path / "model.pt", args, model.state_dict())
    export(tmp_path / "model.pt", tmp_path / "hf")
    assert cli_main(["import-hf", "--hf", str(tmp_path / "hf"), "--out", str(tmp_path / "back.pt")]) == 0
    before, after = read_model(tmp_path / "model.pt"), read_model(tmp_path / "back.pt")
    assert set(before.state) == set(after.state)
    assert all(torch.equal(before.state[k], after.state[k]) for k in before.state)
    assert (
        after.stream == before.stream
        and after.args.block == args.block
        and after.args.tied_embeddings == args.tied_embeddings
    )
    assert after.args.ffn_hidden_dim == args.ffn_hidden_dim and after.args.head_dim == args.head_dim
    tokens = torch.randint(0, 211, (2, 40), generator=torch.Generator().manual_seed(0))
    for compute in (torch.bfloat16, torch.float32):
        torch.manual_seed(0)  # the same stochastic roundings
        with torch.no_grad():
            a = load_model(tmp_path / "model.pt", compute_dtype=compute)(tokens)
        torch.manual_seed(0)
        with torch.no_grad():
            b = load_model(tmp_path / "back.pt", compute_dtype=compute)(tokens)
        assert torch.equal(a, b)


def hf_llama(tmp_path, **kw):
    config = transformers.LlamaConfig(
        **{
            **dict(
                vocab_size=211,
                hidden_size=64,
                intermediate_size=160,
                num_hidden_layers=3,
                num_attention_heads=4,
                num_key_value_heads=2,
                max_position_embeddings=128,
                rms_norm_eps=1e-5,
                rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
            ),
            **kw,
        }
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    model.save_pretrained(tmp_path / "hf", max_shard_size="60KB")  # several shards and their index
    return model.eval()


def test_a_transformers_llama_imports_and_computes_what_transformers_does(tmp_path):
    hf = hf_llama(tmp_path)
    assert (tmp_path / "hf" / "model.safetensors.index.json").is_file()
    args = import_hf(tmp_path / "hf", tmp_path / "model.pt")
    assert (args.dim, args.n_layers, args.n_heads, args.n_kv_heads, args.ffn_hidden_dim, args.block) == (
        64,
        3,
        4,
        2,
        160,
        "baseline",
    )
    assert read_model(tmp_path / "model.pt").stream == "bf16"  # a public model is a plain bf16 model
    tokens = torch.randint(0, 211, (2, 50), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        theirs = hf(tokens).logits
        ours = load_model(tmp_path / "model.pt", compute_dtype=torch.float32)(tokens)
    assert (ours - theirs).abs().max().item() < 1e-4
    # the analyses' ground truth path (fp64 compute, stream and parameters) against transformers in fp64,
    # whose RMSNorm still computes in fp32 (modeling_llama.py), so they agree to ~1e-7, not to fp64's 1e-15
    from streamback.analysis.precision import reference_model

    with torch.no_grad():
        theirs64 = hf.double()(tokens).logits
        ours64 = reference_model(read_model(tmp_path / "model.pt"), "fp64", "cpu")(tokens)
    assert ours64.dtype == torch.float64
    assert (ours64 - theirs64).abs().max().item() < 1e-6


@pytest.mark.parametrize(
    "change, message",
    [  # the other families and settings: tests/unit/test_import_families.py
        ({"attention_bias": True}, "attention_bias = True is not supported"),
        ({"model_type": "gpt2"}, "model_type 'gpt2' is not a decoder family"),
    ],
)
def test_what_the_model_cannot_compute_is_refused(tmp_path, change, message):
    hf_llama(tmp_path)
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(StreambackError, match=message):
        import_hf(tmp_path / "hf", tmp_path / "model.pt")
    assert not (tmp_path / "model.pt").exists()


def test_a_directory_without_weights_is_named(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(StreambackError, match="no 'hidden_size'"):
        import_hf(tmp_path, tmp_path / "model.pt")
    with pytest.raises(StreambackError, match="no config.json"):
        import_hf(tmp_path / "missing", tmp_path / "model.pt")
