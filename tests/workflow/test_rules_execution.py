"""Every rule whose job runs model code computes on the config's kernel path: the workflow's own
dry run (`snakemake -n -p`) lists each job's command line; each that runs a model stage
(`cli.MODEL_STAGES`, train through its attempt's `--`) is parsed as `streamback` parses it and
its execution decided as `cli.main` decides it, in the environment every job gets
(`jobs.execution_environment`, exported by workflow/rules/common.smk's shell prefix)."""

import re
import shlex

import pytest
import yaml

from streamback import cli, jobs
from streamback.config import DEFAULT_CONFIG, merge_config, read_config_file, validate_config
from streamback.model import compute

from conftest import ROOT

# the rules that run model code, each of which must be met in the default study's dry run
MODEL_RULES = {
    "preflight_run",
    "train",
    "evaluate",
    "analyze_layer_error",
    "analyze_envelope",
    "analyze_swallowed",
    "analyze_loss_difference",
    "analyze_public",
    "export_hf",
}


def planned_commands(run_snakemake, directory, config_file) -> dict[str, list[list[str]]]:
    """rule -> the argv (after `streamback`) of each of its jobs that runs a streamback stage."""
    result = run_snakemake("-n", "-p", "--forceall", "--directory", directory, "--configfile", config_file)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    commands: dict[str, list[list[str]]] = {}
    for block in re.split(r"\n(?=(?:local)?rule \w+:)", result.stdout):
        rule = re.match(r"(?:local)?rule (\w+):", block)
        shell = re.search(r"^Shell command: (.*)$", block, re.MULTILINE)
        if not rule or not shell:
            continue
        words = shlex.split(shell.group(1))
        start = next((i for i, w in enumerate(words) if w in cli.COMMANDS and words[i - 1] == "streamback"), None)
        if start is None:  # `Shell command: None` (rule all, a run: block)
            continue
        end = next((i for i, w in enumerate(words) if i > start and w in (">", "||")), len(words))
        argv = words[start:end]
        if argv[0] == "train-attempt":  # the attempt starts `<launch> train <what follows -->`
            argv = ["train", *argv[argv.index("--") + 1 :]]
        commands.setdefault(rule.group(1), []).append(argv)
    return commands


def test_the_environment_every_job_gets_names_the_kernel_setting():
    config = validate_config(read_config_file(DEFAULT_CONFIG))
    assert jobs.execution_environment(config) == {compute.ENV: config["cpu_bf16"]}
    common = (ROOT / "workflow" / "rules" / "common.smk").read_text()
    prefix = common[common.index("shell.prefix(") :]
    assert "jobs.execution_environment(config)" in common and "{EXECUTION_ENV" in prefix
    assert "--cpu-bf16" not in "".join(p.read_text() for p in (ROOT / "workflow" / "rules").glob("*.smk"))


@pytest.mark.parametrize("cpu_bf16", ["native", "emulated"])
def test_every_rule_that_runs_model_code_computes_on_the_configs_kernels(
    run_snakemake, tmp_path, monkeypatch, cpu_bf16
):
    config_file = tmp_path / "config.yaml"
    config = merge_config(read_config_file(DEFAULT_CONFIG), {"cpu_bf16": cpu_bf16})
    config_file.write_text(yaml.safe_dump(config))
    commands = planned_commands(run_snakemake, tmp_path, config_file)
    model_rules = {rule for rule, argvs in commands.items() if any(a[0] in cli.MODEL_STAGES for a in argvs)}
    assert model_rules == MODEL_RULES
    for name, value in jobs.execution_environment(validate_config(config)).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv(compute.FORCE_NATIVE_ENV, "1")  # auto would be native too: only the config's value passes
    for rule in sorted(model_rules):
        for argv in commands[rule]:
            chosen = cli.execution_of(cli.parse(argv))
            assert (chosen.cpu_bf16, chosen.emulated) == (cpu_bf16, cpu_bf16 == "emulated"), (rule, argv[:3])
            assert chosen.kernels("cpu") == (
                "bf16 on fp32 kernels on cpu" if cpu_bf16 == "emulated" else "native bf16 on cpu"
            )
