"""One self-contained HTML page of text, tables and Altair charts, viewable without a network.

The Vega-Embed JavaScript bundle (from vl-convert, which ships it) is inlined once in the page
and every chart's spec is inlined beside it, so the page loads nothing from anywhere.
"""

from __future__ import annotations

import html
import json
import os
from collections.abc import Sequence

import altair as alt
import pandas as pd
import vl_convert as vlc

from streamback.charts import VL_VERSION
from streamback.io import write_text


class Caption(str):
    """Text under a figure or table: what it shows and how to read it."""


class Missing(str):
    """A stage whose outputs are not there, named in a box (never dropped silently)."""


class Subheading(str):
    """A heading within a section."""


Block = str | pd.DataFrame | alt.TopLevelMixin  # str includes Caption, Missing and Subheading

_STYLE = """
body { font-family: system-ui, sans-serif; max-width: 90rem; margin: 2rem auto; padding: 0 1rem; color: #222; }
p { max-width: 60rem; }
h1 { font-size: 1.6rem; } h2 { font-size: 1.25rem; margin-top: 2rem; }
table { border-collapse: collapse; font-size: 0.85rem; margin: 1rem 0; display: block; max-width: 100%; overflow-x:
auto; }
th, td { border-bottom: 1px solid #ddd; padding: 0.25rem 0.6rem; text-align: right; }
th { background: #f4f4f4; }
.chart { margin: 1rem 0; max-width: 100%; overflow-x: auto; }
h3 { font-size: 1.05rem; margin-top: 1.5rem; }
.caption { font-size: 0.85rem; color: #555; margin-top: -0.5rem; max-width: 60rem; }
.missing { background: #fff4e5; border-left: 4px solid #e69500; padding: 0.5rem 0.8rem; }
"""


def _block(block: Block, index: int) -> str:
    if isinstance(block, Caption):
        return f'<p class="caption">{html.escape(block)}</p>'
    if isinstance(block, Missing):
        return f'<p class="missing">{html.escape(block)}</p>'
    if isinstance(block, Subheading):
        return f"<h3>{html.escape(block)}</h3>"
    if isinstance(block, str):
        return f"<p>{html.escape(block)}</p>"
    if isinstance(block, pd.DataFrame):
        return _table_style(block, f"table{index}") + block.to_html(
            index=False, border=0, na_rep="", escape=True, table_id=f"table{index}"
        )
    if isinstance(block, alt.TopLevelMixin):
        # a "<" in the data could close the <script> early; JSON's "\u003c" means the same to the parser
        with alt.data_transformers.disable_max_rows():  # an offline page: every row (the guard is lifted here only)
            spec = json.dumps(block.to_dict()).replace("<", "\\u003c")
        return (
            f'<div class="chart" id="chart{index}"></div>\n<script type="text/javascript">'
            f'vegaEmbed("#chart{index}", {spec}, {{"mode": "vega-lite", "actions": false}}).catch(console.error);'
            "</script>"
        )
    raise TypeError(f"a report block must be text, a pandas DataFrame or an Altair chart, not {type(block).__name__}")


def _table_style(frame: pd.DataFrame, table_id: str) -> str:
    """Numbers align right (the page's default), numbers written as text too ("0.56 ± 0.02"); other
    text aligns left, on one line if short (a name such as tiny-skinny-tall-baseline stays whole),
    in a wide enough column if it holds sentences."""
    rules = []
    for i, (_, column) in enumerate(frame.items(), start=1):
        text = column.dropna().astype(str)
        if (
            pd.api.types.is_numeric_dtype(column)
            or pd.api.types.is_bool_dtype(column)
            or text.str.match(r"[-+]?\.?\d").all()
        ):
            continue
        layout = " white-space: nowrap;" if text.str.len().max() <= 40 else " min-width: 20rem;"
        rules.append(f"#{table_id} td:nth-child({i}), #{table_id} th:nth-child({i}) {{ text-align: left;{layout} }}")
    return f"<style>{' '.join(rules)}</style>\n" if rules else ""


def render_report(title: str, sections: Sequence[tuple[str, Sequence[Block]]]) -> str:
    """The page as a string: `title`, then each (heading, blocks) section in order ("" = no heading)."""
    body, index = [], 0
    for heading, blocks in sections:
        if heading:
            body.append(f"<h2>{html.escape(heading)}</h2>")
        for block in blocks:
            body.append(_block(block, index))
            index += 1
    bundle = vlc.javascript_bundle(vl_version=VL_VERSION).replace("</script", "<\\/script")
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en">',
            "<head>",
            '<meta charset="utf-8">',
            f"<title>{html.escape(title)}</title>",
            f"<style>{_STYLE}</style>",
            f'<script type="text/javascript">\n{bundle}\n</script>',
            "</head>",
            "<body>",
            f"<h1>{html.escape(title)}</h1>",
            *body,
            "</body>",
            "</html>",
            "",
        ]
    )


def write_report(path: str | os.PathLike, title: str, sections: Sequence[tuple[str, Sequence[Block]]]) -> None:
    """Write `render_report(title, sections)` to `path`, atomically."""
    write_text(path, render_report(title, sections))
