"""The Snakemake workflow: both configs dry-run; a bad config stops it before any job; a changed
setting reruns exactly the jobs it affects (Snakemake's own dry run says which, and why);
`snakemake --lint` finds nothing; the tests' `run_snakemake` answers as Snakemake's command does."""

import re
import shutil
import subprocess
import sys

import pytest
import torch
import yaml

from streamback import layout
from streamback.config import load_config
from streamback.model.model import ModelArgs, Transformer, count_params
from streamback.runs import run_matrix, train_steps

from conftest import ROOT, snakemake_command


@pytest.mark.parametrize("name", ["config.yaml", "paper.yaml"])
def test_dry_run(run_snakemake, tmp_path, name):
    result = run_snakemake("-n", "--configfile", ROOT / "config" / name, "--directory", tmp_path)
    assert result.returncode == 0, result.stderr + result.stdout
    assert "rule drift" in result.stdout + result.stderr


def test_run_snakemake_answers_as_python_m_snakemake(run_snakemake, tmp_path, monkeypatch):
    """The fixture's runs, each forked from one process that has imported Snakemake (helpers/snakemake_server.py),
    answer as `python -m snakemake` started afresh, in the caller's directory and environment at the call: the
    same return code, and the same paragraphs of output and errors (the jobs, each with its job ID) but for their
    times and workflow ID. Their order may differ: Snakemake lists the jobs of a dry run in an order that depends
    on where in memory they are. A run past its timeout raises as `subprocess.run` does, and the next is answered."""
    shutil.copy(ROOT / "config" / "config.yaml", tmp_path / "config.yaml")
    plan = ["-n", "-p", "--forceall", "--configfile", "config.yaml", "--directory", tmp_path]
    bad = ["--cores", "1", "--configfile", "config.yaml", "--config", "drift={steps: -5}", "--directory", tmp_path]
    answers = []
    for case in (plan, bad):
        if case is bad:  # set after the server started: each run takes the caller's environment
            monkeypatch.setenv("SNAKEMAKE_PROFILE", str(ROOT / "slurm"))
        forked = run_snakemake(*case, cwd=tmp_path)
        fresh = subprocess.run(
            snakemake_command(*case), cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False
        )
        assert forked.returncode == fresh.returncode and paragraphs(forked.stdout) == paragraphs(fresh.stdout)
        assert paragraphs(forked.stderr) == paragraphs(fresh.stderr)
        answers.append(forked)
    assert (
        answers[0].returncode == 0
        and "rule drift" in answers[0].stdout
        and f"Run directory: {tmp_path}" in answers[0].stdout
    )
    assert answers[1].returncode == 1 and "drift.steps" in answers[1].stderr and not (tmp_path / "results").exists()
    assert f"Using profile {ROOT / 'slurm'}" in answers[1].stderr and "Using profile" not in answers[0].stderr
    with pytest.raises(subprocess.TimeoutExpired):
        run_snakemake("-n", "--configfile", ROOT / "config" / "paper.yaml", "--directory", tmp_path, timeout=0.2)
    assert (
        run_snakemake("--version").stdout
        == subprocess.run(snakemake_command("--version"), capture_output=True, text=True, check=True).stdout
    )


def paragraphs(output: str) -> list[str]:
    """Snakemake's output as its sorted paragraphs, without what differs between any two runs: the header's date
    and workflow ID, and the time of each job."""
    output = re.sub(r"(?m)^  (Date|Workflow ID): .*\n", "", output)
    output = re.sub(r"(?m)^\[\w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4}\]\n", "", output)
    return sorted(paragraph.strip() for paragraph in output.split("\n\n"))


