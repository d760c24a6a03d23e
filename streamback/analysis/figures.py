"""The analyses' figures (Altair), drawn from their tables only, so the study page draws the same
figures from the same CSV files. `charts(kind, tables)` gives every figure of a kind by its name
(`streamback.layout.analysis_figures`); the stage saves them as SVG and PNG.

Colours are stream formats (one per number format), dashes the rounding (solid nearest, dashed
stochastic), in the order of `streamback.model.formats.STREAM_LABELS`. Log-scale panels leave out
zeros (an error or a fraction that is exactly zero); the tables hold them.
"""

from __future__ import annotations

from collections.abc import Collection

import altair as alt
import pandas as pd

from streamback import layout
from streamback.model.formats import STREAM_FORMATS, STREAM_LABELS

KIND_TITLES = {
    "activations": "activations (residual h_l)",
    "stream_gradients": "stream gradients (dloss/dh_l)",
    "gradients": "parameter gradients (block l)",
}
WIDTH, HEIGHT = 300, 170


def _formats(data: pd.DataFrame, column: str = "variant") -> pd.DataFrame:
    """Add `format` and `rounding` columns from a stream label column (e.g. mxfp8_sr -> mxfp8, stochastic)."""
    stochastic = data[column].str.endswith("_sr")
    return data.assign(
        format=data[column].str.removesuffix("_sr"), rounding=stochastic.map({True: "stochastic", False: "nearest"})
    )


STUDY_PAIR = ("bf16", "fp32")  # the baseline's and StreamBack's streams: drawn thicker, on top


def _stream_encodings(data: pd.DataFrame) -> dict:
    formats = [f for f in STREAM_FORMATS if f in set(data["format"])]
    return {
        "color": alt.Color("format:N", sort=formats, title="stream format", scale=alt.Scale(scheme="category10")),
        "strokeDash": alt.StrokeDash(
            "rounding:N", sort=["nearest", "stochastic"], legend=None
        ),  # named in the subtitles
        "strokeWidth": alt.condition(
            " || ".join(f"datum.variant == '{v}'" for v in STUDY_PAIR), alt.value(3), alt.value(1.3)
        ),
    }


def _integer_axis(last: int) -> alt.Axis:
    """An axis of layer numbers: every one up to 16 (a panel shows those in its domain), else Vega's choice, as
    integers."""
    return alt.Axis(values=list(range(int(last) + 1)), format="d") if last <= 16 else alt.Axis(format="d")


def _study_pair_last(data: pd.DataFrame) -> pd.DataFrame:
    """Rows in STREAM_LABELS order with the study's pair last, so their lines are drawn over the others."""
    rank = {v: i for i, v in enumerate([v for v in STREAM_LABELS if v not in STUDY_PAIR] + list(STUDY_PAIR))}
    return data.iloc[data.variant.map(lambda v: rank.get(v, -1)).argsort(kind="stable")]


def _error_row(data: pd.DataFrame, kind: str) -> alt.HConcatChart:
    """max |error| (log) and sign flips (symlog) per layer of one kind, a line per variant."""
    rows = data[data.kind == kind]
    base = alt.Chart(rows).encode(
        x=alt.X(
            "layer:Q", title="layer boundary" if kind != "gradients" else "block", axis=_integer_axis(rows.layer.max())
        ),
        detail="variant:N",
        tooltip=[
            "variant",
            "layer",
            alt.Tooltip("max_abs_error:Q", format=".3g"),
            alt.Tooltip("rel_error:Q", format=".3g"),
            "sign_flips",
            alt.Tooltip("sign_flip_fraction:Q", format=".3%"),
        ],
        **_stream_encodings(data),
    )
    error = (
        base.transform_filter("datum.max_abs_error > 0")
        .mark_line(point=True)
        .encode(y=alt.Y("max_abs_error:Q", scale=alt.Scale(type="log"), title="max |error|"))
    )
    most = int(rows.sign_flips.max())
    ticks = [0] + [10**k for k in range(len(str(most)) + 1)]  # symlog: 0, then powers of ten past the largest count
    flips = base.mark_line(point=True).encode(
        y=alt.Y(
            "sign_flips:Q", scale=alt.Scale(type="symlog"), axis=alt.Axis(values=ticks, format=","), title="sign flips"
        )
    )
    return alt.hconcat(
        error.properties(width=WIDTH, height=HEIGHT, title=f"{KIND_TITLES[kind]}: max |error|"),
        flips.properties(width=WIDTH, height=HEIGHT, title=f"{KIND_TITLES[kind]}: sign flips"),
    )


