"""Saving Altair charts as SVG and PNG files, rendered offline by vl-convert and written atomically."""

from __future__ import annotations

import os
from pathlib import Path

import altair as alt
import vl_convert as vlc

from streamback.io import atomic_path

# vl-convert names Vega-Lite versions like "v6_4"; use the one this Altair writes.
VL_VERSION = "_".join(alt.SCHEMA_VERSION.split(".")[:2])


def save_chart(chart: alt.TopLevelMixin, *paths: str | os.PathLike, scale: float = 2.0) -> None:
    """Write `chart` to each of `paths`; the suffix (.svg or .png) picks the format.

    `scale` multiplies the PNG's pixel size (2 gives a sharp image on high-density screens).
    """
    spec = chart.to_dict()
    for path in map(Path, paths):
        if path.suffix == ".svg":
            data = vlc.vegalite_to_svg(spec, vl_version=VL_VERSION).encode()
        elif path.suffix == ".png":
            data = vlc.vegalite_to_png(spec, vl_version=VL_VERSION, scale=scale)
        else:
            raise ValueError(f"cannot save a chart as {path}: the suffix must be .svg or .png")
        with atomic_path(path) as tmp:
            tmp.write_bytes(data)
