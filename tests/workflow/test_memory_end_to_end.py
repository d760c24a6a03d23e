"""The end-to-end half of test_memory.py (commands run as processes, compiled or multi-process runs, Snakemake): the
same subjects, at the pace of whole runs."""

import json

from streamback.cli import main as cli_main


def test_memory_cli(tmp_path):
    out = tmp_path / "memory.json"
    argv = [
        "memory",
        "--shapes",
        "tiny-fat-short,tiny-medium",
        "--batch",
        "1",
        "--seq-len",
        "16",
        "--vocab-size",
        "64",
        "--out",
        str(out),
    ]
    assert cli_main(argv) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["shape"], r["variant"]) for r in rows][:3] == [
        ("tiny-fat-short", "baseline"),
        ("tiny-fat-short", "streamback"),
        ("tiny-fat-short", "streamback-reversible"),
    ]
    assert all(r["peak"] > r["params"] > 0 for r in rows)
    assert "| tiny-medium | streamback | " in out.with_suffix(".md").read_text()


def test_the_study_page_shows_the_memory_table(tmp_path, monkeypatch):
    """The page's speed-and-memory section is `streamback memory`'s own table of its JSON: the rows of memory.md."""
    import pandas as pd

    from streamback import layout
    from streamback.report.page import speed_and_memory

    monkeypatch.chdir(tmp_path)
    assert cli_main(["memory", "--shapes", "tiny-medium", "--batch", "1", "--seq-len", "16", "--vocab-size", "64"]) == 0
    subheading, frame, caption = speed_and_memory()
    assert "streamback memory" in subheading and caption == f"From {layout.MEMORY_FILE}."
    md = [
        line
        for line in layout.MEMORY_FILE.with_suffix(".md").read_text().splitlines()
        if line.startswith("| tiny-medium")
    ]
    assert isinstance(frame, pd.DataFrame) and list(frame.columns)[:4] == ["shape", "variant", "peak", "vs baseline"]
    assert ["| " + " | ".join(row) + " |" for row in frame.itertuples(index=False)] == md
    assert frame.loc[frame.variant == "baseline", "vs baseline"].item() == "+0.000"