def layer_error_chart(table: pd.DataFrame, run: str) -> alt.VConcatChart:
    """One row per kind (activations, stream gradients, parameter gradients); max |error| (log) and sign flips per
    layer, a line per variant."""
    data = _study_pair_last(_formats(table[table.run == run]))
    rows = [_error_row(data, kind) for kind in KIND_TITLES if kind in set(data.kind)]
    return alt.vconcat(*rows).properties(
        title=alt.TitleParams(
            f"{run}: error against the full-precision ground truth, same weights, per stream format",
            subtitle=(
                "bf16 = the baseline's computation, fp32 = StreamBack's (thick); sublayers compute in bf16; dashed: "
                "stochastic rounding"
            ),
        )
    )


PUBLIC_KINDS = {
    "activations": "public_activations",
    "gradients": "public_gradients",
}  # kind -> figure name (less -<model>)


def public_chart(table: pd.DataFrame, ratios: pd.DataFrame, model: str, kind: str) -> alt.HConcatChart:
    """The paper's figure for one public model and kind (activations or parameter gradients): max |error| and sign flips
    per layer."""
    data = _study_pair_last(_formats(table[table.model == model]))
    overall = ratios[
        (ratios.model == model) & (ratios.kind == kind) & (ratios.variant == "fp32") & (ratios.layer == "all")
    ]
    ratio = overall.iloc[0] if len(overall) else None
    said = (
        f"sign flips fp32 / bf16 over all layers: {ratio.flip_ratio:.2f} "
        f"({ratio.flip_ratio_low:.2f}-{ratio.flip_ratio_high:.2f} over "
        f"{ratio.sequences} sequences, {ratio.tokens:,} tokens)"
        if ratio is not None
        else ""
    )
    return _error_row(data, kind).properties(
        title=alt.TitleParams(
            f"{model}: {KIND_TITLES[kind]} against the full-precision ground truth, bf16 compute, per stream format",
            subtitle=[
                s
                for s in (
                    "bf16 = the paper's baseline stream, fp32 = its full-precision stream (thick); dashed: stochastic "
                    "rounding",
                    said,
                )
                if s
            ],
        )
    )


