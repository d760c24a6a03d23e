"""The docs stay true: the layout list against the tree, every relative link, and the figures that
remain in prose and comments against the code or the measurement files (docs/measurements.md)."""

import ast
import re

import pytest

from streamback.config import load_config
from streamback.runs import run_matrix, train_steps

from conftest import ROOT

PACKAGE = ROOT / "streamback"
PAGES = sorted([ROOT / "README.md", ROOT / "results" / "README.md", *(ROOT / "docs").rglob("*.md")])
MEASUREMENTS = (ROOT / "docs" / "measurements.md").read_text()
H200_SUMMARY = (ROOT / "docs" / "measurements" / "h200-2026-12-01" / "gpu_checks_summary.md").read_text()


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def _flat(path) -> str:
    """A page's text with its line breaks and comment marks folded to single spaces."""
    return " ".join(path.read_text().replace("#", " ").split())


def layout_list(text: str) -> tuple[set[str], set[str]]:
    """The modules (paths under streamback/) and folders that docs/development.md's layout block names."""
    (block,) = re.findall(r"```\nstreamback/\n(.*?)```", text, re.DOTALL)
    modules, folders, folder = set(), set(), ""
    for line in block.splitlines():
        line = re.sub(r"\(.*?\)", "", line)  # the rule file a folder mirrors
        words = line.split()
        if line[:3].strip() and words[0].endswith("/"):  # a new folder starts at the second column
            folder, words = words[0], words[1:]
        elif not line.startswith("            "):  # the top level (continuation lines are indented past the folder)
            folder = ""
        if folder:
            folders.add(folder.rstrip("/"))
        for word in words:
            if word.endswith(".py"):
                modules.add(folder + word)
            elif word.endswith("/"):
                folders.add(folder + word.rstrip("/"))
    return modules, folders


def test_the_layout_list_parses_as_written():
    text = (
        "```\nstreamback/\n  a.py b.py\n  model/    c.py d.py   (x.smk)\n            e.py\n  eval/     f.py tasks/\n```"
    )
    assert layout_list(text) == (
        {"a.py", "b.py", "model/c.py", "model/d.py", "model/e.py", "eval/f.py"},
        {"model", "eval", "eval/tasks"},
    )


def test_the_layout_list_in_development_md_is_the_tree():
    """Every module of streamback/ is listed (besides the packages' __init__.py), and nothing listed is missing."""
    modules, folders = layout_list((ROOT / "docs" / "development.md").read_text())
    tree = {
        str(p.relative_to(PACKAGE))
        for p in PACKAGE.rglob("*.py")
        if p.name != "__init__.py" and "__pycache__" not in p.parts
    }
    assert sorted(tree - modules) == [], "modules missing from docs/development.md's layout"
    assert sorted(modules - tree) == [], "docs/development.md lists modules that do not exist"
    assert all((PACKAGE / folder).is_dir() for folder in folders), folders


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    links = re.findall(r"\]\(([^)\s]+)\)", page.read_text())
    relative = [link for link in links if not re.match(r"[a-z]+:", link) and not link.startswith("#")]
    missing = [link for link in relative if not (page.parent / link.split("#")[0]).exists()]
    assert missing == [], f"{page.relative_to(ROOT)}: links to nothing"
    if page.name == "README.md" and page.parent == ROOT:
        assert len(relative) >= 10  # the front page links to the docs


def test_the_plain_pytorch_reference_of_gpu_checks_is_the_measured_one():
    """benchmarks/gpu_checks.py's REFERENCE (the speeds its bench goals compare with) is the table in
    docs/measurements.md, and the summary's `ref tok/s` column printed it."""
    source = (ROOT / "benchmarks" / "gpu_checks.py").read_text()
    (node,) = [
        n
        for n in ast.parse(source).body
        if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "REFERENCE"
    ]
    reference = ast.literal_eval(node.value)
    rows = re.findall(
        r"\| ([\w-]+) (compiled|eager) (baseline|streamback): ([\d,]+) tok/s(?:, peak ([\d.]+) GiB)? \|", MEASUREMENTS
    )
    documented = {
        (shape, mode, block): (int(_number(tps)), float(peak) if peak else None)
        for shape, mode, block, tps, peak in rows
    }
    assert documented == reference
    for (shape, mode, block), (tps, _) in reference.items():
        assert re.search(
            rf"^\| {shape} \| {mode} \| {block} \| [\d,]+ \| [\d.]+ \| [\d.]+ \| [\d.]+ \| [\d.]* \| {tps:,} \|",
            H200_SUMMARY,
            re.MULTILINE,
        )


def test_the_h200_figures_in_measurements_md_are_the_shipped_summary_s():
    (rate,) = re.findall(r"^bf16 matmul ([\d.]+) TFLOP/s; device copy ([\d.]+) TB/s", H200_SUMMARY, re.MULTILINE)
    assert f"bf16 matmul {rate[0]} TFLOP/s; device copy {rate[1]} TB/s" in MEASUREMENTS
    speed = {
        mode: int(_number(tps))
        for mode, tps in re.findall(
            r"^\| medium \| (compiled|eager) \| baseline \| ([\d,]+) \|", H200_SUMMARY, re.MULTILINE
        )
    }
    assert (
        f"compiled {speed['compiled']:,} tok/s against eager {speed['eager']:,} "
        f"({speed['compiled'] / speed['eager']:.2f}x)" in MEASUREMENTS
    )


