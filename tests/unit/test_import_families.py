"""`streamback import-hf` on the decoder families of public deep models (Llama with Llama 3.1's RoPE
scaling, Mistral, Qwen2's q/k/v biases, Qwen3's q/k norms; explicit head_dim; tied embeddings):
a tiny random model of each, built and saved by transformers, imports and computes in fp64 what
transformers computes in fp64; export-hf writes it back; what the model cannot compute is refused;
and the study's own shapes compute bit for bit what they did before the options existed."""

import functools
import importlib.util
import json
import subprocess
import sys

import pytest
import torch

from streamback.analysis.precision import reference_model
from streamback.data.tokenizer import train_bpe
from streamback.errors import StreambackError
from streamback.model.export_hf import export
from streamback.model.import_hf import import_hf
from streamback.model.model import ModelArgs, Transformer, count_params
from streamback.model.weights import read_model

from conftest import ROOT

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB = 96
BASE = dict(
    vocab_size=VOCAB,
    hidden_size=48,
    intermediate_size=112,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    rms_norm_eps=1e-6,
)
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}  # short enough that every band (kept, interpolated, divided) is used
FAMILIES = {
    "llama-rope-llama3": (transformers.LlamaConfig, transformers.LlamaForCausalLM, dict(rope_parameters=LLAMA3_ROPE)),
    "llama-tied-head-dim-16": (
        transformers.LlamaConfig,
        transformers.LlamaForCausalLM,
        dict(head_dim=16, tie_word_embeddings=True),
    ),
    "mistral-head-dim-8": (
        transformers.MistralConfig,
        transformers.MistralForCausalLM,
        dict(head_dim=8, sliding_window=None),
    ),
    "qwen2-tied": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM, dict(tie_word_embeddings=True)),
    "qwen3-head-dim-16": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM, dict(head_dim=16)),
    "qwen3-tied": (
        transformers.Qwen3Config,
        transformers.Qwen3ForCausalLM,
        dict(head_dim=12, tie_word_embeddings=True),
    ),
}


def save_family(directory, family: str):
    """A random model of the family, saved by transformers with a tokenizer.json; returns it in eval mode.
    Norm gains, biases and the q/k norms are drawn away from their init so a misplaced one would show."""
    config_class, model_class, kw = FAMILIES[family]
    torch.manual_seed(0)
    model = model_class(config_class(**{**BASE, **kw}))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
            elif name.endswith(".bias"):
                p.normal_(0, 0.1)
    model.save_pretrained(directory)
    train_bpe(["the cat sat on the mat", "a dog ran"] * 20, VOCAB).save(str(directory / "tokenizer.json"))
    return model.eval()


def _rms_norm_in_input_dtype(module, x):
    """transformers' RMSNorm with its arithmetic in the input's dtype (it computes in fp32 even for an fp64 model)."""
    return module.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + module.variance_epsilon))


def fp64_logits(hf_model, tokens):
    """transformers' own forward in fp64, every RMSNorm computing in fp64 too."""
    model = hf_model.double()
    for module in model.modules():
        if type(module).__name__.endswith("RMSNorm"):
            module.forward = functools.partial(_rms_norm_in_input_dtype, module)
    with torch.no_grad():
        return model(tokens).logits


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_imports_and_computes_what_transformers_does_in_fp64(tmp_path, family):
    hf = save_family(tmp_path / "hf", family)
    args = import_hf(tmp_path / "hf", tmp_path / "model.pt")
    config = hf.config
    assert (
        args.head_dim == (getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)
        and args.tied_embeddings == config.tie_word_embeddings
    )
    assert (args.qkv_bias, args.qk_norm) == (config.model_type == "qwen2", config.model_type == "qwen3")
    assert (args.rope_scaling is not None) == (family == "llama-rope-llama3")
    trained = read_model(tmp_path / "model.pt")
    assert trained.data is not None and set(trained.data) == {"tokenizer_sha256"}
    tokens = torch.randint(0, VOCAB, (2, 40), generator=torch.Generator().manual_seed(1))
    theirs = fp64_logits(hf, tokens)
    with torch.no_grad():
        ours = reference_model(trained, "fp64", "cpu")(tokens)
    assert ours.dtype == torch.float64
    relative = ((ours - theirs).abs().max() / theirs.abs().max()).item()
    assert relative < 1e-10, relative
    assert count_params(Transformer(args)) == sum(p.numel() for p in hf.parameters())  # a tied matrix once, both sides