def envelope_chart(table: pd.DataFrame) -> alt.FacetChart:
    """One panel per shape: max and min of h per layer boundary (solid), +-99.9th percentile of |h| (dotted), a colour
    per trained stream."""
    sides = table.melt(
        id_vars=["run", "shape", "stream", "layer"], value_vars=["max", "min"], var_name="side", value_name="value"
    )
    bulk = table.assign(plus=table.abs_p999, minus=-table.abs_p999).melt(
        id_vars=["run", "shape", "stream", "layer"], value_vars=["plus", "minus"], var_name="side", value_name="value"
    )
    data = pd.concat([sides.assign(line="max / min"), bulk.assign(line="|h| 99.9th percentile")], ignore_index=True)
    streams = list(dict.fromkeys(table.stream))
    chart = (
        alt.Chart()
        .mark_line(point=alt.OverlayMarkDef(size=12))
        .encode(
            x=alt.X("layer:Q", title="layer boundary (0 = embedding)", axis=_integer_axis(table.layer.max())),
            y=alt.Y("value:Q", title="h"),
            color=alt.Color("stream:N", sort=streams, title="trained stream", scale=alt.Scale(scheme="category10")),
            strokeDash=alt.StrokeDash(
                "line:N",
                sort=["max / min", "|h| 99.9th percentile"],
                title=None,
                scale=alt.Scale(range=[[1, 0], [2, 3]]),
                legend=None,
            ),  # named in the subtitle
            detail=["run:N", "side:N"],
            tooltip=["run", "layer", "side", alt.Tooltip("value:Q", format=".4g")],
        )
    )
    zero = alt.Chart().mark_rule(color="gray", strokeWidth=0.5).encode(y=alt.datum(0))
    return (
        alt.layer(chart, zero, data=data)
        .properties(width=WIDTH, height=240)
        .facet(column=alt.Column("shape:N", sort=list(dict.fromkeys(table["shape"])), title=None))
        .resolve_scale(x="independent", y="independent")
        .properties(
            title=alt.TitleParams(
                "Residual envelope on the validation batch, each model as trained",
                subtitle=(
                    "bf16 = the baseline, fp32 = StreamBack; solid: max and min of h, dotted: +-99.9th percentile of "
                    "|h|"
                ),
            )
        )
    )


def training_envelope_chart(table: pd.DataFrame, run: str) -> alt.Chart:
    """Max and min of h at every layer boundary against training tokens, a colour per layer."""
    data = table[table.run == run].melt(
        id_vars=["tokens", "layer"], value_vars=["max", "min"], var_name="side", value_name="value"
    )
    return (
        alt.Chart(data)
        .mark_line(strokeWidth=1)
        .encode(
            x=alt.X("tokens:Q", title="training tokens"),
            y=alt.Y("value:Q", title="h"),
            color=alt.Color("layer:Q", title="layer boundary", scale=alt.Scale(scheme="viridis")),
            detail=["layer:N", "side:N"],
            tooltip=["layer", "side", "tokens", alt.Tooltip("value:Q", format=".4g")],
        )
        .properties(
            width=520,
            height=280,
            title=alt.TitleParams(
                f"{run}: residual envelope over training",
                subtitle="max (upper lines) and min (lower lines) of h per layer boundary, as the trainer logged them",
            ),
        )
    )


def swallowed_chart(table: pd.DataFrame, shape: str) -> alt.VConcatChart:
    """Per trained model of the shape (a row): swallowed fraction and lost mass per sublayer add, a line per stream
    format (log scales)."""
    data = _study_pair_last(_formats(table[table["shape"] == shape]))
    data = data.assign(position=data.layer + (data.sublayer == "feed_forward") * 0.5)
    rows = []
    for run in dict.fromkeys(data.run):
        base = alt.Chart(data[data.run == run]).encode(
            x=alt.X("position:Q", title="add (attention at l, feed-forward at l + 0.5)"),
            detail="variant:N",
            tooltip=[
                "variant",
                "layer",
                "sublayer",
                alt.Tooltip("swallowed_fraction:Q", format=".3%"),
                alt.Tooltip("lost_mass_fraction:Q", format=".3g"),
            ],
            **_stream_encodings(data),
        )
        panels = [
            base.transform_filter(f"datum.{column} > 0")
            .mark_line(point=alt.OverlayMarkDef(size=10))
            .encode(y=alt.Y(f"{column}:Q", scale=alt.Scale(type="log"), title=title))
            .properties(width=WIDTH, height=HEIGHT, title=f"{run}: {title}")
            for column, title in (
                ("swallowed_fraction", "updates swallowed (share of d != 0)"),
                ("lost_mass_fraction", "update mass lost to rounding"),
            )
        ]
        rows.append(alt.hconcat(*panels))
    return alt.vconcat(*rows).properties(
        title=alt.TitleParams(
            f"{shape}: updates the stream's rounding swallows, same weights, per stream format",
            subtitle=[
                "swallowed: round(h + d) == h although d != 0; lost: sum |round(h + d) - (h + d)| / sum |d|",
                "bf16 = the baseline's stream, fp32 = StreamBack's (thick); dashed: stochastic rounding",
            ],
        )
    )


