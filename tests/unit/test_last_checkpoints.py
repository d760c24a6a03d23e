"""eval.last_checkpoints end to end through the real code: two micro runs trained in-process write
their models at the earlier steps (and still do when resumed), one evaluate call scores the final
model and the snapshots on the local tasks with lm-eval, benchmark-table checks and gathers them,
and task_snr.csv takes its noise from them; the key's errors; the SNR against a hand computation of
signal-and-noise's definition; the page's answer when the noise is from the checkpoints."""

import hashlib
import os
import shutil

import numpy as np
import pandas as pd
import pytest
import torch

from streamback import layout, stats
from streamback.config import validate_config
from streamback.errors import StreambackError
from streamback.eval import stage, tables, taskdata
from streamback.model.weights import read_model
from streamback.report import answer, seeds
from streamback.runs import snapshot_steps
from streamback.train import trainer

from helpers.eval import MODEL, RUNS
from helpers.eval import TRAIN as EVAL_TRAIN

TRAIN = {**EVAL_TRAIN, "checkpoint": {"every": 10, "keep": 3}}  # the eval runs, every 10th step kept
EVAL = {
    "local": {"seed": 1000, "pairs": 6, "documents": 8},
    "bootstrap_iters": 100,
    "batch_size": 16,
    "last_checkpoints": 3,
    "checkpoint_spacing": 5,
}


def sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def cfg():
    return validate_config({"model": MODEL, "train": TRAIN, "eval": EVAL})


@pytest.fixture(scope="module")
def trained(cfg, tokens, tmp_path_factory):
    """Both micro runs in results/ of a working directory of their own, with the snapshots of steps 20 and 25."""
    root = tmp_path_factory.mktemp("last-checkpoints")
    torch.set_num_threads(1)
    steps = snapshot_steps(cfg["train"], cfg["eval"])
    for run in RUNS:
        assert (
            trainer.train(
                cfg["train"],
                cfg["model"],
                run,
                tokens,
                root / layout.run_dir(run),
                root / layout.checkpoint_dir(run),
                snapshot_steps=steps,
            )
            == 0
        )
    return root


def test_snapshot_steps_lie_spacing_apart_before_the_end_and_bad_ones_are_named(cfg):
    assert snapshot_steps(cfg["train"], cfg["eval"]) == [20, 25]
    assert snapshot_steps(cfg["train"], {**cfg["eval"], "last_checkpoints": 1}) == []
    with pytest.raises(
        StreambackError,
        match=r"eval.last_checkpoints \(7\) and eval.checkpoint_spacing \(5\) reach back .* 30 steps, "
        r"but a run has 30",
    ):
        snapshot_steps(cfg["train"], {**cfg["eval"], "last_checkpoints": 7})
    for key in ("last_checkpoints", "checkpoint_spacing"):
        with pytest.raises(StreambackError, match=rf"eval.{key}: 0 is less than the minimum of 1"):
            validate_config({"eval": {key: 0}})


def test_the_trainer_writes_the_snapshots_and_a_resumed_run_still_ends_with_them(cfg, tokens, trained, tmp_path):
    run = RUNS[0]
    files = {step: trained / layout.snapshot_file(run, step) for step in (20, 25)}
    assert sorted(p.name for p in (trained / layout.run_dir(run) / layout.SNAPSHOTS_DIR).iterdir()) == [
        p.name for p in files.values()
    ]
    assert [read_model(p).step for p in files.values()] == [20, 25] and read_model(
        trained / layout.model_file(run)
    ).step == 30
    first = {step: sha(p) for step, p in files.items()}
    assert first[20] != first[25]
    # a copy of the run resumed from its step-20 checkpoint (the later ones and every kept snapshot gone)
    ckpt = tmp_path / "ckpt"
    (recipe,) = layout.recipe_dirs(trained / layout.checkpoint_dir(run))
    (ckpt / recipe.name).mkdir(parents=True)
    for name in ("step_000000010", "step_000000020", layout.METRICS_FILE):  # the log is cut back to step 20 on resuming
        (shutil.copytree if name.startswith("step_") else shutil.copyfile)(recipe / name, ckpt / recipe.name / name)
    out = tmp_path / "out"
    assert trainer.train(cfg["train"], cfg["model"], run, tokens, out, ckpt, snapshot_steps=[20, 25]) == 0
    assert {
        step: sha(out / layout.SNAPSHOTS_DIR / layout.SNAPSHOT_FILE.format(step=step)) for step in (20, 25)
    } == first
    assert sha(out / layout.MODEL_FILE) == sha(trained / layout.model_file(run))


