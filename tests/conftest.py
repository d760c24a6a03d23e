"""Shared test fixtures: the repository root, a way to run Snakemake on it, small token shards, the
whole default study (smaller; through Slurm where it is installed), and the devices a test runs on.

A test that takes the `device` fixture runs once per device: on the CPU everywhere, and on CUDA
as a test marked `gpu`, which is skipped (with its reason) where no CUDA device exists. A test
that needs CUDA alone is marked `@pytest.mark.gpu` itself. `pytest -m gpu` selects exactly the
runs a GPU machine adds (`benchmarks/gpu_checks.py` runs them there).
"""

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

# the helpers' asserts explain a failure as a test module's do (register before any test module imports them)
pytest.register_assert_rewrite("helpers")

ROOT = Path(__file__).resolve().parent.parent
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
# the default study, smaller: every stage and every run of config/config.yaml, on less data, fewer steps and two
# seeds, and the three streams below bf16 the default leaves out (trained on its stream_shapes and stream_seeds:
# tiny-medium, seed 0); the drift simulation on fewer coordinates and seeds, at the note's 4,000 steps (its compile
# and figures are most of its time: docs/measurements.md)
SMALL = {
    "data": {"synthetic": {"documents": 4000, "files": 1}},
    "train": {
        "tokens": 30 * 4 * 128,
        "runs": {"seeds": [0, 1], "streams": ["bf16_sr", "mxfp8", "nvfp4"]},
        "schedule": {"warmup_steps": 5, "decay_steps": 10},
        "log": {"every": 10, "stream_every": 10, "val_every": 10, "val_sequences": 16},
        "checkpoint": {"every": 10},
    },
    "eval": {"local": {"pairs": 30, "documents": 30}},
    "drift": {"coords": 256, "seeds": [0, 1]},  # the note's 4,000 steps: test_drift_workflow checks its findings
}
STUDY_TIMEOUT = 1500  # seconds: the study, smaller, on a loaded 2-core machine takes about 10 minutes
# what `--profile slurm` needs on the local test cluster (a real one sets them in the profile): no accounting, quick
# status checks
SLURM_SITE = [
    "--slurm-no-account",
    "--slurm-status-command",
    "squeue",
    "--slurm-init-seconds-before-status-checks",
    "1",
]


@pytest.fixture(params=DEVICES)
def device(request):
    """torch.device of each device a test runs on (see the module docstring)."""
    import torch

    return torch.device(request.param)


def snakemake_args(*args) -> list[str]:
    """`-s <repo>/Snakefile ARGS...`: the arguments of Snakemake's command for the repository's workflow."""
    return ["-s", str(ROOT / "Snakefile"), *map(str, args)]


def snakemake_command(*args) -> list[str]:
    """`snakemake -s <repo>/Snakefile ARGS...` in this Python, as a command's argument list."""
    return [sys.executable, "-m", "snakemake", *snakemake_args(*args)]


@pytest.fixture(scope="session")
def run_snakemake(tmp_path_factory):
    """Run `snakemake -s <repo>/Snakefile` with the given arguments; returns the CompletedProcess, as
    `subprocess.run(snakemake_command(*args), cwd=..., capture_output=True, text=True, timeout=...)` would.
    Each run is forked from one process that has imported Snakemake (helpers/snakemake_server.py)."""
    from helpers.snakemake_server import SnakemakeServer

    server = SnakemakeServer(tmp_path_factory.mktemp("snakemake-server"))

    def run(*args, cwd=None, timeout=900):
        return server.run(snakemake_args(*args), cwd=cwd or ROOT, timeout=timeout)

    yield run
    server.close()


@pytest.fixture(scope="session")
def tokens(tmp_path_factory):
    """A 600-document synthetic corpus through the data stage (BPE of 300 tokens): its shard dir."""
    from streamback.config import validate_config
    from streamback.data.corpus import write_part
    from streamback.data.tokenize import tokenize

    root = tmp_path_factory.mktemp("token-shards")
    write_part(11, 0, 600, root / "part.parquet")
    data = validate_config(
        {"data": {"tokenizer": {"vocab_size": 300}, "val_fraction": 0.1, "shard_tokens": 20000, "processes": 1}}
    )["data"]
    tokenize(data, root / "tokens", inputs=[root / "part.parquet"], progress=False)
    return root / "tokens"


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models run fastest on one thread (on a loaded 2-core machine, many times faster than on two)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def start_slurm():
    """Start the local cluster (tests/slurm/start-cluster.sh; nothing to do if it runs)."""
    subprocess.run(["bash", str(ROOT / "tests" / "slurm" / "start-cluster.sh")], check=True, timeout=120)


