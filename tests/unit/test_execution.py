"""One execution per process (streamback/model/execution.py): threads and the CPU kernel path are
decided once from the job's config, applied around the work and given back after it, so that an
in-process stage (a test calling `cli.main`) leaves nothing set for the next caller; and
STREAMBACK_FORCE_NATIVE_BF16=1 makes `auto` take the native path on any CPU."""

import pytest
import torch
import yaml

from streamback import cli
from streamback.config import DEFAULT_CONFIG, read_config_file, validate_config
from streamback.errors import StreambackError
from streamback.model import compute, execution

# kernel-sensitive: CI runs these again on the other kernel path (.ci/run)
pytestmark = pytest.mark.kernels


@pytest.fixture
def forced_native(monkeypatch):
    """auto resolves to native on this CPU, whatever its kernels; no STREAMBACK_CPU_BF16 set."""
    monkeypatch.setenv(compute.FORCE_NATIVE_ENV, "1")
    monkeypatch.delenv(compute.ENV, raising=False)


def test_the_switch_makes_auto_native_on_any_cpu(monkeypatch):
    monkeypatch.delenv(compute.FORCE_NATIVE_ENV, raising=False)
    assert compute.resolves_to_emulated("auto") is not compute.cpu_has_native_bf16()
    monkeypatch.setenv(compute.FORCE_NATIVE_ENV, "1")
    assert compute.resolves_to_emulated("auto") is False
    assert (compute.resolves_to_emulated("emulated"), compute.resolves_to_emulated("native")) == (True, False)
    with compute.use("auto"):
        assert compute.path("cpu") == "native bf16"
        x, w = torch.randn(3, 8).bfloat16(), torch.randn(5, 8).bfloat16()
        assert torch.equal(compute.linear(x, w), torch.nn.functional.linear(x, w))  # torch's bf16 kernel itself


@pytest.mark.parametrize("outer", ["native", "auto", "emulated"])
def test_an_in_process_stage_gives_the_previous_kernels_back(forced_native, outer):
    """`streamback analyze` in-process reads the default config (cpu_bf16: emulated) and fails on
    a run name after its execution was decided: the caller's path is still its own afterwards."""
    assert validate_config(read_config_file(DEFAULT_CONFIG))["cpu_bf16"] == "emulated"
    threads = torch.get_num_threads()
    with compute.use(outer):
        before = (compute.mode(), compute.emulated())
        assert cli.main(["analyze", "layer-error", "--runs", "no-such-run", "--threads", "1"]) == 2
        assert (compute.mode(), compute.emulated()) == before == (outer, outer == "emulated")
    assert torch.get_num_threads() == threads


def test_applied_sets_threads_and_kernels_for_the_block_only(forced_native):
    outside = (compute.mode(), compute.emulated(), torch.get_num_threads())
    chosen = execution.decide("emulated", threads=1)
    with execution.applied(chosen) as seen:
        assert seen is chosen
        assert (compute.mode(), compute.emulated(), torch.get_num_threads()) == ("emulated", True, 1)
        assert (
            chosen.kernels("cpu") == "bf16 on fp32 kernels on cpu" and chosen.kernels("meta") == "native bf16 on meta"
        )
        with execution.applied(execution.decide("auto")):
            assert (compute.mode(), compute.emulated()) == ("auto", False)
        assert (compute.mode(), compute.emulated()) == ("emulated", True)
    assert (compute.mode(), compute.emulated(), torch.get_num_threads()) == outside
    with pytest.raises(StreambackError, match=r"^cpu_bf16 of x.yaml: 'fast' is not one of auto, native, emulated$"):
        execution.decide("fast", "cpu_bf16 of x.yaml")
    with pytest.raises(StreambackError, match=r"^--threads must be at least 1, got 0$"):
        execution.decide("auto", threads=0)


def test_a_stage_takes_its_config_file_then_the_environment_then_the_default_config(
    forced_native, monkeypatch, tmp_path, capsys
):
    native = tmp_path / "native.yaml"
    native.write_text(yaml.safe_dump({"cpu_bf16": "native"}))
    train = ["train", "--run-name", "tiny-medium-baseline"]
    chosen = cli.execution_of(cli.parse([*train, "--config", str(native)]))
    assert (chosen.cpu_bf16, chosen.emulated, chosen.source) == ("native", False, f"cpu_bf16 of {native}")
    assert chosen.threads == 1  # the run's train.resources.threads, as the rule passes them
    preflight = cli.execution_of(cli.parse(["preflight", "--arm", "tiny-medium-baseline"]))
    assert (preflight.cpu_bf16, preflight.threads) == ("emulated", 1)  # the default config's, as its train job's
    assert cli.execution_of(cli.parse([*train, "--params", "{}"])).cpu_bf16 == "auto"
    assert cli.execution_of(cli.parse(train)).cpu_bf16 == "emulated"  # the default config's
    monkeypatch.setenv(compute.ENV, "native")  # what a workflow job gets (jobs.execution_environment)
    assert cli.execution_of(cli.parse([*train, "--params", "{}", "--threads", "2"])).threads == 2
    assert cli.execution_of(cli.parse(train)).cpu_bf16 == "native"
    assert capsys.readouterr().err == ""
    monkeypatch.setenv(compute.ENV, "auto")
    assert cli.execution_of(cli.parse([*train, "--config", str(native)])).cpu_bf16 == "native"
    assert capsys.readouterr().err == f"warning: {compute.ENV}=auto is ignored: cpu_bf16 of {native} says native\n"