@pytest.mark.parametrize("family", ["llama-rope-llama3", "qwen2-tied", "qwen3-head-dim-16"])
def test_export_hf_writes_each_family_back_as_transformers_reads_it(tmp_path, family):
    hf = save_family(tmp_path / "hf", family)
    (tmp_path / "hf" / "tokenizer.json").unlink()  # export-hf carries a tokenizer from a token directory only
    import_hf(tmp_path / "hf", tmp_path / "model.pt")
    export(tmp_path / "model.pt", tmp_path / "again")
    written = json.loads((tmp_path / "again" / "config.json").read_text())
    assert written["model_type"] == hf.config.model_type
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "again", dtype=torch.float64)
    tokens = torch.randint(0, VOCAB, (1, 30), generator=torch.Generator().manual_seed(2))
    assert torch.equal(
        fp64_logits(reloaded, tokens), fp64_logits(hf, tokens)
    )  # the same fp32 weights, the same computation
    import_hf(tmp_path / "again", tmp_path / "back.pt")
    before, after = read_model(tmp_path / "model.pt"), read_model(tmp_path / "back.pt")
    assert after.args == before.args and all(torch.equal(before.state[k], after.state[k]) for k in before.state)


@pytest.mark.parametrize(
    "change, message",
    [
        (
            {"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}},
            "rope_parameters rope_type 'yarn' is not supported",
        ),
        (
            {"rope_parameters": {"rope_type": "llama3", "rope_theta": 1e4, "factor": 8.0}},
            "rope_parameters of type llama3 lack low_freq_factor",
        ),
        ({"attention_bias": True}, "attention_bias = True is not supported"),
        ({"mlp_bias": True}, "mlp_bias = True is not supported"),
        ({"hidden_act": "gelu"}, "hidden_act = 'gelu' is not supported"),
        ({"partial_rotary_factor": 0.5}, "partial_rotary_factor = 0.5 is not supported"),
        ({"use_sliding_window": True}, "use_sliding_window = True is not supported"),
        ({"layer_types": ["full_attention", "sliding_attention"]}, "layer_types has sliding_attention layers"),
        ({"head_dim": 7}, "config.json: model: head_dim 7 must be even"),
        ({"model_type": "gemma"}, "model_type 'gemma' is not a decoder family"),
    ],
)
def test_what_the_model_cannot_compute_is_refused_in_one_line_naming_the_key(tmp_path, change, message):
    save_family(tmp_path / "hf", "qwen3-head-dim-16")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(StreambackError, match=message) as caught:
        import_hf(tmp_path / "hf", tmp_path / "model.pt")
    assert "\n" not in str(caught.value)
    assert not (tmp_path / "model.pt").exists()


def test_mistral_sliding_window_is_refused(tmp_path):
    save_family(tmp_path / "hf", "mistral-head-dim-8")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**config, "sliding_window": 32}))
    with pytest.raises(StreambackError, match="sliding_window = 32 is not supported"):
        import_hf(tmp_path / "hf", tmp_path / "model.pt")


BEFORE = "25e70de"  # the last commit before the model's import options


def model_before_options():
    """streamback/model/model.py as it was at BEFORE, loaded beside today's (it imports the same helpers)."""
    source = subprocess.run(
        ["git", "show", f"{BEFORE}:streamback/model/model.py"], cwd=ROOT, capture_output=True, text=True
    )
    if source.returncode:
        pytest.skip(f"git show {BEFORE} failed here: {source.stderr.strip()}")
    spec = importlib.util.spec_from_loader("streamback_model_before", loader=None)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    exec(compile(source.stdout, f"{BEFORE}:model.py", "exec"), module.__dict__)
    return module


@pytest.mark.parametrize(
    "kw",
    [
        dict(dim=64, n_heads=4, n_kv_heads=2),
        dict(dim=189, n_heads=2, n_kv_heads=1, tied_embeddings=True, block="streamback", stream="fp32"),
    ],
    ids=["baseline", "tied-streamback-head-dim-94"],
)
def test_the_study_shapes_compute_bit_for_bit_what_they_did_before_the_options(kw):
    before = model_before_options()
    common = dict(n_layers=2, vocab_size=211, multiple_of=32, max_seq_len=64, **kw)
    old, new = before.Transformer(before.ModelArgs(**common)), Transformer(ModelArgs(**common))
    old.init_weights(seed=4)
    new.init_weights(seed=4)
    assert list(old.state_dict()) == list(new.state_dict())
    assert count_params(old) == count_params(new)
    assert all(torch.equal(a, b) for a, b in zip(old.state_dict().values(), new.state_dict().values()))
    tokens = torch.randint(0, 211, (2, 33), generator=torch.Generator().manual_seed(5))
    for model in (old, new):
        model(tokens[:, :-1], tokens[:, 1:]).backward()
        model.logits_seen = model(tokens[:, :-1]).detach()
    assert torch.equal(old.logits_seen, new.logits_seen)
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(old.parameters(), new.parameters()))
