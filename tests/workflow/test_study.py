"""The study page: the whole default study (a smaller corpus and shorter runs; conftest's `study`,
through Slurm where it is installed), then results/study.html checked for what a reader needs (every section, the answer
computed from the tables, a missing stage named) and opened in headless Chromium with no network:
no console error, no failed or outside request, every figure rendered; a screenshot is kept.
The same study's logs are plain lines with the long stages' progress, and it has nothing to rerun."""

import json
import re
import shutil
import subprocess
import sys

import pandas as pd
import pytest
import yaml

from streamback import layout
from streamback.train.metrics import read_metrics

from conftest import ROOT

SECTIONS = [
    "The answer",
    "What was run",
    "Before training: the preflights",
    "Benchmarks",
    "Loss difference",
    "Training seeds",
    "Does it matter more with depth?",
    "Residual envelope",
    "Precision error by layer",
    "Swallowed updates",
    "Public models: the paper&#x27;s first evidence",
    "Training curves",
    "The drift of a long bf16 sum",
    "Speed and memory",
]


@pytest.fixture(scope="module")
def study(study):
    """The shared study (conftest), by its working directory."""
    return study.root


@pytest.mark.slow
def test_the_page_says_what_was_run_and_what_came_out(study):
    page = (study / layout.STUDY_PAGE).read_text()
    text = re.sub(r"<script.*?</script>", "", page, flags=re.S)  # the page without the inlined Vega bundle and specs
    assert re.findall(r"<h2>(.*?)</h2>", text) == SECTIONS
    assert "config/config.yaml" in page and "small.yaml" in page and "Code: commit" in page and "torch " in page
    assert page.count("<script") == 1 + page.count('vegaEmbed("#chart')  # the bundle, then one script per chart
    assert "https://" not in text  # no link out
    assert (
        text.count('class="missing"') == 1 and "No speed or memory figures yet" in text
    )  # no GPU figures: named, not dropped
    # the answer is the tables' numbers, over the seeds first
    loss = pd.read_csv(study / layout.table("loss_difference"))
    row = loss[(loss.split == "val") & (loss.comparison == "streamback") & (loss.seed == "all")].iloc[0]
    assert row.seeds == 2
    assert (
        f"On {row['shape']}, over 2 training seeds, StreamBack&#x27;s final validation loss is "
        f"{abs(row.final_difference):.4f} nats "
        f"{'lower' if row.final_difference > 0 else 'higher'} than the baseline&#x27;s on average (95% t interval over "
        f"seeds "
        f"{row.ci_low:+.4f} to {row.ci_high:+.4f}; bootstrap over seeds then windows {row.boot_low:+.4f} to "
        f"{row.boot_high:+.4f}"
    ) in text
    assert "each trained with 2 training seeds (0, 1" in text
    pairs = pd.read_csv(study / layout.table("benchmark_pairs"))
    over = pairs[pairs.seed == "all"]
    assert (
        "Over 2 training seeds, " in text
        and f"of {len(over)} benchmark comparisons of a run against its shape&#x27;s baseline" in text
    )
    assert f"Within single seeds, of {len(pairs) - len(over)} benchmark comparisons" in text
    assert text.index("Over 2 training seeds, ") < text.index("Within single seeds, of ")  # across seeds first
    # the answer: the primary test's sentence first, then the forest plot, the primary test's table, the verdict
    # table and the sentences in detail; the inventory below
    assert (
        text.index("<h2>The answer</h2>")
        < text.index("StreamBack&#x27;s final validation loss is")
        < text.index('id="chart')
        < text.index("<h3>The primary test</h3>")
        < text.index("<h3>Verdicts over the training seeds (secondary)</h3>")
        < text.index("<h3>In detail</h3>")
        < text.index(f"On {row['shape']}, over 2 training seeds")
        < text.index("<h2>What was run</h2>")
    )
    assert (
        f"this tier resolves |Δ| ≥ {row.mde:.4f} nats; the paper&#x27;s band of ±0.001 nats would take "
        + ("more than 100,000 seeds" if pd.isna(row.seeds_for_band) else f"{int(row.seeds_for_band):,} seeds")
        + " at this spread"
    ) in text
    for run in pd.read_csv(study / layout.table("benchmarks")).run.unique():
        assert run in text
    # the figures of one run are the first seed's; the other seeds' are counted, neither drawn nor shown
    other = [run for run in pd.read_csv(study / layout.table("layer_error")).run.unique() if run.endswith("-seed1")]
    assert len(other) == 6 and not any(f"<h3>{run}</h3>" in text for run in other)
    assert text.count(f"{len(other)} more figures of this kind, one per run of the other training seeds") == 2
    # every run logged its live signals (the stream every 10 of SMALL's 30 steps) and its TensorBoard events; the
    # page shows
    # them and the warnings: the MXFP8 stream's grid step at the stream's max passes its typical update at once
    for run in pd.read_csv(study / layout.table("benchmarks")).run.unique():
        assert [r["step"] for r in read_metrics(study / layout.metrics_file(run)) if "swallowed_fraction" in r] == [
            10,
            20,
            30,
        ], run
        assert list((study / layout.tensorboard_dir(run)).glob("recipe-*/events.out.tfevents.*")), run
    assert (
        "<h3>Live precision signals</h3>" in text
        and "<h3>Warnings</h3>" in text
        and "<h3>Full-precision shadow</h3>" in text
    )
    assert re.search(r"tiny-medium-streamback-mxfp8</td>\s*<td>10</td>\s*<td>spacing", text)
    variance = pd.read_csv(study / layout.table(layout.SEED_TABLE))
    assert (variance[variance.block == "baseline"].seeds == 2).all() and (
        variance[variance.stream == "nvfp4"].seeds == 1
    ).all()
    assert (
        "Each run arm&#x27;s final losses and benchmark scores over its training seeds" in text
    )  # the seeds section's caption
    snr = pd.read_csv(study / layout.table(layout.TASK_SNR_TABLE))
    assert "<h3>Which tasks can rank these models</h3>" in text and set(snr.task) <= set(pairs.task) | {
        "streamback_perplexity"
    }
    assert (
        "Over the 6 run arms, with each arm&#x27;s noise from its training seeds" in text
    )  # the benchmark answer leads with them