def test_slurm_profile_dry_run(run_snakemake, tmp_path):
    """`--profile slurm` resolves from the repository root and its keys are accepted."""
    result = run_snakemake(
        "-n", "--profile", "slurm", "--configfile", ROOT / "config" / "paper.yaml", "--directory", tmp_path, cwd=ROOT
    )
    # The Slurm executor needs sbatch only when submitting; a dry run must parse the profile.
    assert result.returncode == 0, result.stderr + result.stdout
    # export_hf asks for at least what its model needs: the fp32 model read and safetensors' copy of it as it
    # writes (the model's parameters counted on the meta device, Llama 3's vocabulary: the tier's tokenizer)
    paper = load_config(ROOT / "config" / "paper.yaml")
    public = [d for d in paper["analysis"]["public_models"].values() if d]
    with torch.device("meta"):
        model = Transformer(ModelArgs.from_config(paper["model"], "skinny-tall", 128256))
    (job,) = [j for j in (result.stdout + result.stderr).split("\n\n") if "rule export_hf:" in j]
    assert public == ["results/hf/skinny-tall-baseline"] and "wildcards: run=skinny-tall-baseline" in job
    mem_mb = int(re.search(r"resources: .*\bmem_mb=(\d+)", job).group(1))
    assert mem_mb * 10**6 >= 2 * 4 * count_params(model) + 10**9


def test_bad_config_stops_before_any_job(run_snakemake, tmp_path):
    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    config["drift"]["steps"] = -5
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(config))
    result = run_snakemake("--cores", "1", "--configfile", path, "--directory", tmp_path)
    assert result.returncode != 0
    out = result.stderr + result.stdout
    assert "steps" in out and "minimum" in out
    assert not (tmp_path / "results").exists()


def test_runs_that_cannot_be_trained_stop_a_dry_run(run_snakemake, tmp_path):
    """The cross-key check (streamback.runs.check_runs) runs before any job: `snakemake -n` fails,
    naming each problem, in a few lines (no traceback, no job list)."""
    bad = {
        "model": {"shapes": {"tiny-medium": {"n_layers": 2, "dim": 12, "n_heads": 8, "n_kv_heads": 3}}},
        "train": {"batch_size": 6, "seq_len": 4096, "schedule": {"warmup_steps": 40, "decay_steps": 40}},
    }
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(bad))
    result = run_snakemake("-n", "--directory", tmp_path, "--configfile", tmp_path / "bad.yaml")
    out = result.stderr + result.stdout
    assert result.returncode != 0
    for words in [
        "model.shapes.tiny-medium: n_heads (8) must be a multiple of n_kv_heads (3)",
        "model.shapes.tiny-medium: head_dim = dim // n_heads = 12 // 8 = 1 is too small",
        "train.seq_len (4096) exceeds model.max_seq_len (2048)",
        "warmup_steps (40) + decay_steps (40) exceed the run's",
        "train.batch_size (6) must be a multiple of micro_batch_size (4) x processes (1)",
    ]:
        assert words in out, words
    assert f"config/config.yaml merged with {tmp_path / 'bad.yaml'}" in out
    assert len(out.splitlines()) < 12 and "Traceback" not in out and "rule " not in out


