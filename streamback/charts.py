"""Saving Altair charts as SVG and PNG files, rendered offline by vl-convert and written atomically."""

from __future__ import annotations

import os
from pathlib import Path

import altair as alt
import vl_convert as vlc

from streamback import layout
from streamback.io import atomic_path

# vl-convert names Vega-Lite versions like "v6_4"; use the one this Altair writes.
VL_VERSION = "_".join(alt.SCHEMA_VERSION.split(".")[:2])


def save_chart(chart: alt.TopLevelMixin, *paths: str | os.PathLike, scale: float = 2.0) -> None:
    """Write `chart` to each of `paths`; the suffix (.svg or .png) picks the format.

    `scale` multiplies the PNG's pixel size (2 gives a sharp image on high-density screens).
    """
    paths = [Path(p) for p in paths]
    for path in paths:
        if path.suffix not in (".svg", ".png"):
            raise ValueError(f"cannot save a chart as {path}: the suffix must be .svg or .png")
    # a file, not a notebook: every row is drawn (Altair's 5,000-row guard, lifted for this call only;
    # the depth tier's envelope has 5,720)
    with alt.data_transformers.disable_max_rows():
        spec = chart.to_dict()
    svg = vlc.vegalite_to_svg(spec, vl_version=VL_VERSION)  # run Vega once; the PNG rasterises this SVG
    for path in paths:
        data = svg.encode() if path.suffix == ".svg" else vlc.svg_to_png(svg, scale=scale)
        with atomic_path(path) as tmp:
            tmp.write_bytes(data)


def save_figure(chart: alt.TopLevelMixin, name: str) -> None:
    """`chart` as the study figure `name`: results/figures/<name>.svg and .png (`layout.figure`)."""
    save_chart(chart, *(layout.figure(name, suffix) for suffix in layout.FIGURE_SUFFIXES))
