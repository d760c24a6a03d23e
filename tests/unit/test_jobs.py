"""streamback/jobs.py: what each job is given resolves to what the whole config says (a job reads
the same run, model, recipe and execution as `--config FILE` would), and holds nothing of other
jobs (another shape, another run's overrides, another stage's section)."""

import pytest

from streamback import jobs
from streamback.config import load_config, merge_config, validate_config
from streamback.model.model import ModelArgs
from streamback.runs import check_runs, is_reversible, run_matrix, run_setting

from conftest import ROOT

DEFAULT = load_config(ROOT / "config" / "config.yaml")
PAPER = validate_config(merge_config(DEFAULT, load_config(ROOT / "config" / "paper.yaml")))


def given(settings: dict, execution: dict | None = None) -> dict:
    """The sections a job's CLI validates from its --params (and --execution)."""
    return validate_config(merge_config(settings, execution or {}))


@pytest.mark.parametrize("config", [DEFAULT, PAPER], ids=["default", "paper"])
def test_a_train_job_resolves_to_its_run_as_the_whole_config_does(config):
    whole = config["train"]
    for run, spec in run_matrix(whole).items():
        job = given(jobs.train(config, run), jobs.train_execution(config, run))
        train, model = job["train"], job["model"]
        assert run_matrix(train) == {run: spec}  # the matrix of this run alone
        check_runs(train, model, only=run)
        for key in ("micro_batch_size", "activation_checkpointing", "compile"):
            assert run_setting(train, run, key) == run_setting(whole, run, key), (run, key)
        for key in (
            "seed",
            "tokens",
            "seq_len",
            "batch_size",
            "optimizer",
            "schedule",
            "log",
            "checkpoint",
            "repeat_data",
        ):
            assert train[key] == whole[key], (run, key)
        assert is_reversible(train, spec) == is_reversible(whole, spec)
        args = ModelArgs.from_config(model, spec.shape, 1000, block=spec.block, stream=spec.stream)
        assert args == ModelArgs.from_config(config["model"], spec.shape, 1000, block=spec.block, stream=spec.stream)
        assert list(model["shapes"]) == [spec.shape]


def test_a_train_job_holds_nothing_of_other_runs_or_how_it_runs():
    run = "tiny-medium-baseline"
    before = jobs.train(DEFAULT, run)
    changed = merge_config(
        DEFAULT,
        {
            "model": {
                "shapes": {
                    "tiny-fat-short": {"n_layers": 3, "dim": 128, "n_heads": 4, "n_kv_heads": 1},
                    "new": {"n_layers": 1, "dim": 8, "n_heads": 2, "n_kv_heads": 1},
                }
            },
            "train": {
                "runs": {"shapes": ["tiny-medium", "new"], "streams": ["fp16"]},
                "per_run": {"tiny-medium-streamback": {"compile": True}},
                "micro_batch_size": 8,
                "compile": True,
                "checkpoint": {"every": 7},
                "resources": {"gpus": 8, "threads": 4},
                "reversible": True,
                "log": {"tensorboard": False},
            },  # reversible: applies to fp32 StreamBack runs only
            "drift": {"steps": 10},
            "eval": {"batch_size": 3},
            "analysis": {"seed": 4},
        },
    )
    assert jobs.train(changed, run) == before
    assert jobs.train_execution(changed, run)["train"] == {
        "micro_batch_size": 8,
        "compile": True,
        "activation_checkpointing": False,
        "checkpoint": {"every": 7, "keep": 2, "resume_on_other_kernels": False},
        "log": {"tensorboard": False, "wandb": {"project": None, "entity": None, "mode": "online"}},
    }
    assert jobs.train(changed, "tiny-medium-streamback")["train"]["reversible"] is True
    lr = merge_config(DEFAULT, {"train": {"optimizer": {"lr": 1e-3}}})
    assert jobs.train(lr, run)["train"]["optimizer"]["lr"] == 1e-3