def test_an_invalid_yaml_config_is_named_with_its_line(run_snakemake, tmp_path):
    """Snakemake's own message for invalid YAML names neither file nor line; the Snakefile reads its
    config file first. (A --configfile is read by Snakemake before the Snakefile runs: `streamback
    check FILE` names its line, tested in test_cli.py.)"""
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "workflow", repo / "workflow")
    shutil.copytree(ROOT / "config", repo / "config")
    shutil.copy(ROOT / "Snakefile", repo / "Snakefile")
    lines = (repo / "config" / "config.yaml").read_text().splitlines()
    at = lines.index("drift:") + 2
    lines[at] = "\t" + lines[at].lstrip()  # indented with a tab
    (repo / "config" / "config.yaml").write_text("\n".join(lines) + "\n")
    cmd = [sys.executable, "-m", "snakemake", "-s", str(repo / "Snakefile"), "-n", "--directory", str(tmp_path)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    out = result.stderr + result.stdout
    assert result.returncode != 0
    assert f"config file {repo / 'config' / 'config.yaml'}, line {at + 1}, column 1 is not valid YAML" in out, out
    assert len(out.splitlines()) < 5


def test_override_file_merges_over_the_default(run_snakemake, tmp_path):
    """`--configfile small.yaml` updates config/config.yaml key by key (docs/rerunning.md's advice)."""
    small = tmp_path / "small.yaml"
    small.write_text("drift: {steps: 0}\n")
    result = run_snakemake("-n", "--directory", tmp_path, "--configfile", small)
    assert result.returncode != 0
    out = result.stderr + result.stdout
    assert "steps" in out and "minimum" in out
    small.write_text("drift: {steps: 5}\n")
    result = run_snakemake("-n", "--directory", tmp_path, "--configfile", small)
    assert result.returncode == 0, result.stderr


def test_every_rule_declares_log_threads_resources_and_env():
    """House rule for rule files: a `log:`, `threads`, `resources` and a conda env on every rule."""
    import re

    for smk in sorted((ROOT / "workflow" / "rules").glob("*.smk")):
        blocks = re.split(r"^rule (\w+):\n", smk.read_text(), flags=re.M)[1:]
        for name, body in zip(blocks[::2], blocks[1::2]):
            body = body.split("\n\n\n")[0]  # the rule's own block, up to the next top-level statement
            for keyword in ("log:", "threads:", "resources:", "conda:", "shell:"):
                assert f"\n    {keyword}" in "\n" + body, f"{smk.name}: rule {name} lacks {keyword}"


def test_a_failed_job_shows_the_end_of_its_log(run_snakemake, tmp_path):
    """Not only Snakemake's "check log file(s)": the job prints its log's last lines, the CLI's error last."""
    (tmp_path / "held-in.yaml").write_text(
        "eval: {local: {seed: 0}}\n"
    )  # the corpus's own seed: refused when the job runs
    result = run_snakemake(
        "--cores",
        "1",
        layout.eval_task_file("streamback_cloze"),
        "--directory",
        tmp_path,
        "--configfile",
        tmp_path / "held-in.yaml",
    )
    out = result.stdout + result.stderr
    assert result.returncode != 0
    assert (
        "--- the end of logs/eval/tasks.log:\nstreamback eval-tasks: error: eval.local.seed 0 is the training corpus's "
        "seed" in out
    ), out[-3000:]


def test_lint_finds_nothing(run_snakemake, tmp_path):
    result = run_snakemake("--lint", "--directory", tmp_path)
    out = result.stdout + result.stderr
    assert result.returncode == 0 and "Congratulations, your workflow is in a good condition!" in out, out[-3000:]


# ---- reruns: what a changed setting reruns -------------------------------------------------------

MEDIUM_RUNS = [
    name
    for name, spec in run_matrix(load_config(ROOT / "config" / "config.yaml")["train"]).items()
    if spec.shape == "tiny-medium"
]
DOWNSTREAM_OF_TRAIN = {
    "training_curves",
    "analyze_layer_error",
    "analyze_envelope",
    "analyze_swallowed",
    "analyze_loss_difference",
    "benchmark_table",
    "seed_variance",
    "depth",
}
PUBLIC_OF_TRAIN = {
    "export_hf",
    "analyze_public",
}  # downstream of the one run the default exports (tiny-skinny-tall-baseline)


def _touched_study(run_snakemake, directory, *config):
    """Every output of the study exists and Snakemake's records say it was made with this config
    (`snakemake --touch --forceall`: the params of every job are recorded as a real run records
    them), without running a job."""
    listing = run_snakemake("--detailed-summary", "--directory", directory, *config)
    assert listing.returncode == 0, listing.stderr[-3000:]
    for line in listing.stdout.splitlines()[1:]:
        path = directory / line.split("\t")[0]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    touched = run_snakemake("--touch", "--forceall", "--cores", "1", "--directory", directory, *config)
    assert touched.returncode == 0, touched.stderr[-3000:]
    return directory


@pytest.fixture(scope="module")
def touched_default(run_snakemake, tmp_path_factory):
    return _touched_study(run_snakemake, tmp_path_factory.mktemp("touched-default"))


def planned_jobs(run_snakemake, directory, change: dict | None, *config) -> dict:
    """{(rule, run wildcard or None): reason} of every job `snakemake -n` plans once `change` is
    merged over the config (`--configfile`), from Snakemake's own dry-run output."""
    path = directory / "change.yaml"
    path.write_text(yaml.safe_dump(change))
    with_change = [*(config or ["--configfile"]), path] if change is not None else list(config)
    result = run_snakemake("-n", "--directory", directory, *with_change)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-3000:]
    jobs = {}
    for block in re.split(r"\n(?=(?:local)?rule \w+:\n)", out)[1:]:
        rule = re.match(r"(?:local)?rule (\w+):", block).group(1)
        run = re.search(r"^    wildcards: run=(\S+)$", block, re.MULTILINE)
        jobs[rule, run and run.group(1)] = re.search(r"^    reason: (.*)$", block, re.MULTILINE).group(1)
    return jobs


