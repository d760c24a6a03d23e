"""The study page's sections, in order, from the files the stages wrote.

Every table shown is a stage's CSV (or a view of it), every figure is drawn by the owning stage's
own chart function from that stage's tables (`streamback.analysis.figures.charts`,
`streamback.train.curves`, `streamback.drift.report`), so the page and the SVG/PNG files show the
same thing. A stage whose files are not there is named in a box, with the rule that makes them.
Captions are the Snakemake report's (`workflow/report/<name>.rst`): one home for each.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from streamback import layout
from streamback.analysis.figures import charts, per_run_figures
from streamback.config import ROOT, public_models
from streamback.drift.report import overview_table, ratio_chart, reading, spacing_chart, trajectory_chart
from streamback.html_report import Caption, Missing, Subheading
from streamback.io import read_json
from streamback.measure import bench, memory
from streamback.report import answer, depth, provenance
from streamback.report.seeds import differences, differences_chart
from streamback.runs import comparisons, run_matrix
from streamback.train.curves import grad_norm_chart, loss_chart
from streamback.train.metrics import read_metrics
from streamback.train.signals import shadow_table, signals_table, swallowed_chart
from streamback.train.watch import warnings_table

CAPTIONS = ROOT / "workflow" / "report"


@dataclass
class Study:
    """What the page is about: the merged config, the config files it came from, the timing records."""

    config: dict
    config_files: list[Path]
    timings: dict[str, list[Path]] = field(default_factory=dict)

    @property
    def runs(self) -> list[str]:
        return list(run_matrix(self.config["train"]))


def caption(name: str, **values) -> Caption:
    """The caption of `workflow/report/<name>.rst` as plain text (RST literals unquoted, Jinja
    fields filled from `values`)."""
    text = (CAPTIONS / f"{name}.rst").read_text().strip()
    text = re.sub(r"\{\{\s*snakemake\.wildcards\.(\w+)\s*\}\}", lambda m: str(values.get(m.group(1), m.group(0))), text)
    return Caption(text.replace("``", "").replace("\\|", "|"))


def _missing(what: str, rule: str, files: list[Path]) -> Missing:
    absent = [str(f) for f in files if not Path(f).exists()]
    shown = ", ".join(absent[:4]) + (f" and {len(absent) - 4} more" if len(absent) > 4 else "")
    return Missing(
        f"{what}: not run yet (rule {rule}; missing {shown}). Run `snakemake --cores 2 {rule}` or the whole study."
    )


def _read_tables(names) -> dict[str, pd.DataFrame] | None:
    paths = [layout.table(n) for n in names]
    return {n: pd.read_csv(p) for n, p in zip(names, paths)} if all(p.exists() for p in paths) else None


def _shown(path: Path) -> str:
    """A config file as a reader knows it: relative to the repository if it is in it."""
    path = Path(path).resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def what_was_run(study: Study) -> list:
    summaries = {
        r: json.loads(layout.summary_file(r).read_text()) for r in study.runs if layout.summary_file(r).exists()
    }
    versions = provenance.package_versions()
    files = [f"{_shown(f)} (sha256 {provenance.sha256(f)[:12]})" for f in study.config_files]
    blocks = [
        f"Config: {' merged with '.join(files)}; the merged, validated config hashes to "
        f"{provenance.config_hash(study.config)[:16]}. "
        f"Code: commit {provenance.git_commit(ROOT)}. Page written on {provenance.this_machine()}.",
        "Packages: " + ", ".join(f"{k} {v}" for k, v in versions.items()) + ".",
    ]
    if summaries:
        runs = provenance.runs_table(summaries)
        devices = sorted({str(d) for d in runs.device.dropna()})
        blocks += [
            Subheading("Trained runs"),
            runs,
            Caption(
                f"One row per run, from its summary.json (results/runs/<run>/): trained on {', '.join(devices)}; "
                f"{runs['GPU-hours'].sum():.1f} GPU-hours and {runs['train time (s)'].sum() / 60:.1f} minutes of "
                f"training in all."
            ),
        ]
    absent = [r for r in study.runs if r not in summaries]
    if absent:
        blocks.append(_missing(f"Training of {', '.join(absent)}", "train", [layout.summary_file(r) for r in absent]))
    times = provenance.stage_times(study.timings)
    if not times.empty:
        blocks += [
            Subheading("Time per stage"),
            times,
            Caption(
                "Wall-clock and CPU seconds of every stage's jobs, summed (Snakemake's benchmark records, "
                "results/timing/). "
                "On a cluster the wall-clock seconds of jobs that ran side by side add up to more than the study took."
            ),
        ]
    return blocks


def _figures(x: float, significant: int) -> str:
    """`x` to `significant` figures, in plain notation (148.3 ± 26, 0.562 ± 0.022)."""
    if x == 0 or not math.isfinite(x):
        return f"{x:g}"
    return f"{x:,.{max(0, significant - 1 - math.floor(math.log10(abs(x))))}f}"


def preflights() -> list:
    """Every arm's preflight before it trained (rule preflight's table, `streamback.preflight.table`)."""
    path = layout.table(layout.PREFLIGHT_TABLE)
    if not path.exists():
        return [_missing("The preflights", "preflight", [path])]
    table = pd.read_csv(path)
    shown = table.assign(
        tokens_per_s=table.tokens_per_s.round(0).astype(int),
        run_hours=table.run_hours.map("{:.3g}".format),
        arm_hours=table.arm_hours.map("{:.3g}".format),
    )
    return [
        shown,
        caption("preflights"),
        Caption(
            f"The matrix's projection: {table.arm_hours.sum():.3g} {table.unit.iloc[0]} "
            f"for {int(table.runs.sum())} runs, from {path}."
        ),
    ]


def benchmarks() -> list:
    tables = _read_tables(layout.BENCHMARK_TABLES)
    if tables is None:
        return [_missing("Evaluation", "benchmark_table", [layout.table(n) for n in layout.BENCHMARK_TABLES])]
    scores, pairs = tables["benchmarks"], tables["benchmark_pairs"]
    scores = scores.assign(
        metric=[m if f == "none" else f"{m}, {f}" for m, f in zip(scores.metric, scores["filter"])]
    )  # gsm8k's filters apart
    wide = scores.assign(
        score=[
            _figures(v, 4) + (f" ± {_figures(s, 2)}" if pd.notna(s) else "")
            for v, s in zip(scores.value, scores.stderr)
        ]
    )
    index = [c for c in ("shape", "run", "stream", "seed") if c in wide.columns]
    wide = wide.pivot_table(index=index, columns=["task", "metric"], values="score", aggfunc="first", sort=False)
    wide.columns = [f"{task} ({metric})" for task, metric in wide.columns]
    blocks = [wide.reset_index(), caption("benchmarks")]
    snr = layout.table(layout.TASK_SNR_TABLE)
    if snr.exists():
        blocks += [Subheading("Which tasks can rank these models"), pd.read_csv(snr).round(4), caption("task_snr")]
    seeds = pairs.seed.astype(str) if "seed" in pairs.columns else pd.Series("0", index=pairs.index)
    over, per_seed = pairs[seeds == layout.ALL_SEEDS], pairs[seeds != layout.ALL_SEEDS]
    if len(over) and (over.seeds > 1).any():
        shown = [
            "shape",
            "comparison",
            "task",
            "filter",
            "metric",
            "seeds",
            "baseline_value",
            "value",
            "diff",
            "ci_low",
            "ci_high",
            "boot_low",
            "boot_high",
            "sd",
            "baseline_sd",
            "p_seeds",
            "p_holm",
            "mde",
            "seeds_for_target",
            "verdict",
        ]
        blocks += [
            Subheading("Is a difference real? Each comparison over the training seeds"),
            over[over.seeds > 1][shown].round(4),
            caption("benchmark_pairs_seeds"),
        ]
    shown = [
        "shape",
        "seed",
        "task",
        "filter",
        "metric",
        "run",
        "n",
        "baseline_value",
        "value",
        "diff",
        "ci_low",
        "ci_high",
        "p_holm",
        "mdd",
        "verdict",
    ]
    return blocks + [
        Subheading("Within each seed: each run against its shape's baseline of the same seed"),
        per_seed[[c for c in shown if c in per_seed.columns]].round(4),
        caption("benchmark_pairs"),
    ]


def analysis(kind: str, study: Study) -> list:
    """The figures of one analysis kind (and, for loss-difference, its table: the rows over seeds
    first), each with its caption. Figures of one run are shown for the runs of train.seed; the
    other seeds' are in results/figures/."""

    names = layout.ANALYSIS_TABLES[kind]
    tables = _read_tables(names)
    if tables is None:
        return [_missing(f"Analysis {kind}", f"analyze_{kind.replace('-', '_')}", [layout.table(n) for n in names])]
    blocks = []
    if kind == "loss-difference":
        table = tables["loss_difference"]
        order = (table.seed.astype(str) != layout.ALL_SEEDS).argsort(kind="stable")
        blocks += [table.iloc[order].round(5), caption("analysis_loss_difference")]
    matrix = run_matrix(study.config["train"])
    shown = {name for name, spec in matrix.items() if spec.seed == study.config["train"]["seed"]}
    # the other seeds' figures are drawn by the analysis alone: the page neither builds nor shows them
    own = per_run_figures(kind, tables)
    drawn = [run for run in own if run in shown or run not in matrix]
    hidden = len(own) - len(drawn)
    for name, chart in charts(kind, tables, study.config["analysis"]["band"], runs=drawn).items():
        figure, _, subject = name.partition("-")
        blocks += [Subheading(subject)] if subject else []
        blocks += [chart, caption(f"analysis_{figure}_figure")]
    if hidden:
        blocks.append(
            Caption(
                f"{hidden} more figures of this kind, one per run of the other training seeds, are in "
                f"{layout.FIGURES_DIR}/."
            )
        )
    return blocks


