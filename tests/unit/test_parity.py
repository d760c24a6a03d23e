"""Parity with a peer implementation: the fp32 model and its `streamback export-hf` export loaded
by transformers give the same logits (max abs difference under 1e-4, random weights and tokens),
including the medium shape's head_dim 94 and tied embeddings; bad model files are named; the
model file (`streamback.model.weights`) round-trips and records the stream honestly."""

import json

import pytest
import torch

from streamback.cli import main as cli_main
from streamback.errors import StreambackError
from streamback.model.export_hf import export
from streamback.model.model import ModelArgs, Transformer
from streamback.model.weights import HASH, content_sha256, load_model, read_model, save_model

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
    save_model(tmp_path / "model.pt", model.args, model.state_dict(), model.compute_dtype)
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
    assert config["rope_theta"] == 500000.0 and config["streamback"] == {
        "block": "baseline",
        "stream": "fp32",
    }  # fp32 compute


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
    else:  # sealed with its content hash, as save_model seals a record: the structure is what is wrong
        torch.save({**content, HASH: content_sha256(content)}, path)
    with pytest.raises(StreambackError, match=words):
        read_model(path)


def test_checkpoint_shape_mismatch_is_named(tmp_path):
    model = random_model()
    state = model.state_dict()
    state["norm.weight"] = torch.ones(3)
    record = {"model_args": {**vars(model.args)}, "model": state}
    torch.save({**record, HASH: content_sha256(record)}, tmp_path / "m.pt")
    with pytest.raises(StreambackError, match=r"norm.weight has shape \(3,\)"):
        read_model(tmp_path / "m.pt")
    assert cli_main(["export-hf", "--checkpoint", str(tmp_path / "nope.pt"), "--out", str(tmp_path / "o")]) == 2


def test_model_file_round_trip_and_honest_stream(tmp_path):
    """A bf16-compute baseline records its bf16 stream (not ModelArgs' unused default), in the file
    and in the export; load_model rebuilds the same model, or the same weights with another stream."""
    model = Transformer(
        ModelArgs(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=211, multiple_of=32, max_seq_len=128)
    )
    model.init_weights(seed=3)
    save_model(tmp_path / "model.pt", model.args, model.state_dict())
    assert read_model(tmp_path / "model.pt").stream == "bf16"
    export(tmp_path / "model.pt", tmp_path / "hf")
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["streamback"] == {
        "block": "baseline",
        "stream": "bf16",
    }
    tokens = torch.randint(0, 211, (2, 16), generator=torch.Generator().manual_seed(0))
    loaded = load_model(tmp_path / "model.pt")
    assert not loaded.training and loaded.compute_dtype == torch.bfloat16
    with torch.no_grad():
        assert torch.equal(loaded(tokens), model(tokens))
        as_bf16_stream = load_model(tmp_path / "model.pt", stream="bf16")
        assert (as_bf16_stream.args.block, as_bf16_stream.stream_format.label) == ("streamback", "bf16")
        assert torch.equal(as_bf16_stream(tokens), model(tokens))  # the baseline is a bf16 stream
        fp32 = load_model(tmp_path / "model.pt", compute_dtype=torch.float32, stream="fp32")
        assert fp32.stream_format.label == "fp32" and not torch.equal(fp32(tokens), model(tokens))


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_export_files_follow_the_umask(tmp_path, umask, mode):
    """Every file of an export is as readable as the umask lets any written file be (safetensors on
    its own writes 0600, unreadable for a colleague or a shared cache)."""
    import os
    import stat

    model = random_model()
    save_model(tmp_path / "model.pt", model.args, model.state_dict(), model.compute_dtype)
    previous = os.umask(umask)
    try:
        export(tmp_path / "model.pt", tmp_path / "hf")
    finally:
        os.umask(previous)
    files = sorted((tmp_path / "hf").iterdir())
    assert [p.name for p in files] == ["config.json", "model.safetensors"]
    assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in files} == {p.name: mode for p in files}