def test_every_other_job_gets_only_the_keys_it_reads():
    tokenize = jobs.tokenize(DEFAULT)["data"]
    assert not set(tokenize) & {"processes", "batch_documents", "mem_mb", "runtime", "corpus", "dir", "hub"}
    assert "files" not in tokenize["local"] and tokenize["synthetic"] == DEFAULT["data"]["synthetic"]
    assert jobs.tokenize_execution(DEFAULT) == {
        "data": {"batch_documents": DEFAULT["data"]["batch_documents"], "budget_check": DEFAULT["data"]["budget_check"]}
    }
    assert jobs.corpus(DEFAULT) == {"data": {"synthetic": DEFAULT["data"]["synthetic"]}}
    assert set(jobs.evaluate(DEFAULT)["eval"]) == {
        "tasks",
        "include_path",
        "batch_size",
        "max_length",
        "bootstrap_iters",
    }
    assert jobs.eval_tasks(PAPER)["eval"]["tasks"] == []  # the paper's tasks are lm-eval's own
    # eval.last_checkpoints only where it is over 1: the default's benchmark_table params are as before the key
    assert set(jobs.benchmark_table(DEFAULT)["eval"]) == {"tasks", "pairs"}
    assert jobs.benchmark_table(PAPER)["eval"]["last_checkpoints"] == PAPER["eval"]["last_checkpoints"] == 3
    for kind, keys in jobs.ANALYSIS_SETTINGS.items():
        job = jobs.analysis(DEFAULT, kind)
        if kind == "public":  # no run of the matrix: adding a seed reruns nothing of it
            assert set(job["analysis"]) == set(keys) and job["train"] == {}
            continue
        assert set(job["analysis"]) == set(keys) and run_matrix(given(job)["train"]) == run_matrix(DEFAULT["train"])
        assert given(job)["train"]["seq_len"] == DEFAULT["train"]["seq_len"]
    loss = given(jobs.analysis(DEFAULT, "loss-difference"))["train"]
    assert loss["log"]["val_sequences"] == DEFAULT["train"]["log"]["val_sequences"]
    assert (
        "log" not in jobs.analysis(merge_config(DEFAULT, {"analysis": {"loss_windows": 8}}), "loss-difference")["train"]
    )
    assert set(jobs.benchmark_table(DEFAULT)["eval"]) == {"tasks", "pairs"}
    for job in (jobs.training_curves(DEFAULT), jobs.benchmark_table(DEFAULT), jobs.seed_variance(DEFAULT)):
        assert job["train"] == {"runs": DEFAULT["train"]["runs"], "seed": DEFAULT["train"]["seed"]}


def test_what_the_rules_pass_is_what_the_stage_validates():
    """Every job's sections pass the schema (the CLI's validation) as they are."""
    for job in (
        jobs.corpus(DEFAULT),
        jobs.tokenize(DEFAULT),
        jobs.drift(DEFAULT),
        jobs.eval_tasks(DEFAULT),
        jobs.evaluate(DEFAULT),
        jobs.benchmark_table(DEFAULT),
        jobs.training_curves(DEFAULT),
        jobs.seed_variance(DEFAULT),
        jobs.depth(DEFAULT),
        jobs.depth(PAPER),
        *(jobs.analysis(PAPER, kind) for kind in jobs.ANALYSIS_SETTINGS),
        jobs.train(PAPER, "medium-streamback"),
    ):
        given(job)  # StreambackError on a key the schema does not allow


def test_a_preflight_s_runtime_is_its_job_s_resource_not_a_setting_it_checks():
    """train.preflight.runtime sizes the preflight's Slurm job (common.smk's preflight_runtime): it is
    not in the preflight's params, so changing it reruns no preflight; its steps are."""
    base = load_config(ROOT / "config" / "config.yaml")
    arm = next(iter(jobs.preflight_arms(base)))
    timed = merge_config(base, {"train": {"preflight": {"runtime": 45}}})
    assert validate_config(timed)["train"]["preflight"]["runtime"] == 45
    assert base["train"]["preflight"]["runtime"] is None  # the default: sized from its steps
    assert jobs.preflight(validate_config(timed), arm) == jobs.preflight(base, arm)
    longer = validate_config(merge_config(base, {"train": {"preflight": {"steps": 8}}}))
    assert jobs.preflight(longer, arm)["train"]["preflight"] == {"steps": 8}


def test_a_train_job_s_signal_lead_is_twice_its_preflight_s_step_and_save_plus_the_slack():
    record = {
        "checks": [
            {"name": "speed", "values": {"tokens_per_s": 1.0}},
            {"name": "resume", "values": {"loss_diff": 0.0, "save_s": 41.2, "step_s": 3.9}},
        ]
    }
    # by hand: 2 x (41.2 + 3.9) = 90.2 s, rounded up to 91, plus the 30 s of slack
    assert jobs.signal_lead({"signal_lead": None}, record) == 121
    assert jobs.signal_lead({"signal_lead": 600}, record) == 600  # the config's own
    assert jobs.signal_lead({}, None) == jobs.signal_lead({}, {"checks": [{"name": "resume", "values": {}}]}) == 300
    huge = {"checks": [{"name": "resume", "values": {"save_s": 1e6, "step_s": 1.0}}]}
    assert jobs.signal_lead({}, huge) == 65535  # the most sbatch --signal takes