HALF = (0.35, 0.65)  # the flip ratios read as "roughly half"


def halving_verdict(ratio: float, low: float, high: float) -> str:
    """Whether a fp32 / bf16 sign-flip ratio with its interval bears out the paper's "roughly half"."""
    if not math.isfinite(ratio):
        return "no sign flips in the bf16 stream: nothing to halve"
    if math.isfinite(low) and low > 1:
        return "more flips with the fp32 stream: the claim does not hold"
    if not (math.isfinite(high) and high < 1):
        return "no difference shown (the interval holds 1): the claim is not borne out"
    if HALF[0] <= ratio <= HALF[1]:
        return "roughly half: the claim holds"
    return (
        "fewer flips, but not half: the claim holds in direction only"
        if ratio > HALF[1]
        else "fewer than half: more than the claim"
    )


def public_section(study: Study) -> list:
    """The paper's first evidence on each public model (rule analyze_public): where the halving of the
    gradients' sign flips holds, on how many tokens, the flip-ratio table and the two figures per model."""

    cfg = study.config["analysis"]
    if not public_models(cfg):
        return [
            Caption("analysis.public_models is empty: no public model was analysed (docs/public-models.md names one).")
        ]
    names = layout.ANALYSIS_TABLES["public"]
    tables = _read_tables(names)
    if tables is None:
        return [_missing("Public models", "analyze_public", [layout.table(n) for n in names])]
    ratios = tables["public_flip_ratio"]
    fp32 = ratios[(ratios.variant == "fp32") & (ratios.kind == "gradients")]
    truth = (
        "fp64"
        if cfg["reference"] == "fp64"
        else "fp32 (analysis.reference: an fp64 copy of a large model's attention would not fit)"
    )
    blocks = []
    for model, rows in fp32.groupby("model", sort=False):
        overall = rows[rows.layer == "all"].iloc[0]
        layers = rows[rows.layer != "all"]
        below = int((layers.flip_ratio_high < 1).sum())
        half = int(((layers.flip_ratio_low <= HALF[1]) & (layers.flip_ratio_high >= HALF[0])).sum())
        blocks.append(
            Caption(
                f"{model} ({public_models(cfg)[model]}), {overall.tokens:,} tokens in {overall.sequences} sequences, "
                f"ground truth {truth}: "
                f"the parameter gradients' sign flips, fp32 stream over bf16 stream, {overall.flip_ratio:.2f} over all "
                f"layers "
                f"({cfg['confidence']:.0%} interval {overall.flip_ratio_low:.2f}-{overall.flip_ratio_high:.2f}; "
                f"{overall.sign_flips:,} against {overall.bf16_sign_flips:,}): "
                f"{halving_verdict(overall.flip_ratio, overall.flip_ratio_low, overall.flip_ratio_high)}. "
                f"Layer by layer, the fp32 stream has fewer flips (interval below 1) in {below} of {len(layers)} "
                f"blocks, and an interval "
                f"that reaches roughly half ({HALF[0]}-{HALF[1]}) in {half}."
            )
        )
    shown = ratios[
        (ratios.layer == "all") | ((ratios.variant == "fp32") & (ratios.kind == "gradients"))
    ]  # the rest: the CSV
    blocks += [shown.round(4), caption("analysis_public_flip_ratio")]
    for name, chart in charts("public", tables).items():
        figure, _, subject = name.partition("-")
        blocks += [Subheading(subject), chart, caption(f"analysis_{figure}_figure")]
    return blocks