def rules_of(jobs: dict) -> set[str]:
    return {rule for rule, _ in jobs}


@pytest.mark.slow
def test_editing_one_shape_reruns_only_its_runs_and_what_reads_them(run_snakemake, touched_default):
    """A new width of KV heads for tiny-medium (and a new shape no run uses): the tiny-medium runs
    (every seed and stream) train again because their params changed, their evaluations and the tables over all runs
    follow because their inputs change; no other run, nothing of data or drift. The study page
    reruns on any change: it prints the merged config's hash, so its params are the whole config."""
    assert planned_jobs(run_snakemake, touched_default, None) == {}  # as recorded: nothing to do
    shapes = {
        "tiny-medium": {"n_layers": 4, "dim": 96, "n_heads": 4, "n_kv_heads": 2, "multiple_of": 32},
        "unused": {"n_layers": 1, "dim": 8, "n_heads": 2, "n_kv_heads": 1},
    }
    jobs = planned_jobs(run_snakemake, touched_default, {"model": {"shapes": shapes}})
    assert {run for rule, run in jobs if rule == "train"} == set(MEDIUM_RUNS)
    assert {run for rule, run in jobs if rule == "evaluate"} == set(MEDIUM_RUNS)
    assert {run for rule, run in jobs if rule == "train_recipe"} == set(MEDIUM_RUNS)
    # the tiny-medium arms' preflights too (their recipe is theirs), and so the preflights' table
    assert rules_of(jobs) == {
        "train_recipe",
        "preflight_run",
        "preflight",
        "train",
        "evaluate",
        *DOWNSTREAM_OF_TRAIN,
        "study_report",
        "all",
    }
    for (rule, run), reason in jobs.items():
        expected = (
            "Params have changed" if rule in ("preflight_run", "train_recipe") else "Input files updated by another job"
        )
        assert reason.startswith(expected), (rule, run, reason)
        if rule == "train":  # through its recipe (its gates are ancient: a rerun preflight alone retrains nothing)
            assert f"results/runs/{run}/recipe.json" in reason, (run, reason)