def test_a_finished_run_asked_for_an_earlier_snapshot_trains_again_from_a_checkpoint_before_it(
    cfg, tokens, trained, tmp_path
):
    """Snapshot step 12 of a run trained without it: it resumes from its step-10 checkpoint and
    ends with that snapshot and the same final model; step 5, before every kept checkpoint, is refused."""
    run = RUNS[0]
    ckpt = tmp_path / "ckpt"
    shutil.copytree(trained / layout.checkpoint_dir(run), ckpt)
    assert trainer.train(cfg["train"], cfg["model"], run, tokens, tmp_path / "out", ckpt, snapshot_steps=[12]) == 0
    assert read_model(tmp_path / "out" / layout.SNAPSHOTS_DIR / layout.SNAPSHOT_FILE.format(step=12)).step == 12
    assert sha(tmp_path / "out" / layout.MODEL_FILE) == sha(trained / layout.model_file(run))
    with pytest.raises(
        StreambackError,
        match=r"lacks the model of step\(s\) 5 that eval.last_checkpoints asks for .* keeps no "
        r"checkpoint at or before step 5 .*: delete .*recipe-",
    ):
        trainer.train(cfg["train"], cfg["model"], run, tokens, tmp_path / "out", ckpt, snapshot_steps=[5])
    with pytest.raises(
        StreambackError, match=r"--snapshot-steps 30: a snapshot step lies between 0 and the run's 30 steps"
    ):
        trainer.train(cfg["train"], cfg["model"], run, tokens, tmp_path / "out", ckpt, snapshot_steps=[30])


@pytest.fixture(scope="module")
def evaluated(cfg, tokens, trained):
    """Each run through one `stage.evaluate` call with its two snapshots, counting lm-eval's evaluations and task
    loads."""
    import lm_eval

    calls = {"simple_evaluate": 0, "load_tasks": 0}
    real_evaluate, real_load = lm_eval.simple_evaluate, stage.load_tasks

    def counted(name, real):
        def call(*args, **kwargs):
            calls[name] += 1
            return real(*args, **kwargs)

        return call

    cwd = os.getcwd()
    os.chdir(trained)
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(lm_eval, "simple_evaluate", counted("simple_evaluate", real_evaluate))
            patch.setattr(stage, "load_tasks", counted("load_tasks", real_load))
            taskdata.write_tasks(cfg["eval"]["tasks"], cfg["eval"]["local"], corpus_seed=0)
            results = {}
            for run in RUNS:
                snaps = [layout.snapshot_file(run, step) for step in snapshot_steps(cfg["train"], cfg["eval"])]
                results[run] = stage.evaluate(
                    cfg["eval"], layout.model_file(run), tokens, layout.eval_dir(run), snapshots=snaps
                )
    finally:
        os.chdir(cwd)
    return {"results": results, "calls": calls}


def test_one_evaluate_call_scores_the_final_model_and_its_snapshots(cfg, tokens, trained, evaluated, tmp_path):
    assert evaluated["calls"] == {
        "simple_evaluate": 3 * len(RUNS),
        "load_tasks": len(RUNS),
    }  # tasks loaded once per run
    run = RUNS[0]
    scores = pd.read_csv(trained / layout.eval_checkpoints(run), keep_default_na=False, na_values=[""])
    assert list(scores.columns) == ["step", "task", "filter", "metric", "value"] and sorted(scores.step.unique()) == [
        20,
        25,
        30,
    ]
    final = evaluated["results"][run]["results"]
    for row in scores[scores.step == 30].itertuples():
        # exact up to the CSV's decimal round trip: the same weights through the same evaluation
        assert row.value == pytest.approx(final[row.task][f"{row.metric},{row.filter}"], nan_ok=True)
    # a snapshot scored on the reused tasks is what evaluating it alone gives
    cwd = os.getcwd()
    os.chdir(trained)
    try:
        alone = stage.evaluate(cfg["eval"], layout.snapshot_file(run, 20), tokens, tmp_path / "alone")["results"]
        for row in scores[scores.step == 20].itertuples():
            # exact up to the CSV's decimal round trip: the same weights through the same evaluation
            assert row.value == pytest.approx(alone[row.task][f"{row.metric},{row.filter}"], nan_ok=True)
        assert (scores[scores.step == 20].value.to_numpy() != scores[scores.step == 30].value.to_numpy()).any()
        with pytest.raises(
            StreambackError, match=r"snapshot .*step_000000007.pt does not exist \(eval.last_checkpoints"
        ):
            stage.evaluate(
                cfg["eval"],
                layout.model_file(run),
                tokens,
                tmp_path / "again",
                snapshots=[layout.snapshot_file(run, 7)],
            )
        with pytest.raises(StreambackError, match=r"snapshot .*model.pt is of step 30, not an earlier step"):
            stage.evaluate(
                cfg["eval"], layout.model_file(run), tokens, tmp_path / "again", snapshots=[layout.model_file(run)]
            )
    finally:
        os.chdir(cwd)


