"""benchmarks/gpu_checks.py, the one script a lent GPU machine runs: its quick mode end to end on the
CPU (every phase, every check passing, the outputs a device call brings back), its goal logic on
hand-made bench rows, and the device call its docstring prescribes."""

import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest
import torch

from conftest import ROOT, collected_everything

SCRIPT = ROOT / "benchmarks" / "gpu_checks.py"


@pytest.fixture(scope="module")
def gpu_checks():
    spec = importlib.util.spec_from_file_location("gpu_checks", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    """The script with --device cpu --quick."""
    root = tmp_path_factory.mktemp("gpu-checks")
    out = root / "out"
    cmd = [
        sys.executable,
        str(SCRIPT),
        "--device",
        "cpu",
        "--quick",
        "--out",
        str(out),
        "--work",
        str(root / "work"),
        "--budget",
        "900",
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "2"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    return proc, out


@pytest.mark.slow
def test_quick_mode_runs_every_phase_and_passes(quick_run):
    proc, out = quick_run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    status = {}
    for check in summary["checks"]:
        status.setdefault(check["group"], []).append(check["status"])
    assert not [c for c in summary["checks"] if c["status"] in ("FAIL", "SKIP")]
    # tests: the CPU cases of the ulp, E4M3-infinity and NVFP4-recipe tests and a preflight's, one item each, and
    # pytest's own
    assert {g: len(s) for g, s in status.items()} == {
        "env": 2,
        "tests": 10,
        "eval": 3,
        "analysis": 4,
        "profile": 2,
        "bench": 4,
    }
    assert summary["env"]["matmul_bf16_tflops"] > 0 and summary["env"]["copy_tb_s"] > 0
    tests = {c["name"]: c for c in summary["checks"] if c["group"] == "tests"}
    assert "unit/test_rounding.py::test_ulp_against_nextafter[cpu-fp8_e4m3]" in tests
    assert "unit/test_preflight.py::test_a_full_disk_fails_before_training_starts" in tests
    assert tests["pytest"]["value"].startswith("exit 0 after") and "9 passed" in tests["pytest"]["value"]
    assert summary["tests"]["counts"] == {"PASSED": 9}
    # profile: the compiled block's kernels counted and timed against the eager step's launches; the add rounding
    # compared, same bits
    profile = {c["name"]: c for c in summary["checks"] if c["group"] == "profile"}
    assert re.fullmatch(
        r"busy [\d.]+ -> [\d.]+ ms, wall [\d.]+ -> [\d.]+ ms per step; streamback block \d+ \+ \d+ kernels; "
        r"baseline eager [\d,]+ launches per step",
        profile["tiny-medium streamback vs baseline eager"]["value"],
    )
    assert (
        profile["add_rounding"]["status"] == "PASS"
        and "same bits: True, as eager: True" in profile["add_rounding"]["value"]
    )


@pytest.mark.slow
def test_quick_mode_outputs(quick_run):
    proc, out = quick_run
    # what a device call brings back: at most 8 plain files (the caller's tee'd log is the 8th)
    files = sorted(p.name for p in out.iterdir())
    assert files == ["bench.json", "bench.md", "profile.md", "summary.json", "summary.md", "tests.log"]
    assert re.search(r"9 passed", (out / "tests.log").read_text())
    profile = (out / "profile.md").read_text()
    assert (
        "| kind | ms streamback | ms baseline eager | diff ms | launches streamback | launches baseline eager |"
        in profile
    )
    assert re.search(
        r"- streamback, graph 1: \d+ kernels \(cpp \d+\); \d+ library calls", profile
    )  # the block's backward
    bench = json.loads((out / "bench.json").read_text())
    assert [(r["mode"], r["variant"]) for r in bench["rows"]] == [
        ("eager", "baseline"),
        ("eager", "streamback"),
        ("eager", "streamback-reversible"),
        ("compiled", "streamback"),
    ]
    assert all(r["tokens_per_s"] > 0 and not r["error"] for r in bench["rows"])
    assert [g["goal"] for g in bench["goals"]] == ["streamback >= 0.99x baseline tok/s"]
    table = (out / "bench.md").read_text()
    assert "tiny-medium" in table and "| goal | where | value | met |" in table
    # the summary is printed last (a device call returns only the output's last 12,000 characters)
    text = (out / "summary.md").read_text()
    assert proc.stdout.rstrip().endswith(text.rstrip()) and len(text) < 12_000
    assert re.search(r"\d+ checks, 0 failed; \d+ s of a 900 s budget; exit status 0", text)
    assert "| tiny-medium | compiled | streamback |" in text


def test_bench_goals_on_hand_made_rows(gpu_checks):
    rows = [
        {
            "shape": "fat-short",
            "mode": "compiled",
            "variant": "baseline",
            "tokens_per_s": 60_000.0,
            "mfu": 0.40,
            "peak_mem_gib": 28.0,
        },
        {
            "shape": "fat-short",
            "mode": "compiled",
            "variant": "streamback",
            "tokens_per_s": 59_000.0,
            "mfu": 0.39,
            "peak_mem_gib": 31.0,
        },
        {
            "shape": "fat-short",
            "mode": "compiled",
            "variant": "streamback-reversible",
            "tokens_per_s": 58_000.0,
            "peak_mem_gib": 27.5,
        },
        {"shape": "medium", "mode": "eager", "variant": "baseline", "tokens_per_s": 30_000.0, "peak_mem_gib": None},
        {"shape": "medium", "mode": "eager", "variant": "streamback", "error": "OutOfMemoryError: CUDA out of memory"},
    ]
    goals = {(g["goal"], g["where"]): g for g in gpu_checks.bench_goals(rows)}
    ratio = goals[("streamback >= 0.99x baseline tok/s", "fat-short compiled")]
    assert ratio["value"] == "0.983x" and ratio["met"] is False  # 59,000 / 60,000 < 0.99
    memory = goals[("reversible peak <= baseline peak", "fat-short compiled")]
    assert memory["met"] is True and memory["value"] == "27.50 vs 28.00 GiB"
    reversible = goals[("reversible >= 0.97x baseline tok/s", "fat-short compiled")]
    assert reversible["value"] == "0.967x" and reversible["met"] is False  # 58,000 / 60,000 < 0.97
    mfu = goals[("baseline MFU >= 72%", "fat-short compiled")]
    assert mfu["value"] == "40.0%" and mfu["met"] is False
    ref = goals[("tok/s (MFU) above the reference", "fat-short compiled baseline")]
    # same FLOPs per token: the reference's MFU is this run's MFU x 55,966 / 60,000
    assert ref["met"] is True and ref["value"] == "60,000 vs 55,966 tok/s (MFU 40.0% vs 37.3%); peak 28.0 vs 28.7 GiB"
    assert goals[("tok/s (MFU) above the reference", "fat-short compiled streamback")]["met"] is True
    assert goals[("tok/s (MFU) above the reference", "medium eager baseline")]["met"] is False  # 30,000 < 35,146
    # a failed row (OOM) gives no ratio, and a row without mfu or peak still gets its tok/s goal;
    # the reversible stream's speed and the MFU goals are the compiled step's
    assert ("streamback >= 0.99x baseline tok/s", "medium eager") not in goals
    assert len(goals) == 7


def test_pytest_outcomes_are_read_with_and_without_xdist(gpu_checks):
    lines = [
        "tests/unit/test_rounding.py::test_ulp_against_nextafter[cuda-fp32] PASSED                     [  3%]",
        "[gw1] [ 12%] FAILED tests/unit/test_model.py::test_compiled_blocks_round_as_eager[cuda-bf16] ",
        "[gw0] [100%] SKIPPED tests/unit/test_train.py::test_compiled_training_on_a_gpu ",
        "tests/unit/test_formats.py::test_add_dtype_compiled_inductor[cuda-nvfp4] ERROR                [ 50%]",
        "FAILED tests/unit/test_model.py::test_compiled_blocks_round_as_eager[cuda-bf16] - AssertionError: bf16: "
        "2.1e-03 of the elements differ",
        "ERROR tests/unit/test_formats.py::test_add_dtype_compiled_inductor[cuda-nvfp4]",
        "=== 1 failed, 1 passed in 3.2s ===",
    ]
    outcomes, reasons = gpu_checks.pytest_outcomes(lines)
    assert outcomes == {
        "tests/unit/test_rounding.py::test_ulp_against_nextafter[cuda-fp32]": "PASSED",
        "tests/unit/test_model.py::test_compiled_blocks_round_as_eager[cuda-bf16]": "FAILED",
        "tests/unit/test_train.py::test_compiled_training_on_a_gpu": "SKIPPED",
        "tests/unit/test_formats.py::test_add_dtype_compiled_inductor[cuda-nvfp4]": "ERROR",
    }
    assert reasons == {
        "tests/unit/test_model.py::test_compiled_blocks_round_as_eager[cuda-bf16]": (
            "AssertionError: bf16: 2.1e-03 of the elements differ"
        ),
        "tests/unit/test_formats.py::test_add_dtype_compiled_inductor[cuda-nvfp4]": "ERROR",
    }


def test_the_docstring_tells_a_gpu_user_the_command_and_what_it_prints(gpu_checks):
    """The first lines are the command and what it prints; no machine's own launch steps."""
    doc = gpu_checks.__doc__
    assert "python benchmarks/gpu_checks.py --out DIR" in doc.split("\n\n")[1]
    assert "Exit status 1 if a check failed" in doc
    assert not re.search(r"carry|timeout_s|\.whl|session|lent", doc)


@pytest.mark.slow
def test_gpu_test_files_are_every_module_with_cuda_cases(gpu_checks, request):
    """The tests phase runs `pytest -m gpu` over GPU_TEST_FILES only (the other modules import
    what the device lacks): they must be exactly the modules that have a test marked gpu. Read off
    this session's collection where it holds the whole suite (`pytest -q`), else off
    `pytest --collect-only -m gpu tests` in a subprocess."""
    if collected_everything(request.session):
        modules = {
            item.nodeid.split("::")[0] for item in request.session.items if item.get_closest_marker("gpu") is not None
        }
    else:
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "gpu", "-p", "no:cacheprovider", "tests"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 0, proc.stdout[-3000:]
        modules = {line.split("::")[0] for line in proc.stdout.splitlines() if "::" in line}
    assert modules == set(gpu_checks.GPU_TEST_FILES)


def test_bad_arguments_are_named(gpu_checks, tmp_path, capsys):
    with pytest.raises(SystemExit):
        gpu_checks.main(["--out", str(tmp_path), "--device", "cpu", "--parts", "env,nonsense"])
    assert "--parts" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        gpu_checks.main(["--out", str(tmp_path), "--device", "cpu", "--bench-groups", "fat-short:fast"])
    assert "'fat-short:fast' is not SHAPE:eager or SHAPE:compiled" in capsys.readouterr().err
    groups = gpu_checks.bench_groups("medium:compiled,fat-short:eager", gpu_checks.GPU)
    assert groups == (("medium", "compiled", gpu_checks.VARIANTS), ("fat-short", "eager", gpu_checks.VARIANTS))
    assert gpu_checks.bench_groups(None, gpu_checks.GPU)[0] == ("fat-short", "compiled", gpu_checks.VARIANTS)


def test_eval_phase_scores_batches_as_single_requests(tmp_path):
    """The eval phase alone (quick, CPU): the scoring core's fp32 batches equal one request at a
    time, and items/s of both blocks are measured (lm-eval is not imported: the device has none)."""
    code = (
        "import sys, runpy; sys.modules['lm_eval'] = None; sys.argv = sys.argv[1:]; "
        "runpy.run_path(sys.argv[0], run_name='__main__')"
    )
    cmd = [
        sys.executable,
        "-c",
        code,
        str(SCRIPT),
        "--device",
        "cpu",
        "--quick",
        "--parts",
        "eval",
        "--out",
        str(tmp_path / "out"),
    ]
    proc = subprocess.run(
        cmd,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    checks = {c["name"]: c for c in json.loads((tmp_path / "out" / "summary.json").read_text())["checks"]}
    assert set(checks) == {"batched_eq_single_fp32", "items_per_s_baseline", "items_per_s_streamback"}
    assert checks["batched_eq_single_fp32"]["status"] == "PASS", checks
    for block in ("baseline", "streamback"):
        assert checks[f"items_per_s_{block}"]["status"] == "INFO"
        assert float(checks[f"items_per_s_{block}"]["value"].split()[0].replace(",", "")) > 0


def test_analysis_phase_times_every_analysis_of_a_run(tmp_path):
    """The analysis phase alone (quick, CPU): layer-error's check (the fp32 stream ends closer to the
    ground truth than the bf16 stream) passes; swallowed, envelope and the loss-window rate are timed.
    Without the bench no time is kept back for it (a 25 s budget: with the bench's 40% kept, the
    shape's 20 s estimate would not fit), and the summary still names torch and the device."""
    cmd = [
        sys.executable,
        str(SCRIPT),
        "--device",
        "cpu",
        "--quick",
        "--parts",
        "analysis",
        "--budget",
        "25",
        "--out",
        str(tmp_path / "out"),
    ]
    proc = subprocess.run(
        cmd,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    checks = {c["name"]: c for c in json.loads((tmp_path / "out" / "summary.json").read_text())["checks"]}
    names = [f"check-medium_{kind}" for kind in ("layer_error", "swallowed", "envelope", "loss_windows")]
    assert list(checks) == names
    assert checks[names[0]]["status"] == "PASS" and "fp32" in checks[names[0]]["value"]
    assert all(checks[name]["status"] == "INFO" for name in names[1:])
    assert float(checks[names[0]]["value"].split()[0]) > 0
    header = (tmp_path / "out" / "summary.md").read_text().splitlines()[0]
    assert header == f"# gpu_checks: cpu (capability n/a), torch {torch.__version__}, quick sizes, parts analysis"