@pytest.mark.slow
def test_a_budget_gates_training_and_one_arm_changed_retrains_that_arm_alone(run_snakemake, touched_default):
    """A budget set and one shape edited in one call: every preflight reruns (each checks the budget),
    the table now writes the matrix's gate (rule preflight_unbounded did), and only the edited shape's
    runs train again, through their recipes; no other run's training reruns for its preflight or the table."""
    medium = {"tiny-medium": {"n_layers": 4, "dim": 96, "n_heads": 4, "n_kv_heads": 2, "multiple_of": 32}}
    jobs = planned_jobs(
        run_snakemake, touched_default, {"train": {"budget_gpu_hours": 50.0}, "model": {"shapes": medium}}
    )
    assert {run for rule, run in jobs if rule == "train"} == set(MEDIUM_RUNS)
    assert {rule for rule, _ in jobs} >= {"preflight_run", "preflight", "train_recipe", "train"}
    assert "preflight_unbounded" not in rules_of(jobs)
    for (rule, run), reason in jobs.items():
        if rule == "train":
            assert f"results/runs/{run}/recipe.json" in reason, (run, reason)


@pytest.mark.slow
def test_adding_a_seed_trains_only_its_runs(run_snakemake, touched_default):
    """One more training seed: its six runs train and are evaluated; no run of the seeds already
    trained reruns, only the tables and figures over every run."""
    jobs = planned_jobs(run_snakemake, touched_default, {"train": {"runs": {"seeds": [0, 1, 2, 3]}}})
    new = {
        f"{shape}-{block}-seed3"
        for shape in ("tiny-skinny-tall", "tiny-medium", "tiny-fat-short")
        for block in ("baseline", "streamback")
    }
    assert {run for rule, run in jobs if rule == "train"} == new
    assert {run for rule, run in jobs if rule == "evaluate"} == new
    assert {run for rule, run in jobs if rule == "train_recipe"} == new
    # no arm is new, so no preflight reruns; the preflights' table counts the new runs in the matrix's cost (the
    # new runs wait for it; the others' training takes its verdict as ancient and reruns not)
    assert rules_of(jobs) == {
        "preflight",
        "train_recipe",
        "train",
        "evaluate",
        *DOWNSTREAM_OF_TRAIN,
        "study_report",
        "all",
    }
    for (rule, run), reason in jobs.items():
        if rule in ("train", "evaluate", "train_recipe"):
            assert reason.startswith("Missing output files"), (rule, run, reason)


@pytest.mark.slow
@pytest.mark.parametrize(
    "change, rules",
    [
        ({"drift": {"seeds": [0, 1], "settings": [{"mu": 0.2, "sigma": 0.5}]}}, {"drift"}),
        ({"eval": {"pairs": {"resamples": 500}}}, {"benchmark_table", "seed_variance"}),
        (
            {"analysis": {"variants": ["bf16", "fp32"]}},
            {"analyze_layer_error", "analyze_swallowed", "analyze_public", "depth"},
        ),
        (
            {"train": {"optimizer": {"lr": 2e-3}}},
            {"train_recipe", "preflight_run", "preflight", "train", "evaluate", *DOWNSTREAM_OF_TRAIN, *PUBLIC_OF_TRAIN},
        ),
        # how jobs run, not what they compute: nothing but the preflights, which check the runs as they
        # are run, and the study page (whose params are the whole config); the train jobs wait for the
        # preflights' verdicts, not their records, so no training reruns
        (
            {
                "train": {
                    "compile": True,
                    "micro_batch_size": 2,
                    "checkpoint": {"every": 5, "resume_on_other_kernels": True},
                    "resources": {"threads": 2, "mem_mb": 4000},
                    "preflight": {"runtime": 45},
                    "log": {"tensorboard": False, "wandb": {"project": "p", "mode": "offline"}},
                    "per_run": {"tiny-medium-baseline": {"activation_checkpointing": True}},
                },
                "data": {"processes": 1, "batch_documents": 64},
                "eval": {"resources": {"mem_mb": 999}},
                "cpu_bf16": "emulated",
            },
            {"preflight_run", "preflight"},
        ),
        # a budget (and the tiers table's cost): the preflights check it, no training reruns
        ({"train": {"budget_gpu_hours": 1000.0, "stated_gpu_hours": 900.0}}, {"preflight_run", "preflight"}),
    ],
    ids=["drift-grid", "eval-pairs", "analysis-variants", "recipe", "execution", "budget"],
)
def test_a_changed_setting_reruns_the_jobs_that_read_it(run_snakemake, touched_default, change, rules):
    jobs = planned_jobs(run_snakemake, touched_default, change)
    assert rules_of(jobs) == rules | {"study_report", "all"}
    for (rule, run), reason in jobs.items():
        if rule in rules - DOWNSTREAM_OF_TRAIN - PUBLIC_OF_TRAIN - {"evaluate", "preflight", "train"}:
            assert reason.startswith("Params have changed"), (rule, run, reason)
        if rule == "train":  # its recipe, never its preflight's verdict
            assert reason.startswith("Input files updated by another job") and "recipe.json" in reason, (run, reason)


