"""`streamback training-curves`: the table equals the runs' metrics.jsonl; figures are written; a run
that was not trained is named."""

import json

import pandas as pd
import pytest

from streamback import layout
from streamback.cli import main
from streamback.config import validate_config
from streamback.train.curves import curves_table, loss_chart

TRAIN = {"runs": {"shapes": ["tiny-fat-short"], "blocks": ["baseline", "streamback"], "streams": []}}
RUNS = ["tiny-fat-short-baseline", "tiny-fat-short-streamback"]


def write_metrics(run, records):
    path = layout.metrics_file(run)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def records(offset):
    return [
        {
            "step": s,
            "tokens": 2048 * s,
            "loss": 5.0 - s / 10 + offset,
            "lr": 1e-3,
            "grad_norm": 0.5 + s / 100,
            "tokens_per_s": 1000.0,
            "elapsed_s": float(s),
            **({"val_loss": 4.5 - s / 10} if s % 2 == 0 else {}),
        }
        for s in range(1, 5)
    ]


def test_training_curves_table_and_figures(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_metrics(RUNS[0], records(0.0))
    write_metrics(RUNS[1], records(0.25))
    table = curves_table(validate_config({"train": TRAIN})["train"], RUNS)
    assert list(table.columns) == [
        "run",
        "shape",
        "block",
        "stream",
        "seed",
        "step",
        "tokens",
        "loss",
        "val_loss",
        "grad_norm",
        "lr",
    ]
    assert table.groupby("run").stream.first().to_dict() == {RUNS[0]: "bf16", RUNS[1]: "fp32"}
    streamback = table[table.run == RUNS[1]]
    # derived: 5.0 - s / 10 + offset in fp64 against its decimals: a few 2^-53 (approx's default 1e-6)
    assert streamback.loss.tolist() == pytest.approx(
        [5.15, 5.05, 4.95, 4.85]
    ) and streamback.val_loss.isna().tolist() == [True, False, True, False]
    spec = loss_chart(table).to_dict()
    assert spec["facet"]["column"]["field"] == "shape" and len(spec["datasets"][spec["data"]["name"]]) == 8

    assert main(["training-curves", "--params", json.dumps(TRAIN), "--runs", *RUNS]) == 0
    # exact up to the CSV's decimal round trip
    assert pd.read_csv(layout.table(layout.TRAINING_TABLE)).loss.tolist() == pytest.approx(table.loss.tolist())
    for name in layout.TRAINING_FIGURES:
        assert layout.figure(name, "svg").read_text().lstrip().startswith("<svg")
        assert layout.figure(name, "png").read_bytes()[:4] == b"\x89PNG"


def test_an_untrained_run_is_named(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    write_metrics(RUNS[0], records(0.0))
    assert main(["training-curves", "--params", json.dumps(TRAIN), "--runs", *RUNS]) == 2
    assert f"results/runs/{RUNS[1]}/metrics.jsonl does not exist" in capsys.readouterr().err
    assert main(["training-curves", "--params", json.dumps(TRAIN), "--runs", "nope"]) == 2
    assert "runs not in the train.runs matrix: nope" in capsys.readouterr().err