def seeds(study: Study) -> list:
    """Training's own randomness: every arm's spread over its seeds (rule seed_variance; each
    comparison per seed is the answer's forest plot)."""
    path = layout.table(layout.SEED_TABLE)
    if not path.exists():
        return [_missing("The seed-to-seed spread", "seed_variance", [path])]
    return [pd.read_csv(path).round(5), caption("seed_variance")]


def depth_section(study: Study) -> list:
    """Does the fp32 stream matter more with depth? (rule depth): the figure of every measure against
    depth, each trend in a sentence, and the two tables; read from depth.csv and depth_trend.csv alone."""
    tables = _read_tables(layout.DEPTH_TABLES)
    if tables is None:
        return [_missing("The measures against depth", "depth", [layout.table(n) for n in layout.DEPTH_TABLES])]
    table, trend = tables[layout.DEPTH_TABLES[0]], tables[layout.DEPTH_TABLES[1]]
    band = study.config["analysis"]["band"]
    main = table[table.comparison == "streamback"] if (table.comparison == "streamback").any() else table
    depths = ", ".join(str(d) for d in sorted(main.depth.unique()))
    seeds = f"{main.seeds.min()} to {main.seeds.max()}" if main.seeds.nunique() > 1 else str(main.seeds.iloc[0])
    steps = [c for c in trend.columns if "_vs_" in c and not c.endswith(("_low", "_high"))]

    def contrasts(r) -> str:
        shown = [f"{c.replace('_vs_', ' vs ')} {r[c]:+.4g}" for c in steps if pd.notna(r[c])]
        return f"; {', '.join(shown)}" if shown else ""

    parts = [
        f"{r.what}: {r.slope:+.4g} a doubling"
        + (
            f" ({r.low:+.4g} to {r.high:+.4g}, t; {r.boot_low:+.4g} to {r.boot_high:+.4g}, bootstrap"
            f"{contrasts(r)}; Holm p {'n/a' if pd.isna(r.p_holm) else format(r.p_holm, '.2g')})"
            if pd.notna(r.low)
            else ""
        )
        + f", {r.verdict}"
        for _, r in trend[trend.comparison == "streamback"].iterrows()
        if pd.notna(r.slope)
    ]
    text = (
        f"Over depths of {depths} layers ({seeds} training seeds each), each measure's slope against log2(depth), "
        "StreamBack against the baseline: " + ("; ".join(parts) if parts else "no slope (fewer than two depths)") + "."
    )
    return [
        text,
        depth.depth_chart(table, trend, band),
        caption("depth_figure"),
        table.round(5),
        caption("depth"),
        trend.round(6),
        caption("depth_trend"),
    ]