@pytest.mark.slow
def test_every_log_is_plain_lines_with_the_progress_of_long_stages(study):
    """In a log file no progress bar (no carriage return: lm-eval's and datasets' tqdm are off),
    and the long stages say how far they are, how fast and how long is left."""
    logs = {
        path.relative_to(study / "logs").as_posix(): path.read_bytes().decode()
        for path in (study / "logs").rglob("*.log")
    }
    assert not [name for name, text in logs.items() if "\r" in text]  # read as bytes: text mode turns \r into \n
    assert re.search(r"tokenize: done: .* tokens, [\d,.]+ tokens/s", logs["tokenize/synthetic.log"])
    for name, unit in [
        ("train/tiny-medium-streamback.log", "step"),
        ("analysis/layer-error.log", "pass"),
        ("analysis/loss-difference.log", "model"),
    ]:
        assert re.search(rf"\d+/\d+ {unit}, [\d,.]+ {unit}/s, \d+m\d\ds left", logs[name]), name


@pytest.mark.slow
def test_a_finished_study_has_nothing_to_rerun(study, run_snakemake):
    """Snakemake's records of the real jobs (params, code, inputs, software) match what the workflow
    would give them now: a second call plans no job."""
    result = run_snakemake("-n", "--cores", "2", "--directory", study, "--configfile", study / "small.yaml")
    assert result.returncode == 0 and "Nothing to be done" in result.stdout + result.stderr, result.stdout[-3000:]


