"""Parity with a peer implementation: the fp32 model and its `streamback export-hf` export loaded
by transformers give the same logits (max abs difference under 1e-4, random weights and tokens),
including the medium shape's head_dim 94 and tied embeddings; bad checkpoints are named."""

import json

import pytest
import torch

from streamback.cli import main as cli_main
from streamback.errors import StreambackError
from streamback.model.export_hf import export, load_checkpoint, save_checkpoint
from streamback.model.model import ModelArgs, Transformer

transformers = pytest.importorskip("transformers")


def random_model(**kw) -> Transformer:
    base = dict(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=211, multiple_of=32, max_seq_len=128)
    model = Transformer(ModelArgs(**{**base, **kw}), compute_dtype=torch.float32)
    model.init_weights(seed=5)
    with torch.no_grad():  # norm gains away from 1 so that a mixed-up norm would show
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    return model


def hf_logits(directory, tokens):
    hf = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    with torch.no_grad():
        return hf(tokens).logits, hf


def assert_parity(model, tmp_path, via_cli=False):
    save_checkpoint(model, tmp_path / "model.pt")
    out = tmp_path / "hf"
    if via_cli:
        assert cli_main(["export-hf", "--checkpoint", str(tmp_path / "model.pt"), "--out", str(out)]) == 0
    else:
        export(tmp_path / "model.pt", out)
    tokens = torch.randint(0, model.args.vocab_size, (2, 100), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours = model(tokens)
    theirs, hf = hf_logits(out, tokens)
    assert (ours - theirs).abs().max().item() < 1e-4
    return hf


def test_hf_parity(tmp_path):
    hf = assert_parity(random_model(), tmp_path, via_cli=True)
    assert type(hf).__name__ == "LlamaForCausalLM"
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["rope_theta"] == 500000.0 and config["streamback"] == {"block": "baseline", "stream": "fp32"}


def test_hf_parity_head_dim_94(tmp_path):
    """dim 189 with 2 heads: head_dim 94 and a query width (188) that differs from dim, as in the
    medium shape (1512 / 16)."""
    model = random_model(dim=189, n_heads=2, n_kv_heads=1)
    assert model.args.head_dim == 94
    hf = assert_parity(model, tmp_path)
    assert hf.config.head_dim == 94  # transformers 5's Llama config refuses it: exported as Mistral


def test_hf_parity_tied_embeddings_and_streamback_weights(tmp_path):
    model = random_model(tied_embeddings=True, block="streamback")
    assert_parity(model, tmp_path)


@pytest.mark.parametrize(
    "content, words",
    [
        ("not a checkpoint", "cannot be read"),
        ({"model": {}}, "model_args"),
        ({"model_args": {"dim": 64}, "model": {}}, "missing keys"),
    ],
)
def test_bad_checkpoints_are_named(tmp_path, content, words):
    path = tmp_path / "bad.pt"
    if isinstance(content, str):
        path.write_text(content)
    else:
        torch.save(content, path)
    with pytest.raises(StreambackError, match=words):
        load_checkpoint(path)


def test_checkpoint_shape_mismatch_is_named(tmp_path):
    model = random_model()
    state = model.state_dict()
    state["norm.weight"] = torch.ones(3)
    torch.save({"model_args": {**vars(model.args)}, "model": state}, tmp_path / "m.pt")
    with pytest.raises(StreambackError, match=r"norm.weight has shape \(3,\)"):
        load_checkpoint(tmp_path / "m.pt")
    assert cli_main(["export-hf", "--checkpoint", str(tmp_path / "nope.pt"), "--out", str(tmp_path / "o")]) == 2