def loss_difference_chart(curves: pd.DataFrame, final: pd.DataFrame, shape: str, band: float) -> alt.VConcatChart:
    """Training (top row) and validation (bottom row) loss, baseline minus each comparison (a column,
    its own y scale), against tokens: each seed's raw difference (faint) and, over the seeds, the
    mean of the smoothed differences (solid) with the seeds' range (shaded; one seed: its smoothed
    line), the +-band (grey); at the end the final difference: each seed's (small points) and over
    the seeds the mean with its t interval (one seed: that seed's paired interval over windows)."""

    data = curves[curves["shape"] == shape]
    over_seeds = data.seed.astype(str) == layout.ALL_SEEDS
    per_seed, across = data[~over_seeds], data[over_seeds]
    ends = final[final["shape"] == shape]
    end_over = ends.seed.astype(str) == layout.ALL_SEEDS
    seeds = per_seed.seed.nunique()
    comparisons = list(dict.fromkeys(data.comparison))
    color = alt.Color("comparison:N", sort=comparisons, title="baseline minus", scale=alt.Scale(scheme="dark2"))
    x = alt.X("tokens:Q", title="training tokens", scale=alt.Scale(domainMin=0))
    rows = []
    for split, title in (("train", "training loss"), ("val", "validation loss")):
        panels = []
        for comparison in comparisons:

            def part(frame, where=None):
                keep = (frame.split == split) & (frame.comparison == comparison)
                return frame[keep if where is None else keep & where]

            raw_lines, mean_line = part(per_seed), part(across)
            if raw_lines.empty:
                continue
            last = raw_lines.tokens.max()
            end, end_seeds = part(ends, end_over).assign(tokens=last), part(ends, ~end_over).assign(tokens=last)
            axis_title = f"{title} difference (nats)"
            y = alt.Y("difference:Q", title=axis_title)
            shaded = (
                alt.Chart(pd.DataFrame({"low": [-band], "high": [band]}))
                .mark_rect(color="gray", opacity=0.15)
                .encode(y="low:Q", y2="high:Q")
            )
            zero = alt.Chart(pd.DataFrame({"y": [0.0]})).mark_rule(color="gray", strokeWidth=0.5).encode(y="y:Q")
            raw = (
                alt.Chart(raw_lines)
                .mark_line(opacity=0.3, strokeWidth=1)
                .encode(x=x, y=y, color=color, detail="seed:N")
            )
            spread = (
                alt.Chart(mean_line).mark_area(opacity=0.2).encode(x=x, y="band_low:Q", y2="band_high:Q", color=color)
            )
            smooth = (
                alt.Chart(mean_line)
                .mark_line(strokeWidth=2)
                .encode(
                    x=x,
                    y="smoothed:Q",
                    color=color,
                    tooltip=[
                        "comparison",
                        "step",
                        "tokens",
                        alt.Tooltip("smoothed:Q", format=".5f"),
                        alt.Tooltip("band_low:Q", format=".5f"),
                        alt.Tooltip("band_high:Q", format=".5f"),
                    ],
                )
            )
            bars = (
                alt.Chart(end)
                .mark_errorbar(ticks=True)
                .encode(x=x, y=alt.Y("ci_low:Q", title=axis_title), y2="ci_high:Q", color=color)
            )
            if seeds == 1:  # the seed's own interval over windows: the across-seeds row has none
                bars = bars.properties(data=end_seeds)
            dots = (
                alt.Chart(end)
                .mark_point(filled=True, size=50)
                .encode(
                    x=x,
                    y="final_difference:Q",
                    color=color,
                    tooltip=[
                        "comparison",
                        "seeds",
                        alt.Tooltip("final_difference:Q", format=".5f"),
                        alt.Tooltip("ci_low:Q", format=".5f"),
                        alt.Tooltip("ci_high:Q", format=".5f"),
                        "verdict",
                    ],
                )
            )
            each = (
                alt.Chart(end_seeds)
                .mark_tick(thickness=1, size=8)
                .encode(
                    x=x,
                    y="final_difference:Q",
                    color=color,
                    tooltip=["seed", alt.Tooltip("final_difference:Q", format=".5f")],
                )
            )
            layers = (
                [shaded, zero, raw]
                + ([spread] if seeds > 1 else [])
                + [smooth, bars, dots]
                + ([each] if seeds > 1 else [])
            )
            panels.append(
                alt.layer(*layers).properties(
                    width=360 if len(comparisons) == 1 else 240, height=200, title=f"{title}: baseline - {comparison}"
                )
            )
        if panels:
            rows.append(alt.hconcat(*panels))
    over = (
        f"faint: each of {seeds} seeds per logged step; solid: the seeds' mean trailing mean, shaded: their range"
        if seeds > 1
        else "faint: per logged step; solid: trailing mean (one training seed)"
    )
    end = (
        "at the end: each seed's final paired difference (ticks) and their mean with its t interval over seeds"
        if seeds > 1
        else "at the end: the final models' paired difference over the same windows, with its confidence interval"
    )
    return alt.vconcat(*rows).properties(
        title=alt.TitleParams(
            f"{shape}: baseline loss minus the other run's (positive: the other run is better)",
            subtitle=[f"{over}; grey band: +-{band:g}", end],
        )
    )


