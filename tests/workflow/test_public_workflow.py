"""Rules export_hf and analyze_public: the default study exports its deepest baseline run in Hugging
Face format and runs the public-model analysis on it, without a download; an empty
analysis.public_models (its one model set to null), or a train.runs without the exported run, plans no
such job."""

import re

import pandas as pd
import pytest
import yaml

from streamback import layout
from streamback.config import DEFAULT_CONFIG, merge_config, read_config_file, validate_config

from conftest import ROOT, SMALL


def test_the_public_tables_plan_the_export_and_the_runs_it_reads(run_snakemake, tmp_path):
    """Asked for the public-model tables alone, Snakemake plans the exported run's training and export
    and nothing else of the study (a dry run)."""
    (tmp_path / "small.yaml").write_text(yaml.safe_dump(SMALL))
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


@pytest.mark.slow
def test_the_default_study_analyses_its_own_exported_run(study):
    """The shared study (conftest's `study`) exported its deepest baseline run and analysed it as a
    public model: the Hugging Face files, a Llama config, and the flip ratios of its eight blocks over
    analysis.public_sequences x public_seq_len tokens."""
    root = study.root
    small = yaml.safe_load((root / "small.yaml").read_text())
    analysis = validate_config(merge_config(read_config_file(DEFAULT_CONFIG), small))["analysis"]
    hf = root / layout.hf_dir("tiny-skinny-tall-baseline")
    assert all((root / path).is_file() for path in layout.hf_files("tiny-skinny-tall-baseline"))
    assert "1 models on cpu" in (root / "logs" / "analysis" / "public.log").read_text()
    ratios = pd.read_csv(root / layout.table("public_flip_ratio"))
    overall = ratios.query("kind == 'gradients' and variant == 'fp32' and layer == 'all'")
    assert list(overall.model) == ["tiny-skinny-tall-baseline-hf"]
    assert list(overall.tokens) == [analysis["public_sequences"] * analysis["public_seq_len"]]
    assert len(ratios.query("kind == 'gradients' and variant == 'fp32'")) == 8 + 1  # eight blocks, then all
    for path in layout.analysis_outputs("public", ["tiny-skinny-tall-baseline-hf"], []):
        assert (root / path).stat().st_size > 0, path
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