def test_the_plan_of_the_study_sizes_every_job_kind(study):
    """`snakemake plan` (a local rule, run beside the study): one table of every job kind against its need, on
    both GPUs of plan.gpu_memory_gb; the tiny study asks for enough of everything."""
    plan = pd.read_csv(study / layout.table(layout.PLAN_TABLE))
    kinds = {"train", "export_hf", "analyze_layer_error", "analyze_loss_difference", "evaluate", "matrix"}
    assert kinds <= set(plan.job)
    assert {"80 GB", "141 GB"} <= set(plan.gpu)
    assert plan.ok.all(), plan[~plan.ok].to_string()
    assert "plan: 0 mismatch(es)" in (study / "logs" / "plan.log").read_text()


@pytest.mark.slow
def test_a_stage_that_has_not_run_is_named(study, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(study / "results", copy / "results")
    (copy / layout.table("swallowed")).unlink()
    shutil.rmtree(copy / layout.DRIFT_DIR)
    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    proc = subprocess.run(
        [sys.executable, "-m", "streamback", "study-report", "--config-json", json.dumps(config)],
        cwd=copy,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    page = (copy / layout.STUDY_PAGE).read_text()
    assert "Analysis swallowed: not run yet (rule analyze_swallowed; missing results/tables/swallowed.csv)" in page
    assert "The drift study: not run yet (rule drift" in page
    assert "The swallowed updates are not available" in page  # the answer says so too


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("chromium") is None, reason="Debian's chromium is not installed (.ci/run installs it)")
def test_the_page_renders_offline_in_chromium(study):
    """Every request the page makes is refused unless it is the page itself: a figure that needed the
    network, a console error or a chart that does not draw fails the test. The screenshot goes to
    results/study_screenshot.png in the repository (git-ignored) for a reviewer."""
    from playwright.sync_api import sync_playwright

    page_file = study / layout.STUDY_PAGE
    errors, outside = [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=shutil.which("chromium"),
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"],
        )
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("requestfailed", lambda r: errors.append(f"request failed: {r.url}"))
            page.route(
                "**/*",
                lambda route: (
                    route.continue_()
                    if route.request.url == page_file.as_uri()
                    else (outside.append(route.request.url), route.abort())
                ),
            )
            page.goto(page_file.as_uri(), wait_until="load")
            charts = page.locator("div.chart")
            count = charts.count()
            page.wait_for_function(
                f"document.querySelectorAll('div.chart svg, div.chart canvas').length >= {count}", timeout=60000
            )
            sizes = page.evaluate(
                "Array.from(document.querySelectorAll('div.chart')).map(d => {"
                " const s = d.querySelector('svg, canvas'); const r = s.getBoundingClientRect(); return [r.width, "
                "r.height]; })"
            )
            # the answer as a reader meets it: its first paragraph one sentence, at most five before any figure
            opening = page.evaluate(
                "(() => { const out = []; let e = [...document.querySelectorAll('h2')]"
                ".find(h => h.textContent === 'The answer').nextElementSibling;"
                " while (e && e.tagName === 'P') { out.push(e.innerText); e = e.nextElementSibling; }"
                " return {sentences: out, next: e && e.className}; })()"
            )
            forest = page.evaluate(
                "(() => { const d = document.querySelector('div.chart'); const r = d.querySelector('svg, canvas')"
                ".getBoundingClientRect(); const y = {}; d.querySelectorAll('svg text').forEach(t => {"
                " if (!(t.textContent in y)) y[t.textContent] = t.getBoundingClientRect().top; });"
                " return {right: r.right, width: document.documentElement.scrollWidth, y: y}; })()"
            )
            shot = ROOT / layout.RESULTS / "study_screenshot.png"
            shot.parent.mkdir(exist_ok=True)
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    assert not errors and not outside, (errors, outside)
    # the first sentence is the primary test's answer, from primary.csv
    primary = pd.read_csv(study / layout.table(layout.PRIMARY_TABLE)).iloc[0]
    first = opening["sentences"][0]
    assert 1 <= len(opening["sentences"]) <= 5 and "chart" in opening["next"].split(), opening
    assert first.count(". ") == 0 and first.endswith(".")  # one sentence
    leads = {  # the primary verdict against the paper's band -> the plain words the sentence opens with
        "different": "On this tier the fp32 stream changes training:",
        "different, but within": "On this tier the fp32 stream changes training, but by less than the paper's band:",
        "equivalent within": "On this tier the fp32 stream does not change training beyond the paper's band:",
        "inconclusive": "This tier cannot tell whether the fp32 stream changes training:",
    }
    verdict = primary.verdict_band
    assert first.startswith(leads[max((k for k in leads if verdict.startswith(k)), key=len)]), first
    direction = "lower" if primary.estimate > 0 else "higher"
    assert f"final validation loss is {abs(primary.estimate):.4f} nats {direction} than the baseline's" in first
    assert f"95% t interval {primary.low:+.4f} to {primary.high:+.4f} nats over {primary.seeds} seeds" in first
    assert f"exact sign-flip p = {primary.p:.2g}" in first and verdict in first
    assert primary.seeds == 6 and primary.strata == 3  # the default's three shapes, two seeds each
    # the forest plot fits the 1,400-pixel viewport, its shapes in the paper's order (the config's)
    assert forest["right"] <= 1400 and forest["width"] <= 1400, forest
    shapes = ["tiny-skinny-tall", "tiny-medium", "tiny-fat-short"]
    assert [forest["y"][s] for s in shapes] == sorted(forest["y"][s] for s in shapes), forest["y"]
    assert count >= 20 and len(sizes) == count and all(w > 100 and h > 50 for w, h in sizes), sizes


@pytest.mark.slow
def test_bench_preflight_speed_compares_each_arm_with_exactly_its_runs(study):
    """benchmarks/bench_preflight_speed.py on the study: one row per preflight record, its runs those the run
    matrix gives its arm (seed suffixes and longer arm names that share a prefix told apart), its tokens/s the
    record's, the runs' median the median of each run's median step, recomputed here from metrics.jsonl; beside
    it the noise floor: the runs' spread (max - min over their median) and each run's own first steps (the
    preflight's warm-up and timed steps), their median against the run's, the largest gap."""
    import os
    import statistics

    from streamback.config import DEFAULT_CONFIG, merge_config, read_config_file, validate_config
    from streamback.runs import run_matrix

    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_preflight_speed.py"), str(study)],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    small = yaml.safe_load((study / "small.yaml").read_text())
    matrix = run_matrix(validate_config(merge_config(read_config_file(DEFAULT_CONFIG), small))["train"])
    arms = {spec.arm for spec in matrix.values()}
    rows = {line.split()[0]: line.split() for line in proc.stdout.splitlines()[1:-1]}
    assert set(rows) == arms and len(arms) == 9
    for arm, row in rows.items():
        record = json.loads((study / layout.preflight_file(arm)).read_text())
        speed = next(c for c in record["checks"] if c["name"] == "speed")["values"]
        runs = [name for name, spec in matrix.items() if spec.arm == arm]
        steps = [[r["tokens_per_s"] for r in read_metrics(study / layout.metrics_file(run))] for run in runs]
        medians = [statistics.median(s) for s in steps]
        median = statistics.median(medians)
        timed = slice(2, 2 + speed["timed_steps"])  # the steps the preflight times of its own, in each run
        windows = [statistics.median(s[timed]) / m - 1 for s, m in zip(steps, medians)]
        assert row[1:3] == [str(len(runs)), "True"], (arm, row)
        assert row[3:5] == [f"{speed['tokens_per_s']:,.0f}", f"{median:,.0f}"], (arm, row)
        assert row[5] == f"{speed['tokens_per_s'] / median - 1:+.1%}", (arm, row)
        spread = f"{(max(medians) - min(medians)) / median:.1%}" if len(runs) > 1 else "-"
        assert row[6:] == [spread, f"{max(windows, key=abs):+.1%}"], (arm, row)
    assert proc.stdout.splitlines()[-1].startswith(
        f"kernels: 9 of 9 arms name their runs' kernels ({record['kernels']})"
    )
    assert "; the noise floor: the runs of one arm differ by up to " in proc.stdout.splitlines()[-1]