@pytest.mark.slow
def test_last_checkpoints_reruns_the_runs_for_their_earlier_models_and_no_preflight(run_snakemake, touched_default):
    """eval.last_checkpoints 3: every train job has two outputs more (its earlier models), so it
    reruns (resuming from a checkpoint before them) and everything after it; no preflight run reads an eval key.
    The preflight table (rule preflight) does: its check of the matrix's disk counts those earlier models."""
    jobs = planned_jobs(run_snakemake, touched_default, {"eval": {"last_checkpoints": 3, "checkpoint_spacing": 5}})
    assert rules_of(jobs) == {
        "train",
        "evaluate",
        "preflight",
        *DOWNSTREAM_OF_TRAIN,
        *PUBLIC_OF_TRAIN,
        "study_report",
        "all",
    }
    assert jobs[("preflight", None)].startswith("Params have changed"), jobs[("preflight", None)]
    earliest = train_steps(load_config(ROOT / "config" / "config.yaml")["train"]) - 2 * 5  # (k - 1) x spacing back
    for (rule, run), reason in jobs.items():
        if rule == "train":
            assert reason.startswith("Missing output files"), (run, reason)
            assert f"/last/step_{earliest:09d}.pt" in reason, (run, reason)


@pytest.mark.slow
def test_the_paper_runs_ignore_the_tiny_shapes_merged_under_them(run_snakemake, tmp_path):
    """config/paper.yaml is merged over config/config.yaml, whose tiny shapes stay in `model`:
    editing one reruns no paper job."""
    paper = ["--configfile", ROOT / "config" / "paper.yaml"]
    touched = _touched_study(run_snakemake, tmp_path, *paper)
    change = {"model": {"shapes": {"tiny-medium": {"n_layers": 3, "dim": 96, "n_heads": 4, "n_kv_heads": 1}}}}
    jobs = planned_jobs(run_snakemake, touched, change, *paper)
    assert rules_of(jobs) == {"study_report", "all"}, jobs


def test_a_rules_retries_of_0_means_no_retry_whatever_the_profile_says(tmp_path):
    """Why train.smk passes train.resources.retries 0 as no `retries` at all (the schema's "0: the profile's"):
    Snakemake (Rule.restart_times) takes a rule's own `retries` over --retries (the Slurm profile's), so a
    rule's 0 means none; a rule without one takes --retries."""
    (tmp_path / "Snakefile").write_text(
        "rule all:\n    input: 'zero.done', 'unset.done'\n\n"
        "rule zero:\n    output: 'zero.done'\n    retries: 0\n    shell: 'echo x >> zero.tries; exit 1'\n\n"
        "rule unset:\n    output: 'unset.done'\n    shell: 'echo x >> unset.tries; exit 1'\n"
    )
    cmd = [sys.executable, "-m", "snakemake", "-s", "Snakefile", "--cores", "1", "--retries", "2", "--keep-going"]
    result = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode != 0
    assert (tmp_path / "zero.tries").read_text().count("x") == 1, result.stderr[-2000:]
    assert (tmp_path / "unset.tries").read_text().count("x") == 3
