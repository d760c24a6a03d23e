"""The `streamback` CLI: every stage is listed with its line, every option with its default, and
bad input exits 2 with a message."""

import argparse
import importlib
import subprocess
import sys

import pytest

from streamback.cli import COMMANDS, main


def _help(capsys, *argv) -> str:
    """The help text of `streamback *argv --help`, with argparse's line wrapping undone."""
    with pytest.raises(SystemExit) as exit:
        main([*argv, "--help"])
    assert exit.value.code == 0
    return " ".join(capsys.readouterr().out.split())


def test_help_lists_every_stage_with_its_line(capsys):
    out = _help(capsys)
    for name, module in COMMANDS.items():
        assert f"{name} {importlib.import_module(module).HELP}" in out, name


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_option_shows_its_default(capsys, name):
    """Each option's help shows its default (HelpFormatter), or says in words what it is."""
    parser = argparse.ArgumentParser()
    importlib.import_module(COMMANDS[name]).add_arguments(parser)
    out = _help(capsys, name)
    for action in parser._actions:
        if action.option_strings and action.nargs != 0 and action.default not in (None, [], argparse.SUPPRESS):
            words = " ".join((action.help or "").split())
            shown = f"{words} (default: {action.default})" if "default" not in words else words
            assert shown in out, (name, action.option_strings, shown)


def test_unknown_stage_is_an_argparse_error():
    result = subprocess.run([sys.executable, "-m", "streamback", "nonsense"], capture_output=True, text=True)
    assert result.returncode == 2
    assert "invalid choice" in result.stderr


def test_check_names_the_file_and_line_of_invalid_yaml(tmp_path, capsys):
    """What Snakemake cannot say about a --configfile: `streamback check FILE` reads the files as
    Snakemake merges them and names the file, line and column of a YAML error."""
    bad = tmp_path / "small.yaml"
    bad.write_text("train:\n  seq_len: 64\n  tokens: [1, 2\n")
    assert main(["check", str(bad)]) == 2
    assert f"streamback check: error: config file {bad}, line 4, column 1 is not valid YAML" in capsys.readouterr().err
    bad.write_text("train: {batch_size: 6}\n")
    assert main(["check", str(bad)]) == 2
    assert "train.batch_size (6) must be a multiple of micro_batch_size (4) x processes (1)" in capsys.readouterr().err
    bad.write_text("train: {runs: {shapes: [tiny-medium], streams: [mxfp8], seeds: [0, 1]}}\n")
    assert main(["check", str(bad)]) == 0
    assert capsys.readouterr().out == (
        f"config OK (config/config.yaml + {bad}): 5 runs: tiny-medium-baseline, tiny-medium-baseline-seed1, "
        "tiny-medium-streamback, tiny-medium-streamback-seed1, tiny-medium-streamback-mxfp8\n"
    )
