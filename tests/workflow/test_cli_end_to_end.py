"""The end-to-end half of test_cli.py (commands run as processes, compiled or multi-process runs, Snakemake): the same
subjects, at the pace of whole runs."""

import subprocess
import sys


def test_bad_params_name_the_problem():
    result = subprocess.run(
        [sys.executable, "-m", "streamback", "drift", "--params", "{not json"], capture_output=True, text=True
    )
    assert result.returncode == 2
    assert "--params is not valid JSON" in result.stderr
    result = subprocess.run(
        [sys.executable, "-m", "streamback", "drift", "--params", '{"stepz": 1}'], capture_output=True, text=True
    )
    assert result.returncode == 2
    assert "stepz" in result.stderr


def test_check_merges_config_files_as_snakemake_does():
    from snakemake.utils import update_config as snakemake_update

    from streamback.config import merge_config

    base = {"a": {"b": 1, "c": {"d": 2, "e": [1, 2]}}, "f": 3}
    override = {"a": {"c": {"d": 5}, "g": None}, "f": {"h": 1}}
    expected = {"a": {"b": 1, "c": {"d": 2, "e": [1, 2]}}, "f": 3}
    snakemake_update(expected, override)
    assert merge_config(base, override) == expected and base["a"]["c"]["d"] == 2