@pytest.mark.parametrize(
    ("config", "stated"),
    [
        ("config.yaml", "{steps} steps x {tokens_per_step} tokens"),
        ("one-gpu.yaml", "{steps:,} steps of {batch_size} x {seq_len} ({read:,} tokens)"),
        ("paper.yaml", "100B tokens ({steps:,} steps"),
        ("depth.yaml", "{steps} steps x {tokens_per_step} tokens"),
    ],
)
def test_the_step_counts_in_config_comments_are_the_code_s(config, stated):
    """A run's steps, where a config comment states them, are `train_steps` of that config."""
    train = load_config(ROOT / "config" / config)["train"]
    steps = train_steps(train)
    fields = dict(
        steps=steps,
        tokens_per_step=train["batch_size"] * train["seq_len"],
        batch_size=train["batch_size"],
        seq_len=train["seq_len"],
        read=steps * train["batch_size"] * train["seq_len"],
    )
    assert stated.format(**fields) in _flat(ROOT / "config" / config)


def test_the_warning_thresholds_in_the_train_docs_are_the_schema_defaults():
    """docs/stages/train.md names each warning's threshold with its default in brackets."""
    warnings = load_config(ROOT / "config" / "config.yaml")["train"]["log"]["warnings"]
    stated = dict(re.findall(r"`(\w+)` \(([\d.,]+%?)\)", _flat(ROOT / "docs" / "stages" / "train.md")))
    assert set(stated) == set(warnings), sorted(set(stated) ^ set(warnings))
    for key, text in stated.items():
        value = _number(text.rstrip("%")) / (100 if text.endswith("%") else 1)
        # exact up to the decimal a doc states the default in
        assert value == pytest.approx(warnings[key]), key


def test_the_default_study_s_model_count_is_the_run_matrix_s():
    runs = len(run_matrix(load_config(ROOT / "config" / "config.yaml")["train"]))
    assert f"{runs} tiny models" in _flat(ROOT / "docs" / "costs.md")


def test_the_drift_page_states_the_default_grid():
    drift = load_config(ROOT / "config" / "config.yaml")["drift"]
    text = _flat(ROOT / "docs" / "stages" / "drift.md")
    assert f"{drift['coords']} coordinates start at {drift['start']:g} and take {drift['steps']} steps" in text
    words = {6: "six", 7: "seven", 8: "eight", 9: "nine", 10: "ten"}
    assert (
        f"summed along {words[len(drift['paths'])]} paths: " + ", ".join(f"`{p}`" for p in drift["paths"][:2]) in text
    )
    assert all(f"`{p}`" in text for p in drift["paths"])


def test_stream_traffic_s_example_step_time_is_the_measured_reference_s():
    """benchmarks/stream_traffic.py's example `--step-ms` is a compiled fat-short step of plain
    PyTorch on the H200: 4 x 2048 tokens at the tokens/s docs/measurements.md records."""
    (tps,) = re.findall(r"\| fat-short compiled baseline: ([\d,]+) tok/s", MEASUREMENTS)
    (step_ms,) = re.findall(
        r"--shapes fat-short --step-ms ([\d.]+)", (ROOT / "benchmarks" / "stream_traffic.py").read_text()
    )
    assert float(step_ms) == round(4 * 2048 / _number(tps) * 1e3, 1)


# `streamback.<module>[.<name>]` in prose, not inside a longer dotted name or a host (synthetic.streamback.invalid)
DOTTED = re.compile(r"(?<![\w./-])streamback(?:\.[A-Za-z_]\w*)+")


def _docstrings(path) -> str:
    """Every docstring of a module: its own, its classes' and its functions'."""
    tree = ast.parse(path.read_text())
    nodes = [tree, *(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef))]
    return "\n".join(ast.get_docstring(n) or "" for n in nodes)


def _resolves(dotted: str) -> bool:
    """Whether `dotted` is an importable streamback module, or a name defined in one."""
    import importlib

    parts = dotted.split(".")
    thing = importlib.import_module(parts[0])
    for cut in range(1, len(parts)):
        if hasattr(thing, parts[cut]):
            thing = getattr(thing, parts[cut])
            continue
        if not hasattr(thing, "__path__"):  # not a package: no submodule to import
            return False
        try:
            thing = importlib.import_module(".".join(parts[: cut + 1]))
        except ModuleNotFoundError:
            return False
    return True


def test_every_streamback_name_in_a_docstring_or_a_page_imports():
    named = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for dotted in DOTTED.findall(_docstrings(path)):
            named.setdefault(dotted, path.relative_to(ROOT))
    for path in PAGES:
        for dotted in DOTTED.findall(path.read_text()):
            named.setdefault(dotted, path.relative_to(ROOT))
    assert len(named) > 40  # the scan found the package's own names
    missing = sorted(f"{where}: {dotted}" for dotted, where in named.items() if not _resolves(dotted))
    assert missing == []