@dataclass
class Study:
    root: Path  # the working directory: results/, logs/, small.yaml
    output: str  # what Snakemake printed
    slurm: bool  # whether every job went through sbatch


# modules run in one worker, one after the other, as one xdist group: test_hostile_names runs stages inside the
# process (streamback.cli.main), and test_train_end_to_end compares command-line runs with references trained in the
# process, so a kernel path a stage left behind would fail them (issue 37); .ci/run's rerun on the other kernel path
# keeps the pair together on its two workers too
KERNEL_LEAK = ("tests/workflow/test_hostile_names.py", "tests/workflow/test_train_end_to_end.py")


def _reads_study(item) -> bool:
    return "study" in item.fixturenames


def _group(item) -> str | None:
    """The item's xdist group: the study's readers, or the kernel-leak pair of modules; else none."""
    if _reads_study(item):
        return "study"
    if item.nodeid.split("::", 1)[0] in KERNEL_LEAK:
        return "kernel-leak"
    return None


def _scope(item) -> str:
    """The item's xdist work unit (`pytest_xdist_make_scheduler`): its group, or its module."""
    return _group(item) or item.nodeid.split("::", 1)[0]


def _cost(item, cuda: bool) -> int:
    """A rough cost, to order the work units: a test marked `slow` as ten quick ones; a skipped one, none."""
    if item.get_closest_marker("gpu") and not cuda:
        return 0
    return 10 if item.get_closest_marker("slow") else 1


def _mark_and_order(items, worker: bool) -> None:
    """Skip every test marked `gpu` where torch sees no CUDA device; put every test that reads the
    study in one xdist group (one worker runs them one after another: some run Snakemake in it),
    and the kernel-leak pair of modules in another (`KERNEL_LEAK`).
    Under pytest-xdist, order the work units costliest first (their tests keep their order), so
    that the last units to start are short ones and neither worker idles long at the end: a
    module of two slow tests then no longer waits behind fifty quick ones."""
    for item in items:
        if _group(item):
            item.add_marker(pytest.mark.xdist_group(_group(item)))
    gpu = [item for item in items if item.get_closest_marker("gpu")]
    cuda = False
    if gpu:
        import torch

        cuda = torch.cuda.is_available()
    if worker:  # a worker's collection is the order the controller hands units out
        cost, first = {}, {}
        for i, item in enumerate(items):
            first.setdefault(_scope(item), i)
            cost[_scope(item)] = cost.get(_scope(item), 0) + _cost(item, cuda)
        items.sort(key=lambda item: (-cost[_scope(item)], first[_scope(item)]))
    if not gpu or cuda:
        return
    skip = pytest.mark.skip(reason="no CUDA device")
    for item in gpu:
        item.add_marker(skip)


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config, items):
    """`_mark_and_order` before every other plugin's hook (pytest-xdist's adds each grouped test's
    group to its node ID: `test@study`, which the scheduler below reads); then, under pytest-xdist,
    check that every grouped test got it: pytest 9.2's node IDs no longer take it
    (pytest-xdist#1386), and the groups would be lost without a word."""
    worker = hasattr(config, "workerinput")  # an xdist worker (not a pytest it started: the variable is inherited)
    _mark_and_order(items, worker)
    result = yield
    if worker and config.getoption("loadgroup", default=False):
        lost = [item.nodeid for item in items if _group(item) and not item.nodeid.endswith(f"@{_group(item)}")]
        if lost:  # each grouped test then fails with this line (`pytest_runtest_setup`)
            config.stash[GROUPS_LOST] = (
                f"pytest-xdist did not group {len(lost)} tests: pytest {pytest.__version__} drops xdist_group's "
                "suffix (pytest-xdist#1386); install pytest<9.2, as pyproject.toml says"
            )
    return result


GROUPS_LOST = pytest.StashKey[str]()
DESELECTED = pytest.StashKey[int]()


