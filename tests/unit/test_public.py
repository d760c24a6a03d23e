"""`streamback analyze public`: a public model (here a small random Qwen3 saved by transformers, with
the study's tokenizer) through the layer-error and swallowed analyses on the study's validation
text in its own tokens; the flip ratio's bootstrap interval against scipy's; bad settings named."""

import json
import shutil

import numpy as np
import pandas as pd
import pytest
import torch

from streamback import layout
from streamback.analysis.public import public_tables, public_windows
from streamback.config import validate_config
from streamback.data.shards import TokenDataset
from streamback.errors import StreambackError
from streamback.stats import bootstrap_ratio_ci

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_study_text_in_its_own_tokenizer_gives_back_its_own_tokens(tokens):
    """Decoded document by document and encoded again with the same tokenizer, the val split is what the data stage
    wrote."""
    windows = public_windows(tokens, tokens / "tokenizer.json", 64, 5, 300)
    assert torch.equal(windows.flatten(), torch.from_numpy(TokenDataset(tokens, "val").read(0, 5 * 65)))
    with pytest.raises(StreambackError, match=r"fewer than the 100000 x 65 asked for \(analysis.public_sequences"):
        public_windows(tokens, tokens / "tokenizer.json", 64, 100000, 300)
    with pytest.raises(StreambackError, match="outside the model's 200-row embedding"):
        public_windows(tokens, tokens / "tokenizer.json", 64, 5, 200)


def test_the_ratio_interval_is_scipys_percentile_bootstrap():
    from scipy.stats import bootstrap

    rng = np.random.default_rng(3)
    a, b = rng.poisson(40, 30).astype(float), rng.poisson(70, 30).astype(float)
    ratio, low, high = bootstrap_ratio_ci(a, b, 0.9, resamples=20000, seed=1)
    # derived: one fp64 quotient of integer sums, both sides: exact up to 1 ulp
    assert ratio == pytest.approx(a.sum() / b.sum(), rel=1e-12)
    theirs = bootstrap(
        (a, b),
        lambda x, y: x.sum() / y.sum(),
        paired=True,
        vectorized=False,
        confidence_level=0.9,
        n_resamples=20000,
        method="percentile",
        random_state=2,
    ).confidence_interval
    # derived: two percentile bootstraps, 20000 resamples each, other seeds: each 5% quantile has Monte Carlo sd
    # ~3e-4 (ratio 0.57, sd 0.021): 0.01 is 20 sd of their difference
    assert low == pytest.approx(theirs.low, abs=0.01) and high == pytest.approx(theirs.high, abs=0.01)
    assert np.isnan(bootstrap_ratio_ci([1, 2], [0, 0])[0])


@pytest.mark.parametrize(
    "ratio, low, high, verdict",
    [
        (0.5, 0.4, 0.6, "roughly half: the claim holds"),
        (0.81, 0.72, 0.92, "fewer flips, but not half"),
        (0.9, 0.7, 1.1, "no difference shown"),
        (1.3, 1.1, 1.5, "more flips with the fp32 stream"),
        (0.2, 0.1, 0.3, "fewer than half"),
        (float("nan"), float("nan"), float("nan"), "no sign flips in the bf16 stream"),
    ],
)
def test_the_page_reads_the_ratio_against_the_claim(ratio, low, high, verdict):
    from streamback.report.page import halving_verdict

    assert halving_verdict(ratio, low, high).startswith(verdict)