def training_curves() -> list:
    path = layout.table(layout.TRAINING_TABLE)
    if not path.exists():
        return [_missing("Training curves", "training_curves", [path])]
    table = pd.read_csv(path)
    return [loss_chart(table), caption("training_loss"), grad_norm_chart(table), caption("training_grad_norm")]


def live_signals(study: Study) -> list:
    """What the runs' trainers watched: the live swallowed share over training, and every warning
    that fired (`streamback.train.signals`, `streamback.train.watch`), from each run's metrics.jsonl."""

    records = {run: read_metrics(layout.metrics_file(run)) for run in study.runs if layout.metrics_file(run).exists()}
    if not records:
        return [_missing("The live precision signals", "train", [layout.metrics_file(r) for r in study.runs])]
    blocks = [Subheading("Live precision signals")]
    table = signals_table(records)
    if table.empty:
        blocks.append(
            "No run logged live signals (train.log.signals is off, or no run reached train.log.stream_every steps)."
        )
    else:
        blocks += [swallowed_chart(table), caption("training_signals")]
    shadows = shadow_table(records)
    blocks.append(Subheading("Full-precision shadow"))
    if len(shadows):
        formats = {"max_gap": ".2e", "last_max_gap": ".2e", "loss_minus_shadow": "+.2e"}
        blocks += [
            shadows.assign(**{k: [f"{v:{f}}" for v in shadows[k]] for k, f in formats.items()}),
            caption("training_shadow"),
        ]
    else:
        blocks.append("No run logged a full-precision shadow (train.log.shadow_every is 0, or no run reached it).")
    events = warnings_table(records)
    quiet = [run for run in records if run not in set(events.run)]
    blocks.append(Subheading("Warnings"))
    if len(events):
        blocks += [events.assign(value=[f"{v:.4g}" for v in events.value]), caption("training_warnings")]
    blocks.append(f"No warning fired in {', '.join(quiet)}." if quiet else "Every run fired at least one warning.")
    return blocks


