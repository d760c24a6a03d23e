"""Rules export_hf and analyze_public: the default study exports its deepest baseline run in Hugging
Face format and runs the public-model analysis on it, without a download; an empty
analysis.public_models (its one model set to null), or a train.runs without the exported run, plans no
such job."""

import re

import pandas as pd
import pytest
import yaml

from streamback import layout

from conftest import ROOT, SMALL


@pytest.mark.slow
def test_the_default_study_analyses_its_own_exported_run(run_snakemake, tmp_path):
    small = {
        **SMALL,
        "train": {**SMALL["train"], "runs": {"seeds": [0]}},
        "analysis": {"public_sequences": 3, "public_seq_len": 64},
    }
    (tmp_path / "small.yaml").write_text(yaml.safe_dump(small))
    targets = [layout.table(name) for name in layout.ANALYSIS_TABLES["public"]]
    common = ("--directory", tmp_path, "--configfile", ROOT / "config" / "config.yaml", tmp_path / "small.yaml")
    planned = run_snakemake(*targets, "-n", *common)
    assert planned.returncode == 0, planned.stderr[-3000:]
    assert sorted(set(re.findall(r"^rule (\w+):", planned.stdout, flags=re.M))) == [
        "analyze_public",
        "corpus",
        "export_hf",
        "preflight_run",
        "preflight_unbounded",
        "tokenize",
        "train",
        "train_recipe",
    ]
    result = run_snakemake(*targets, "--cores", "2", *common, timeout=1200)
    assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-3000:]
    hf = tmp_path / layout.hf_dir("tiny-skinny-tall-baseline")
    assert all((tmp_path / path).is_file() for path in layout.hf_files("tiny-skinny-tall-baseline"))
    assert "1 models on cpu" in (tmp_path / "logs" / "analysis" / "public.log").read_text()
    ratios = pd.read_csv(tmp_path / layout.table("public_flip_ratio"))
    overall = ratios.query("kind == 'gradients' and variant == 'fp32' and layer == 'all'")
    assert list(overall.model) == ["tiny-skinny-tall-baseline-hf"] and list(overall.tokens) == [3 * 64]
    assert len(ratios.query("kind == 'gradients' and variant == 'fp32'")) == 8 + 1  # eight blocks, then all
    for path in layout.analysis_outputs("public", ["tiny-skinny-tall-baseline-hf"], []):
        assert (tmp_path / path).stat().st_size > 0, path
    assert (hf / "config.json").read_text().count('"model_type": "llama"') == 1


def test_a_public_model_set_to_null_plans_no_public_job(run_snakemake, tmp_path):
    """A config merged over the default drops its model by naming it null (a merge never removes a key)."""
    (tmp_path / "none.yaml").write_text(
        yaml.safe_dump({"analysis": {"public_models": {"tiny-skinny-tall-baseline-hf": None}}})
    )
    planned = run_snakemake(
        "-n", "--directory", tmp_path, "--configfile", ROOT / "config" / "config.yaml", tmp_path / "none.yaml"
    )
    assert planned.returncode == 0, planned.stderr[-3000:]
    jobs = set(re.findall(r"^rule (\w+):", planned.stdout, flags=re.M))
    assert "train" in jobs and not jobs & {"analyze_public", "export_hf"}


def test_a_matrix_without_the_exported_run_drops_its_model_with_a_warning(run_snakemake, tmp_path):
    """A train.runs narrowed to leave the exported run out: no MissingInputException, the model is dropped, named."""
    narrow = {"train": {"runs": {"shapes": ["tiny-fat-short"], "streams": [], "seeds": [0]}}}
    (tmp_path / "narrow.yaml").write_text(yaml.safe_dump(narrow))
    planned = run_snakemake(
        "-n", "--directory", tmp_path, "--configfile", ROOT / "config" / "config.yaml", tmp_path / "narrow.yaml"
    )
    assert planned.returncode == 0, planned.stderr[-3000:]
    assert "warning: analysis.public_models.tiny-skinny-tall-baseline-hf dropped: " in planned.stderr
    jobs = set(re.findall(r"^rule (\w+):", planned.stdout, flags=re.M))
    assert "train" in jobs and not jobs & {"analyze_public", "export_hf"}
