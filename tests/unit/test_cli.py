"""The `streamback` CLI: every stage is listed with its line, every option with its default, and
bad input exits 2 with a message."""

import argparse
import importlib
import os
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


def test_check_and_the_snakefile_resolve_a_config_one_way(tmp_path, capsys):
    """`streamback check` and the Snakefile both run check.resolve: eval.last_checkpoints reaching
    back past step 0, which only the Snakefile used to refuse, is refused by both."""
    from conftest import ROOT

    from streamback.check import read_files, resolve

    snakefile = (ROOT / "Snakefile").read_text()
    assert "resolved, warnings = resolve(config)" in snakefile and "validate_config" not in snakefile
    bad = tmp_path / "far.yaml"
    bad.write_text("eval: {last_checkpoints: 4, checkpoint_spacing: 100}\n")
    assert main(["check", str(bad)]) == 2
    message = "eval.last_checkpoints (4) and eval.checkpoint_spacing (100) reach back (k-1) x spacing = 300 steps"
    assert message in capsys.readouterr().err
    config, warnings = resolve(read_files([]))
    assert warnings == [] and config["cpu_bf16"] == "emulated" and config["train"]["seq_len"] == 128


def test_a_public_model_exported_from_a_run_left_out_of_the_matrix_is_dropped(tmp_path, monkeypatch, capsys):
    """The default public model is the export of tiny-skinny-tall-baseline (rule export_hf): a train.runs without
    that run could not make it, so it is dropped (set to null) with a warning naming the key, the run and the fix;
    kept with its run in the matrix, or where its export is there already."""
    from streamback.check import drop_unexported_public_models
    from streamback.config import ROOT, merge_config, public_models, read_config_file, validate_config
    from streamback.runs import run_matrix

    monkeypatch.chdir(tmp_path)
    default = read_config_file(ROOT / "config" / "config.yaml")
    narrow = {"train": {"runs": {"shapes": ["tiny-fat-short"], "streams": [], "seeds": [0]}}}
    narrowed = validate_config(merge_config(default, narrow))
    runs = run_matrix(narrowed["train"])
    assert drop_unexported_public_models(narrowed["analysis"], runs) == [
        (
            "analysis.public_models.tiny-skinny-tall-baseline-hf dropped: results/hf/tiny-skinny-tall-baseline is the "
            "Hugging Face export of run 'tiny-skinny-tall-baseline', which is not in the train.runs matrix "
            "(tiny-fat-short-baseline, tiny-fat-short-streamback); add the run to train.runs to analyse it, or set "
            "analysis.public_models.tiny-skinny-tall-baseline-hf to null"
        )
    ]
    assert public_models(narrowed["analysis"]) == {}
    full = validate_config(default)
    assert drop_unexported_public_models(full["analysis"], run_matrix(full["train"])) == []
    assert public_models(full["analysis"]) == {"tiny-skinny-tall-baseline-hf": "results/hf/tiny-skinny-tall-baseline"}
    small = tmp_path / "small.yaml"
    small.write_text("train: {runs: {shapes: [tiny-fat-short], streams: []}}\n")
    assert main(["check", str(small)]) == 0
    assert "warning: analysis.public_models.tiny-skinny-tall-baseline-hf dropped: " in capsys.readouterr().err
    (tmp_path / "results" / "hf" / "tiny-skinny-tall-baseline").mkdir(parents=True)
    (tmp_path / "results" / "hf" / "tiny-skinny-tall-baseline" / "config.json").write_text("{}")
    again = validate_config(merge_config(default, narrow))
    assert drop_unexported_public_models(again["analysis"], runs) == [] and public_models(again["analysis"])


@pytest.mark.parametrize("world_size", ["1", "2"])
def test_a_torchrun_worker_exits_with_its_status_without_the_interpreter_s_finalization(world_size):
    """`python -m streamback` ends through `cli.exit_with`: in a torchrun worker (WORLD_SIZE > 1) with the stage's
    status, what it printed flushed, and no finalization (an atexit hook stands for it: gloo's threads abort a
    finalizing interpreter, docs/reliability.md); elsewhere as sys.exit, finalization and all."""
    code = (
        "import atexit, sys; from streamback.cli import exit_with; "
        "atexit.register(lambda: print('finalized', file=sys.stderr)); print('outputs written', end=''); exit_with(75)"
    )
    env = {**os.environ, "WORLD_SIZE": world_size}
    done = subprocess.run(
        [sys.executable, "-c", code], check=False, capture_output=True, text=True, env=env, timeout=60
    )
    assert (done.returncode, done.stdout) == (75, "outputs written"), done.stderr
    assert ("finalized" in done.stderr) == (world_size == "1"), done.stderr