def drift(study: Study) -> list:
    files = {k: layout.DRIFT_DIR / v for k, v in layout.DRIFT_FILES.items()}
    if not all(files[k].exists() for k in ("summary", "trajectories", "spacing")):
        return [_missing("The drift study", "drift", list(files.values()))]
    summary, spacing = pd.read_csv(files["summary"]), pd.read_csv(files["spacing"])
    summary["note"] = summary["note"].fillna("")
    skipped = summary[summary.drift.isna()].groupby("path", sort=False).note.first().to_dict()
    return [
        *reading(summary),
        overview_table(summary),
        caption("drift_summary"),
        ratio_chart(summary),
        caption("drift_ratio"),
        trajectory_chart(pd.read_parquet(files["trajectories"]), study.config["drift"]["start"], skipped),
        caption("drift_trajectories"),
        spacing_chart(spacing),
        caption("drift_spacing"),
        f"The drift study's own page, with its setup: {files['report']}.",
    ]


def speed_and_memory() -> list:
    """The GPU benchmark's table where `streamback bench` has run (it is not part of the DAG), and the
    memory estimate: each command's own table of its JSON (`streamback.measure.bench.table`, `.memory.table`)."""

    blocks = []
    for path, stage, command, what in (
        (layout.BENCH_FILE, bench, "bench", "training-step speed and memory (streamback bench, on a GPU)"),
        (layout.MEMORY_FILE, memory, "memory", "estimated peak memory of a training step (streamback memory)"),
    ):
        if path.exists():
            header, cells = stage.table(read_json(path, f"run `streamback {command}` again"))
            blocks += [Subheading(what), pd.DataFrame(cells, columns=list(header)), Caption(f"From {path}.")]
    return blocks or [
        Missing(
            "No speed or memory figures yet: `streamback bench` on a GPU (benchmarks/gpu_checks.py runs it) writes "
            f"{layout.BENCH_FILE}, `streamback memory` writes {layout.MEMORY_FILE}."
        )
    ]


def the_answer(study: Study) -> list:
    """The answer: its first sentence the primary test's (primary.csv), at most four short ones after
    it (`answer.headline`), then the forest plot of every comparison over the seeds in the paper's
    order of shapes, the primary test's table, the verdict table, and the answer in detail."""

    sources = _read_tables(("loss_difference", "benchmark_pairs"))
    blocks = answer.headline(study.config)
    if sources is None:
        blocks.append(
            _missing(
                "The forest plot of the comparisons",
                "seed_variance",
                [layout.table(n) for n in ("loss_difference", "benchmark_pairs")],
            )
        )
    else:
        order = study.config["train"]["runs"]["shapes"]  # the paper's order: skinny-tall, medium, fat-short
        blocks += [
            differences_chart(differences(sources["loss_difference"], sources["benchmark_pairs"]), order),
            caption("seed_differences"),
        ]
    primary = answer.primary_view()
    if primary is not None:
        blocks += [Subheading("The primary test"), primary, caption("primary")]
    table = answer.verdicts()
    if table is not None:
        blocks += [Subheading("Verdicts over the training seeds (secondary)"), table, caption("verdicts")]
    return (
        blocks
        + [Subheading("In detail")]
        + answer.sentences(study.config, comparisons(run_matrix(study.config["train"])))
    )


def sections(study: Study) -> list[tuple[str, list]]:
    """The page, in the order a reader needs it."""
    return [
        ("The answer", the_answer(study)),
        ("What was run", what_was_run(study)),
        ("Before training: the preflights", preflights()),
        ("Benchmarks", benchmarks()),
        ("Loss difference", analysis("loss-difference", study)),
        ("Training seeds", seeds(study)),
        ("Does it matter more with depth?", depth_section(study)),
        ("Residual envelope", analysis("envelope", study)),
        ("Precision error by layer", analysis("layer-error", study)),
        ("Swallowed updates", analysis("swallowed", study)),
        ("Public models: the paper's first evidence", public_section(study)),
        ("Training curves", training_curves() + live_signals(study)),
        ("The drift of a long bf16 sum", drift(study)),
        ("Speed and memory", speed_and_memory()),
    ]
