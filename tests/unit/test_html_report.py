"""streamback.charts and streamback.html_report: offline SVG/PNG export and a self-contained page."""

import re

import altair as alt
import pandas as pd
import pytest

from streamback.charts import save_chart
from streamback.html_report import render_report, write_report


def _chart(label="a"):
    data = pd.DataFrame({"x": [1, 2, 3], "y": [2.0, 1.0, 3.0], "label": [label] * 3})
    return alt.Chart(data).mark_line().encode(x="x:Q", y="y:Q", tooltip=["label"])


def test_save_chart_svg_and_png(tmp_path):
    save_chart(_chart(), tmp_path / "c.svg", tmp_path / "sub" / "c.png")
    svg = (tmp_path / "c.svg").read_text()
    assert svg.lstrip().startswith("<svg") and "</svg>" in svg
    assert (tmp_path / "sub" / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="suffix"):
        save_chart(_chart(), tmp_path / "c.pdf")
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["c.png", "c.svg"]  # no temporary left


def test_report_is_self_contained_and_escaped(tmp_path):
    hostile = "</script><script>alert(1)</script>"
    table = pd.DataFrame({"path": ["bf16", "<b>fp32</b>"], "ratio": [0.0031, 1.0]})
    write_report(
        tmp_path / "r.html",
        "Drift & co",
        [
            ("", ["Two < three."]),
            ("Tables", [table]),
            ("Charts", [_chart(), _chart(hostile)]),
        ],
    )
    page = (tmp_path / "r.html").read_text()
    assert "<title>Drift &amp; co</title>" in page and "<p>Two &lt; three.</p>" in page
    assert "&lt;b&gt;fp32&lt;/b&gt;" in page and "<h2>Tables</h2>" in page
    assert "https://cdn" not in page and not re.search(r"<script[^>]*\bsrc=", page)
    assert page.count('vegaEmbed("#chart') == 2
    # the hostile label stays inside its JSON string: three scripts (bundle, two charts), each closed once
    assert page.count("</script>") == 3 and "alert(1)" in page


def test_report_rejects_unknown_blocks():
    with pytest.raises(TypeError, match="DataFrame"):
        render_report("t", [("", [42])])


def test_captions_missing_stages_and_subheadings_are_set_apart():
    from streamback.html_report import Caption, Missing, Subheading

    page = render_report(
        "t", [("s", [Subheading("a <shape>"), "plain", Caption("what & how"), Missing("rule x has not run")])]
    )
    assert "<h3>a &lt;shape&gt;</h3>" in page and "<p>plain</p>" in page
    assert '<p class="caption">what &amp; how</p>' in page and '<p class="missing">rule x has not run</p>' in page


def test_text_columns_align_left_and_names_stay_whole():
    """Numbers align right (also when written as text), text left; a short text (a run name) is kept
    on one line, sentences get a wide column."""
    table = pd.DataFrame(
        {
            "run": ["tiny-skinny-tall-baseline", None],
            "loss": [4.3, 4.2],
            "reading": ["a sentence " * 8, "short"],
            "steps": [30, 60],
            "acc": ["0.5620 ± 0.022", "-0.1 ± 0.1"],
        }
    )
    page = render_report("t", [("s", ["intro", table])])
    style = re.search(r'<style>([^<]*)</style>\n<table[^>]*id="table1"', page).group(1)
    assert style == (
        "#table1 td:nth-child(1), #table1 th:nth-child(1) { text-align: left; white-space: nowrap; } "
        "#table1 td:nth-child(3), #table1 th:nth-child(3) { text-align: left; min-width: 20rem; }"
    )
    assert "<style>" not in render_report("t", [("s", [pd.DataFrame({"x": [1.0]})])]).split("</style>", 1)[1]


def test_a_chart_over_altair_s_5000_rows_is_drawn_whole_and_the_guard_stays(tmp_path):
    """The depth tier's envelope has 5,720 rows: the figure and the page draw every one (6,000 points
    here: the SVG holds 6,000 marks, the page's spec 6,000 values), and Altair's guard is back after."""
    frame = pd.DataFrame({"x": range(6000), "y": [i % 7 for i in range(6000)]})
    chart = alt.Chart(frame).mark_point().encode(x="x:Q", y="y:Q")
    save_chart(chart, tmp_path / "big.svg")
    assert (tmp_path / "big.svg").read_text().count("<path") >= 6000
    page = render_report("big", [("chart", [chart])])
    assert page.count('"x": 5999') == 1 and page.count('"y": ') >= 6000
    with pytest.raises(alt.MaxRowsError):
        chart.to_dict()
