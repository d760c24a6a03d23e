"""The end-to-end half of test_config.py (commands run as processes, compiled or multi-process runs, Snakemake): the
same subjects, at the pace of whole runs."""

import copy

import pytest
import yaml

from streamback.config import ROOT, SCHEMA, validate_config


@pytest.mark.parametrize("name", ["config.yaml", "paper.yaml"])
def test_same_filled_config_as_snakemake_validate(name):
    """The package's validator (jsonschema) and the Snakefile's (Snakemake's) agree on defaults."""
    from snakemake.utils import validate

    raw = yaml.safe_load((ROOT / "config" / name).read_text())
    by_snakemake = copy.deepcopy(raw)
    validate(by_snakemake, str(SCHEMA))
    assert validate_config(raw) == by_snakemake