def per_run_figures(kind: str, tables: dict[str, pd.DataFrame]) -> list[str]:
    """The runs with a figure of their own of `kind` in its tables (none for the kinds drawn per shape or model)."""
    table = {"layer-error": "layer_error", "envelope": "envelope_training"}.get(kind)
    return [] if table is None else list(dict.fromkeys(tables[table].run))


def charts(
    kind: str, tables: dict[str, pd.DataFrame], band: float = 0.001, runs: Collection[str] | None = None
) -> dict[str, alt.TopLevelMixin]:
    """Every figure of `kind`, by name (`layout.analysis_figures`), from its tables (`layout.ANALYSIS_TABLES[kind]`, by
    name); of the figures drawn one per run, only those of `runs` where given (the study page's, which shows one
    training seed)."""
    if kind == "layer-error":
        runs = [r for r in per_run_figures(kind, tables) if runs is None or r in runs]
        return dict(
            zip(layout.analysis_figures(kind, runs, []), (layer_error_chart(tables["layer_error"], r) for r in runs))
        )
    if kind == "envelope":
        runs = [r for r in per_run_figures(kind, tables) if runs is None or r in runs]
        names = layout.analysis_figures(kind, runs, [])
        return {
            names[0]: envelope_chart(tables["envelope"]),
            **dict(zip(names[1:], (training_envelope_chart(tables["envelope_training"], r) for r in runs))),
        }
    if kind == "swallowed":
        shapes = list(dict.fromkeys(tables["swallowed"]["shape"]))
        return dict(
            zip(layout.analysis_figures(kind, [], shapes), (swallowed_chart(tables["swallowed"], s) for s in shapes))
        )
    if kind == "loss-difference":
        curves, final = tables["loss_curves"], tables["loss_difference"]
        shapes = list(dict.fromkeys(final["shape"]))
        return dict(
            zip(
                layout.analysis_figures(kind, [], shapes),
                (loss_difference_chart(curves, final, s, band) for s in shapes),
            )
        )
    if kind == "public":
        table, ratios = tables["public_layer_error"], tables["public_flip_ratio"]
        models = list(dict.fromkeys(table.model))
        names = layout.analysis_figures(kind, models, [])
        return dict(zip(names, (public_chart(table, ratios, m, k) for m in models for k in PUBLIC_KINDS)))
    raise ValueError(f"unknown analysis kind {kind!r}: one of {', '.join(layout.ANALYSIS_TABLES)}")