def pytest_deselected(items):
    """Count the tests `-k`, `-m` or `--deselect` left out (`collected_everything`)."""
    if items:
        config = items[0].config
        config.stash[DESELECTED] = config.stash.get(DESELECTED, 0) + len(items)


def collected_everything(session) -> bool:
    """Whether this session (a worker's, under pytest-xdist: each collects the whole selection) holds every test of
    every module under tests/: none deselected, and each test file has its tests here. A test that asks what the suite
    holds reads `session.items` then, and else collects it again in a subprocess."""
    if session.config.stash.get(DESELECTED, 0):
        return False
    modules = {item.path.resolve() for item in session.items}
    return all(path.resolve() in modules for path in (ROOT / "tests").rglob("test_*.py"))


def pytest_runtest_setup(item):
    """A grouped test fails, saying why, where pytest-xdist lost the groups (above)."""
    if _group(item) and GROUPS_LOST in item.config.stash:
        pytest.fail(item.config.stash[GROUPS_LOST], pytrace=False)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """pytest-xdist's work units: a test module, or an `xdist_group` across modules (the study's
    readers). A module's tests stay on one worker, so its module-scoped fixtures (trained runs) are
    computed once, as without xdist."""
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False  # the units go in the workers' order: costliest first (above)

    class ModuleOrGroup(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if nodeid.rfind("@") > nodeid.rfind("]"):  # loadgroup's suffix (not an @ in a parameter)
                return nodeid.rsplit("@", 1)[-1]
            return nodeid.split("::", 1)[0]

    return ModuleOrGroup(config, log)


@pytest.fixture(scope="session", autouse=True)
def _study_build(request, tmp_path_factory):
    """Start the study's Snakemake when the session starts, if a selected test reads `study`: its
    jobs (and, through Slurm, the executor's waits between status checks) then overlap the tests
    that run before the first one that reads it. Under pytest-xdist the first worker to start a
    test builds it in the workers' shared temporary directory (not always gw0: when only the study's
    readers are selected, the one worker given their group may be any) and the others wait for its
    return code there."""
    import threading

    import yaml

    if not any(_reads_study(item) for item in request.session.items):
        yield None
        return
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    base = tmp_path_factory.getbasetemp()
    root = (base.parent if worker else base) / "study"
    slurm = shutil.which("sbatch") is not None
    try:  # the first worker to start a test builds it; a worker may get no test (one xdist group is all selected)
        root.mkdir()
    except FileExistsError:
        yield root, slurm
        return
    (root / "small.yaml").write_text(yaml.safe_dump(SMALL))
    if slurm:
        start_slurm()
    how = ["--profile", "slurm", *SLURM_SITE] if slurm else ["--cores", "2"]
    # and the plan (a local rule of seconds): test_study.py reads its table
    # (the targets first: --configfile and --default-resources take every word after them)
    cmd = snakemake_command("all", "plan", *how, "--directory", root, "--configfile", root / "small.yaml")
    with open(root / "snakemake.out", "w") as out:
        workflow = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, text=True)

    def record_status():  # for every worker: Snakemake's return code, written once it exits
        status = workflow.wait()
        (root / "returncode.part").write_text(str(status))
        (root / "returncode.part").rename(root / "returncode")

    waiter = threading.Thread(target=record_status, daemon=True)
    waiter.start()
    try:
        yield root, slurm
        if worker is not None:  # another worker may still be waiting for the study
            waiter.join(timeout=STUDY_TIMEOUT)
    finally:
        if workflow.poll() is None:  # the session stopped before the study ended: Snakemake cancels its jobs on SIGTERM
            workflow.terminate()
            workflow.wait(timeout=60)


@pytest.fixture(scope="session")
def study(_study_build):
    """The whole default study with SMALL merged over it, built once for every test that reads it
    (started with the session, `_study_build`): through `--profile slurm` where Slurm is installed
    (as .ci/run does), else `--cores 2`."""
    root, slurm = _study_build
    status = root / "returncode"
    deadline = time.monotonic() + STUDY_TIMEOUT
    while not status.exists():
        assert time.monotonic() < deadline, f"the study did not end within {STUDY_TIMEOUT} s: {root}/snakemake.out"
        time.sleep(1)
    output = (root / "snakemake.out").read_text()
    assert status.read_text() == "0", output[-6000:]
    return Study(root, output, slurm)