def test_the_tables_and_task_snr_take_the_noise_from_the_last_checkpoints(cfg, trained, evaluated, monkeypatch):
    monkeypatch.chdir(trained)
    benchmarks, _, checkpoints = tables.tables(cfg["eval"], cfg["train"])
    assert (
        (benchmarks.checkpoints == 3).all()
        and set(checkpoints.run) == set(RUNS)
        and len(checkpoints) == 3 * len(benchmarks)
    )
    for row in benchmarks.itertuples():
        values = checkpoints[
            (checkpoints.run == row.run)
            & (checkpoints.task == row.task)
            & (checkpoints["filter"] == row.filter)
            & (checkpoints.metric == row.metric)
        ].value.to_numpy()
        # derived: the same formula by hand on the same floats (fp64 roundings only, within approx's default 1e-6)
        assert row.checkpoint_mean == pytest.approx(values.mean(), nan_ok=True)
        assert row.checkpoint_sd == pytest.approx(values.std(), nan_ok=True)
    snr = seeds.task_snr(cfg["train"], benchmarks, checkpoints)
    assert (snr.noise_from == "last 3 checkpoints").all() and (snr.models == 2).all()
    first = snr.iloc[0]
    chosen = checkpoints[
        (checkpoints.task == first.task)
        & (checkpoints["filter"] == first["filter"])
        & (checkpoints.metric == first.metric)
    ]
    # derived: the same formula by hand on the same floats (fp64 roundings only, within approx's default 1e-6)
    assert first.snr == pytest.approx(stats.task_snr({r: g.value.to_numpy() for r, g in chosen.groupby("run")})["snr"])
    assert list(snr.snr.dropna()) == sorted(snr.snr.dropna(), reverse=True)
    # k = 1 leaves the columns as the final model alone, and a checkpoints.csv of another k is refused
    alone, _, none = tables.tables({**cfg["eval"], "last_checkpoints": 1}, cfg["train"])
    assert (alone.checkpoints == 1).all() and alone.checkpoint_sd.isna().all() and len(none) == 0
    with pytest.raises(StreambackError, match=r"checkpoints.csv holds 3 checkpoints, eval.last_checkpoints asks for 4"):
        tables.tables({**cfg["eval"], "last_checkpoints": 4}, cfg["train"])


def test_snr_from_constructed_checkpoint_scores_is_the_references():
    """Three runs, each with three last checkpoints: signal = max |m_j - m_k| / mean m, noise = the
    pooled np.std of a run's checkpoints / the mean score, as signal-and-noise defines them."""
    train = validate_config(
        {"model": MODEL, "train": {**TRAIN, "seed": 0, "runs": {**TRAIN["runs"], "seeds": [0, 1]}}}
    )["train"]
    runs = ["micro-baseline", "micro-streamback", "micro-streamback-seed1"]
    values = {
        "clear": {runs[0]: [0.50, 0.51, 0.52], runs[1]: [0.60, 0.61, 0.62], runs[2]: [0.55, 0.56, 0.57]},
        "coin": {runs[0]: [0.40, 0.50, 0.60], runs[1]: [0.45, 0.55, 0.65], runs[2]: [0.42, 0.52, 0.62]},
    }
    rows = [
        {"run": run, "step": step, "task": task, "filter": "none", "metric": "acc", "value": v}
        for task, by_run in values.items()
        for run, scores in by_run.items()
        for step, v in zip((80, 90, 100), scores)
    ]
    snr = seeds.task_snr(train, pd.DataFrame(), pd.DataFrame(rows)).set_index("task")
    for task, by_run in values.items():
        means = np.array([np.mean(v) for v in by_run.values()])
        signal = (means.max() - means.min()) / means.mean()
        noise = np.sqrt(np.mean([np.var(v) for v in by_run.values()])) / np.mean(list(by_run.values()))
        # derived: the same formula by hand on the same floats (fp64 roundings only, within approx's default 1e-6)
        assert snr.loc[task, "signal"] == pytest.approx(signal) and snr.loc[task, "noise"] == pytest.approx(noise)
        assert snr.loc[task, "snr"] == pytest.approx(signal / noise)
    assert list(snr.index) == ["clear", "coin"] and snr.loc["clear", "can_rank"] and not snr.loc["coin", "can_rank"]
    assert (snr.noise_from == "last 3 checkpoints").all() and (snr.models == 3).all()


def test_the_answer_leads_with_the_tasks_that_can_rank_and_says_the_noise_is_the_checkpoints(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rows = [
        {
            "task": "clear",
            "filter": "none",
            "metric": "acc",
            "noise_from": "last 3 checkpoints",
            "models": 6,
            "signal": 0.2,
            "noise": 0.02,
            "snr": 10.0,
            "decision_accuracy": 0.97,
            "can_rank": True,
        },
        {
            "task": "coin",
            "filter": "none",
            "metric": "acc",
            "noise_from": "last 3 checkpoints",
            "models": 6,
            "signal": 0.02,
            "noise": 0.02,
            "snr": 1.0,
            "decision_accuracy": 0.55,
            "can_rank": False,
        },
    ]
    layout.TABLES_DIR.mkdir(parents=True)
    pd.DataFrame(rows).to_csv(layout.table(layout.TASK_SNR_TABLE), index=False)
    (text,) = answer.task_signal()
    assert text.startswith("Over the 6 runs, with each run's noise from its last 3 checkpoints")
    assert "1 of 2 task metrics can rank these models: clear acc (SNR 10.0, decision accuracy 97%)" in text
    assert text.index("clear acc") < text.index("Cannot rank at this scale (SNR below 2.77): coin acc (SNR 1.0, 55%)")
