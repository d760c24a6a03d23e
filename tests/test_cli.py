"""The `streamback` CLI: every stage is listed, and bad input exits 2 with a message."""

import subprocess
import sys

from streamback.cli import COMMANDS, main


def test_help_lists_every_stage(capsys):
    try:
        main(["--help"])
    except SystemExit as exit:
        assert exit.code == 0
    out = capsys.readouterr().out
    for name in COMMANDS:
        assert name in out


def test_unknown_stage_is_an_argparse_error():
    result = subprocess.run([sys.executable, "-m", "streamback", "nonsense"], capture_output=True, text=True)
    assert result.returncode == 2
    assert "invalid choice" in result.stderr


def test_bad_params_name_the_problem():
    result = subprocess.run([sys.executable, "-m", "streamback", "drift", "--params", "{not json"],
                            capture_output=True, text=True)
    assert result.returncode == 2
    assert "--params is not valid JSON" in result.stderr
    result = subprocess.run([sys.executable, "-m", "streamback", "drift", "--params", '{"stepz": 1}'],
                            capture_output=True, text=True)
    assert result.returncode == 2
    assert "stepz" in result.stderr
