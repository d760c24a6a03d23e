"""The drift study's presentation: figures (Altair), a reading of the table in words, and the page.

Everything here is computed from the tables of `streamback.drift.simulate`, so the words and
figures always agree with the CSV files beside them. `write_outputs` writes the tables, the
figures (SVG and PNG) and the self-contained HTML page under one directory (file names:
`streamback.layout.DRIFT_FILES` and `DRIFT_FIGURES`).
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import torch

from streamback import layout
from streamback.charts import save_chart
from streamback.drift.simulate import PATHS, REFERENCE, Simulation, spacing_table, summary_table, trajectory_table
from streamback.html_report import write_report
from streamback.io import atomic_path, write_csv
from streamback.model.rounding import BF16, ulp


def _setting_label(table: pd.DataFrame) -> pd.Series:
    return "mu=" + table["mu"].map("{:g}".format) + ", sigma=" + table["sigma"].map("{:g}".format)


def ratio_chart(summary: pd.DataFrame):
    """Drift as a fraction of the fp32 drift, per path and setting: one dot per seed, a bar for their mean."""
    import altair as alt

    data = summary.dropna(subset=["drift_ratio"]).assign(setting=_setting_label)[
        ["setting", "path", "seed", "drift_ratio"]
    ]
    order = [p for p in PATHS if p in set(data.path)]
    x = alt.X("path:N", sort=order, title=None, axis=alt.Axis(labelAngle=-40))
    base = alt.Chart(data).encode(x=x)
    bars = base.mark_bar(opacity=0.35).encode(
        y=alt.Y("mean(drift_ratio):Q", title="drift / fp32 drift"), color=alt.Color("path:N", sort=order, legend=None)
    )
    dots = base.mark_circle(size=30, color="black").encode(
        y="drift_ratio:Q", tooltip=["path", "seed", alt.Tooltip("drift_ratio:Q", format=".4f")]
    )
    labels = base.mark_text(dy=-8, fontSize=10).encode(
        y="mean(drift_ratio):Q", text=alt.Text("mean(drift_ratio):Q", format=".1%")
    )
    skipped = summary[summary.drift_ratio.isna()].groupby("path", sort=False).note.first()
    subtitle = [f"Not drawn: {path} ({note.removeprefix('not simulated: ')})." for path, note in skipped.items()]
    title = alt.TitleParams("Drift kept by each path (dots: seeds; bars and labels: their mean)", subtitle=subtitle)
    return (
        (bars + dots + labels)
        .properties(width=260, height=220)
        .facet(column=alt.Column("setting:N", title=None))
        .properties(title=title)
    )


def trajectory_chart(
    trajectories: pd.DataFrame, start: float, not_drawn: dict[str, str] | None = None, max_points: int = 200
):
    """The running value's mean over coordinates against step, per path (averaged over seeds), per
    setting; below, each path's mean minus fp32's on its own scale, one row per path, so that paths
    whose curves lie on top of each other above are told apart. `not_drawn`: path -> why it has no
    trajectory (named in the subtitle)."""
    import altair as alt

    steps = sorted(trajectories.step.unique())
    keep = set(steps[:: max(1, math.ceil(len(steps) / max_points))]) | {steps[-1]}
    data = (
        trajectories[trajectories.step.isin(keep)]
        .assign(setting=_setting_label)
        .groupby(["setting", "path", "step"], as_index=False)["mean"]
        .mean()
    )
    reference = data[data.path == REFERENCE].set_index(["setting", "step"])["mean"]
    data["minus_fp32"] = (
        data["mean"].to_numpy() - reference.reindex(pd.MultiIndex.from_frame(data[["setting", "step"]])).to_numpy()
    )
    order = [p for p in PATHS if p in set(data.path)]
    x = alt.X("step:Q", title="step")
    color = alt.Color("path:N", sort=order)
    lines = (
        alt.Chart()
        .mark_line()
        .encode(
            x=x,
            y=alt.Y("mean:Q", title="mean running value", scale=alt.Scale(zero=False)),
            color=color,
            strokeDash=alt.StrokeDash("path:N", sort=order, legend=None),
            tooltip=["path", "step", alt.Tooltip("mean:Q", format=".1f")],
        )
    )
    layers = [lines]
    subtitle = [
        "Above: every path (dashes tell apart lines that coincide). Below: each path's mean minus fp32's, own scale "
        "per row."
    ]
    if start > 0:  # the next power of two up, where every format's gap doubles
        data["edge"] = 2.0 ** (math.floor(math.log2(start)) + 1)
        layers.append(alt.Chart().mark_rule(strokeDash=[4, 4], color="gray").encode(y="mean(edge):Q"))
        subtitle.append(f"Dashed grey: {data.edge.iloc[0]:g}, where the gap doubles.")
    for path, reason in (not_drawn or {}).items():
        subtitle.append(f"Not drawn: {path} ({reason.removeprefix('not simulated: ')}).")
    top = (
        alt.layer(*layers, data=data)
        .properties(width=260, height=220)
        .facet(column=alt.Column("setting:N", title=None))
    )
    differences = (
        alt.Chart(data[data.path != REFERENCE])
        .mark_line()
        .encode(
            x=x,
            y=alt.Y("minus_fp32:Q", title=None, scale=alt.Scale(zero=False)),
            color=color,
            tooltip=["path", "step", alt.Tooltip("minus_fp32:Q", format=".3f")],
        )
        .properties(width=260, height=55)
        .facet(
            row=alt.Row(
                "path:N", sort=order, title="mean minus fp32's", header=alt.Header(labelAngle=0, labelAlign="left")
            ),
            column=alt.Column("setting:N", title=None),
        )
        .resolve_scale(y="independent")
    )
    title = alt.TitleParams("Mean running value per path (averaged over seeds)", subtitle=subtitle)
    return alt.vconcat(top, differences).properties(title=title)


def spacing_chart(spacing: pd.DataFrame):
    """Gap between neighbouring values against magnitude, per format, from the measured power-of-two ranges."""
    import altair as alt

    data = spacing[(spacing.kind == "range") & spacing.value.between(2.0**-6, 2.0**16)][["format", "value", "gap"]]
    probe = spacing[spacing.kind == "probe"].drop_duplicates(["format", "value"])[["format", "value", "gap"]]
    log2, power = alt.Scale(type="log", base=2), alt.Axis(labelExpr="'2^' + round(log(datum.value) / LN2)")
    x = alt.X("value:Q", scale=log2, axis=power, title="magnitude (start of each power-of-two range)")
    y = alt.Y("gap:Q", scale=log2, axis=power, title="gap to the next value")
    steps = alt.Chart(data).mark_line(interpolate="step-after").encode(x=x, y=y, color="format:N")
    dots = (
        alt.Chart(probe)
        .mark_point(size=80, shape="diamond", filled=True)
        .encode(x=x, y=y, color="format:N", tooltip=["format", "value", "gap"])
    )
    return (steps + dots).properties(
        width=520, height=300, title="Grid spacing per format (diamonds: measured at the probes)"
    )


def _pct(x: float) -> str:
    return f"{100 * x:.2f}%"


def _span(ratios: list[float]) -> str:
    low, high = _pct(min(ratios)), _pct(max(ratios))
    return low if low == high else f"{low} to {high}"


def reading(summary: pd.DataFrame) -> list[str]:
    """Two sentences reading the table, computed from it (so they always agree with it)."""
    means = summary.groupby(["mu", "sigma", "path"], sort=False)[["drift", "drift_ratio"]].mean()
    settings = list(dict.fromkeys(zip(summary.mu, summary.sigma)))
    paths = set(summary.path)
    start = float(summary.start.iloc[0])

    def ratios(name):
        return [means.loc[(mu, sigma, name), "drift_ratio"] for mu, sigma in settings]

    sentences = []
    if "bf16" in paths:
        where = _join([f"({mu:g}, {sigma:g})" for mu, sigma in settings])
        sentence = (
            f"Kept in bf16 with round-to-nearest, the sum retains only part of the fp32 drift, for (mu, sigma) = "
            f"{where}: {_join([_pct(r) for r in ratios('bf16')])}"
        )
        for mu, sigma in settings:
            end = start + means.loc[(mu, sigma, "bf16"), "drift"]
            gap_start, gap_end = (float(ulp(torch.tensor([v]), BF16)) for v in (start, end))
            if gap_end > gap_start:
                sentence += (
                    f"; at ({mu:g}, {sigma:g}) its mean stops at {end:.0f}, where the bf16 gap is {gap_end:g}, not "
                    f"{gap_start:g}"
                )
        if "bf16_bf16_updates" in paths:
            sentence += (
                f"; with its updates rounded to bf16 too (the baseline block's own add) "
                f"{_join([_pct(r) for r in ratios('bf16_bf16_updates')])}"
            )
        if "fp32_bf16_updates" in paths:
            sentence += (
                f"; rounding only the updates to bf16, into an fp32 sum, keeps {_span(ratios('fp32_bf16_updates'))}"
            )
        sentences.append(sentence + ".")
    others = []
    for name in ("bf16_sr", "bf16_kahan", "fp16", "fp8_e5m2", "fp8_e4m3"):
        rows = summary[summary.path == name]
        if rows.empty:
            continue
        if rows.drift.isna().all():
            others.append(f"{name} was not simulated: {rows.note.iloc[0].removeprefix('not simulated: ')}")
            continue
        mu, sigma = settings[0]
        drift, ref = means.loc[(mu, sigma, name), "drift"], means.loc[(mu, sigma, REFERENCE), "drift"]
        others.append(f"{name} keeps {_span(ratios(name))} ({drift:.1f} vs {ref:.1f} at ({mu:g}, {sigma:g}))")
    if others:
        sentences.append("Of the fp32 drift, " + "; ".join(others) + ".")
    return sentences


def _join(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def overview_table(summary: pd.DataFrame) -> pd.DataFrame:
    """The summary averaged over seeds, formatted for reading: per setting and path."""
    groups = summary.groupby(["mu", "sigma", "path"], sort=False)
    out = groups.agg(
        seeds=("seed", "size"),
        drift=("drift", "mean"),
        drift_sd=("drift", "std"),
        ratio=("drift_ratio", "mean"),
        ratio_lo=("drift_ratio", "min"),
        ratio_hi=("drift_ratio", "max"),
        note=("note", "first"),
    ).reset_index()
    fmt = lambda v, spec: "" if pd.isna(v) else format(v, spec)  # noqa: E731
    return pd.DataFrame(
        {
            "mu": out.mu,
            "sigma": out.sigma,
            "path": out.path,
            "seeds": out.seeds,
            "drift (mean ± sd over seeds)": [
                fmt(d, ".1f") + (f" ± {s:.1f}" if pd.notna(s) else "") for d, s in zip(out.drift, out.drift_sd)
            ],
            "drift / fp32 drift": [fmt(r, ".2%") for r in out.ratio],
            "range over seeds": [
                f"{fmt(lo, '.2%')} – {fmt(hi, '.2%')}" if pd.notna(lo) else ""
                for lo, hi in zip(out.ratio_lo, out.ratio_hi)
            ],
            "note": out.note,
        }
    )


def write_outputs(cfg: dict, sim: Simulation, outdir: Path, seconds: float) -> None:
    """Write the tables, the figures (SVG and PNG) and the HTML report under `outdir`."""

    summary, trajectories, spacing = summary_table(cfg, sim), trajectory_table(cfg, sim), spacing_table()
    write_csv(outdir / layout.DRIFT_FILES["summary"], summary)
    with atomic_path(outdir / layout.DRIFT_FILES["trajectories"]) as tmp:
        trajectories.to_parquet(tmp, index=False)
    write_csv(outdir / layout.DRIFT_FILES["spacing"], spacing)
    charts = dict(
        zip(
            layout.DRIFT_FIGURES,
            (ratio_chart(summary), trajectory_chart(trajectories, cfg["start"], sim.skipped), spacing_chart(spacing)),
        )
    )
    for name, chart in charts.items():
        save_chart(chart, outdir / f"{name}.svg", outdir / f"{name}.png")

    paths = "; ".join(f"{name}: {PATHS[name].about}" for name in PATHS if name in set(summary.path))
    setup = (
        f"{cfg['coords']} coordinates start at {cfg['start']:g}; for {cfg['steps']} steps each gets mu + sigma * N(0, "
        f"1) "
        f"added, the same fp32 noise for every path within a seed (seeds {', '.join(map(str, cfg['seeds']))}). "
        f"Paths — {paths}. Drift is the mean over coordinates of the final minus the start value; "
        f"the simulation took {seconds:.1f} s ({how(sim)}). This is the arithmetic of a long sum, not a model's "
        f"training."
    )
    probes = spacing[spacing.kind == "probe"][["format", "value", "gap", "update", "result", "measured_by"]]
    write_report(
        outdir / layout.DRIFT_FILES["report"],
        "Drift of a running sum kept in a narrow float format",
        [
            ("", [setup, *reading(summary)]),
            ("Drift per path, averaged over seeds (all rows: summary.csv)", [overview_table(summary)]),
            ("Drift kept per path", [charts["drift_ratio"]]),
            ("Trajectories", [charts["trajectories"]]),
            ("Grid spacing (spacing.csv)", [probes.reset_index(drop=True), charts["spacing"]]),
        ],
    )


def how(sim: Simulation) -> str:
    """How the step ran, for the page and the log."""
    return "compiled step, its compile included" if sim.compiled else "eager step"