def qwen3(directory, tokens):
    torch.manual_seed(0)
    config = transformers.Qwen3Config(
        vocab_size=320,
        hidden_size=48,
        intermediate_size=96,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=64,
        tie_word_embeddings=True,
    )
    model = transformers.Qwen3ForCausalLM(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    model.save_pretrained(directory)
    shutil.copy(tokens / "tokenizer.json", directory / "tokenizer.json")


def settings(models, **kw):
    return validate_config(
        {
            "analysis": {
                "public_models": models,
                "public_sequences": 4,
                "public_seq_len": 32,
                "reference": "fp64",
                "variants": ["bf16", "fp32", "fp8_e4m3"],
                **kw,
            }
        }
    )["analysis"]


def test_a_public_model_through_both_analyses(tmp_path, tokens):
    qwen3(tmp_path / "qwen", tokens)
    tables = public_tables({"q": str(tmp_path / "qwen")}, settings({"q": str(tmp_path / "qwen")}), tokens, "cpu")
    errors, swallowed, ratios = tables["public_layer_error"], tables["public_swallowed"], tables["public_flip_ratio"]
    assert list(errors.columns) == [
        "model",
        "variant",
        "kind",
        "layer",
        "max_abs_error",
        "rel_error",
        "sign_flips",
        "sign_flip_fraction",
        "sequences",
        "tokens",
    ]
    assert list(dict.fromkeys(errors.variant)) == ["bf16", "fp32", "fp8_e4m3"] and set(errors.tokens) == {4 * 32}
    assert len(errors) == 3 * (5 + 5 + 4)
    acts = errors[errors.kind == "activations"].set_index(["variant", "layer"])
    # h_0 is the embedding rounded to the bf16 compute dtype: an fp32 stream holds it as it is, an fp8 one rounds
    # it again
    assert (
        0
        < acts.loc[("fp32", 0), "max_abs_error"]
        == acts.loc[("bf16", 0), "max_abs_error"]
        < acts.loc[("fp8_e4m3", 0), "max_abs_error"]
    )
    grads = errors[errors.kind == "gradients"].pivot(index="layer", columns="variant", values="sign_flips")
    overall = ratios[(ratios.kind == "gradients") & (ratios.layer == "all")].set_index("variant")
    assert (
        overall.loc["fp32", "sign_flips"] == grads.fp32.sum()
        and overall.loc["fp32", "bf16_sign_flips"] == grads.bf16.sum()
    )
    # derived: the same formula by hand on the same floats (fp64 roundings only, within approx's default 1e-6)
    assert overall.loc["fp32", "flip_ratio"] == pytest.approx(grads.fp32.sum() / grads.bf16.sum())
    finite = ratios.dropna(subset=["flip_ratio"])  # h_0 has no flips in either stream: 0 / 0
    assert len(finite) >= len(ratios) - 2 and set(ratios.drop(finite.index).layer) <= {"0"}
    assert (finite.flip_ratio_low <= finite.flip_ratio + 1e-12).all() and (
        finite.flip_ratio <= finite.flip_ratio_high + 1e-12
    ).all()
    per_layer = ratios[(ratios.kind == "gradients") & (ratios.variant == "fp32") & (ratios.layer != "all")]
    assert list(per_layer.layer) == ["0", "1", "2", "3"]
    means = swallowed.groupby("variant").swallowed_fraction.mean()
    assert means.fp32 < means.bf16 < means.fp8_e4m3
    assert set(swallowed.tokens) == {128} and set(swallowed.model) == {"q"}


def test_the_command_writes_its_tables_and_figures_and_names_bad_settings(tmp_path, tokens, monkeypatch, capsys):
    from streamback.cli import main

    qwen3(tmp_path / "qwen", tokens)
    monkeypatch.chdir(tmp_path)
    params = {
        "public_models": {"qwen": str(tmp_path / "qwen")},
        "public_sequences": 2,
        "public_seq_len": 16,
        "variants": ["fp32"],
    }
    args = ["analyze", "public", "--data", str(tokens), "--train-params", "{}", "--device", "cpu", "--threads", "1"]
    assert main([*args, "--params", json.dumps(params)]) == 0, capsys.readouterr().err[-2000:]
    for path in layout.analysis_outputs("public", ["qwen"], []):
        assert (tmp_path / path).stat().st_size > 0, path
    assert (
        "sign flips fp32 / bf16 over all layers"
        in (tmp_path / layout.figure("public_gradients-qwen", "svg")).read_text()
    )
    assert set(pd.read_csv(layout.table("public_flip_ratio")).variant) == {"fp32"}
    from streamback.html_report import Caption, Missing
    from streamback.report.page import Study, public_section

    study = Study(validate_config({"analysis": params}), [])
    said = public_section(study)[0]
    assert isinstance(said, Caption) and "qwen (" in said and "32 tokens in 2 sequences, ground truth fp32" in said
    ratio = pd.read_csv(layout.table("public_flip_ratio")).query("kind == 'gradients' and layer == 'all'").iloc[0]
    assert f"bf16 stream, {ratio.flip_ratio:.2f} over all layers" in said
    layout.table("public_swallowed").unlink()
    assert isinstance(public_section(study)[0], Missing)
    for bad, message in (
        ({}, "analysis.public_models is empty"),
        ({"qwen": str(tmp_path)}, "has no config.json"),
        ({"../x": str(tmp_path / "qwen")}, "does not match"),
    ):
        assert main([*args, "--params", json.dumps({**params, "public_models": bad})]) != 0
        assert message in capsys.readouterr().err
