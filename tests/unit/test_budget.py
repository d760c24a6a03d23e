"""The budget check and tokenize by file, on parquet files in FineWeb's schema and layout
(`sample/<n>BT/*.parquet` under a README.md naming the config, read as `data.source: hub` from a
local copy): the estimate against the real token counts, its interval's coverage, a refused
budget, a lowered budget keeping its shards, a killed run resuming without reading a finished
file again."""

import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from streamback.config import validate_config
from streamback.data import budget
from streamback.data import tokenize as tokenize_module
from streamback.data import tokenizer as tk
from streamback.data.corpus import corpus_table
from streamback.data.shards import TokenDataset, read_header
from streamback.data.tokenize import tokenize
from streamback.errors import StreambackError

from helpers.data import SHARD

FILES, PER_FILE, GROUP = 6, 100, 25  # documents per file and per row group: 24 row groups


def shard_bytes(data_dir) -> dict:
    return {p.name: p.read_bytes() for p in sorted(data_dir.glob("*.bin"))}


@pytest.fixture(scope="module")
def fineweb(tmp_path_factory):
    """A FineWeb-shaped repository of 6 files x 100 documents, and a BPE trained on it."""
    repo = tmp_path_factory.mktemp("fineweb")
    folder = repo / "sample" / "10BT"
    folder.mkdir(parents=True)
    texts = []
    for k in range(FILES):
        table = corpus_table(5, k * PER_FILE, (k + 1) * PER_FILE, f"s3://commoncrawl/crawl-data/{k}.warc.gz")
        pq.write_table(table, folder / f"{k:03d}_00000.parquet", row_group_size=GROUP)
        texts += table.column("text").to_pylist()
    (repo / "README.md").write_text(
        "---\nconfigs:\n- config_name: sample-10BT\n  data_files:\n  - split: train\n    path: sample/10BT/*\n---\n"
    )
    tokenizer = tk.train_bpe(texts, 500)
    tokenizer.save(str(repo / "tokenizer.json"))
    return {"repo": repo, "files": sorted(folder.glob("*.parquet")), "tokenizer": tokenizer}


def config(fineweb, **overrides) -> dict:
    data = {
        "source": "hub",
        "hub": {"dataset": str(fineweb["repo"]), "name": "sample-10BT"},
        "tokenizer": {"kind": "file", "file": str(fineweb["repo"] / "tokenizer.json")},
        "shard_tokens": SHARD,
        "val_fraction": 0.2,
        "processes": 1,
        "batch_documents": 32,
        **overrides,
    }
    return validate_config({"data": data})["data"]


@pytest.fixture(scope="module")
def full(fineweb, tmp_path_factory):
    """The whole source tokenized in one uninterrupted run."""
    out = tmp_path_factory.mktemp("full") / "tokens"
    return {"out": out, "manifest": tokenize(config(fineweb), out, progress=False)}


def test_a_census_is_exact(fineweb, full):
    """A source no larger than the sample is read whole: its counts are the shards' own."""
    found = budget.estimate(fineweb["files"], fineweb["tokenizer"], config(fineweb), 24, 25, 0.99)
    assert found.census and found.documents == FILES * PER_FILE
    for split in ("train", "val"):
        assert found.splits[split] == (full["manifest"]["splits"][split]["tokens"],) * 3


def test_the_sampled_interval_covers_the_true_count(fineweb, full):
    """Two-stage sample (4 row groups by rows, 5 documents each) against the real counts. The
    estimate is the mean of the groups' sample means, its interval their t interval (checked here
    against scipy-free arithmetic); over 200 draws at 90% confidence the interval holds the
    source's true mean in 180 +- 3 binomial sd (sd = sqrt(200 x 0.9 x 0.1) = 4.2) of them."""
    data, truth = config(fineweb), full["manifest"]["splits"]
    true_mean = (truth["train"]["tokens"] + truth["val"]["tokens"]) / (FILES * PER_FILE)
    covered = 0
    for seed in range(200):
        found = budget.estimate(fineweb["files"], fineweb["tokenizer"], data, 4, 5, 0.90, seed=seed)
        mean, low, high = found.tokens_per_document
        assert not found.census and low < mean < high and found.sampled == 20
        covered += low <= true_mean <= high
        total = found.splits["train"][0] + found.splits["val"][0]
        assert total == pytest.approx(FILES * PER_FILE * mean, rel=1e-12)  # shares 0.8 + 0.2 of N x mean
    assert 180 - 13 <= covered <= 180 + 13
    # the interval by hand for one draw: t(0.95, 3) = 2.353363 (tables), over the 4 group means
    rng = np.random.default_rng(0)
    rows = np.full(24, GROUP)
    drawn = rng.choice(24, size=4, p=rows / rows.sum())
    means = []
    for k in drawn:
        texts = pq.ParquetFile(fineweb["files"][k // 4]).read_row_group(k % 4, columns=["text"]).column(0).to_pylist()
        pick = rng.choice(GROUP, size=5, replace=False)
        means.append(np.mean([len(fineweb["tokenizer"].encode(texts[i]).ids) + 1 for i in pick]))
    found = budget.estimate(fineweb["files"], fineweb["tokenizer"], data, 4, 5, 0.90, seed=0)
    half = 2.353363 * np.std(means, ddof=1) / 2
    centre = np.mean(means)  # rel 1e-6: the table's t has 7 significant digits (error <= 5e-7 / 2.35)
    assert found.tokens_per_document == pytest.approx((centre, centre - half, centre + half), rel=1e-6)


def test_a_budget_the_source_cannot_hold_is_refused_before_any_shard(fineweb, tmp_path, monkeypatch):
    """As the one-GPU tier asked: val_tokens / val_fraction beyond the source. Refused from the
    footers and a sample, naming the key, the need, the estimate with its interval and the fixes;
    no file is read in full and nothing is written."""
    monkeypatch.setattr(tokenize_module, "read_file", lambda *a: pytest.fail("a file was read"))
    data = config(
        fineweb, val_fraction=0.01, val_tokens=2_000, budget_check={"row_groups": 8, "documents_per_group": 5}
    )
    with pytest.raises(StreambackError) as err:
        tokenize(data, tmp_path / "tokens", progress=False)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("data.val_tokens = 2,000 needs about 200,000 source tokens")
    assert f"hub dataset {fineweb['repo']} (sample-10BT, split train) holds an estimated" in message
    assert "99% interval" in message and f"{FILES * PER_FILE:,} documents (parquet footers of 6 files)" in message
    assert "lower data.val_tokens to at most" in message and "raise data.val_fraction to at least" in message
    assert "data.hub.name" in message and "data.budget_check.row_groups" in message
    assert not (tmp_path / "tokens").exists()


def test_a_lower_budget_keeps_the_shards_within_it(fineweb, full, tmp_path):
    """The budgets are not in the fingerprint: lowering one keeps every shard that lies within it
    (the same files, untouched) and writes the one it cuts; the result equals a fresh run."""
    total = full["manifest"]["splits"]["train"]["tokens"]
    out = tmp_path / "tokens"
    tokenize(config(fineweb, train_tokens=total - 10), out, progress=False)
    before = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in out.glob("train-*.bin")}
    lower = 2 * SHARD + 100
    manifest = tokenize(config(fineweb, train_tokens=lower), out, progress=False)
    after = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in out.glob("train-*.bin")}
    assert {n: after[n] for n in ("train-00000.bin", "train-00001.bin")} == {
        n: before[n] for n in ("train-00000.bin", "train-00001.bin")
    }
    assert sorted(after) == ["train-00000.bin", "train-00001.bin", "train-00002.bin"]
    fresh = tmp_path / "fresh"
    assert manifest["splits"] == tokenize(config(fineweb, train_tokens=lower), fresh, progress=False)["splits"]
    assert shard_bytes(out) == shard_bytes(fresh)
    a = TokenDataset(out, "train")
    np.testing.assert_array_equal(a.read(0, lower), TokenDataset(full["out"], "train").read(0, lower))


@pytest.mark.parametrize("processes", [1, 2])
def test_a_killed_run_resumes_by_file(fineweb, full, tmp_path, monkeypatch, processes):
    """Killed after 3 of 6 files are finished; the rerun reads none of them again (nor checks the
    budgets again) and its shards equal an uninterrupted run's, byte for byte."""
    out = tmp_path / "tokens"
    data = config(fineweb, processes=processes, train_tokens=full["manifest"]["splits"]["train"]["tokens"] - 7)
    real_add = tokenize_module.PartRecord.add

    def killed_after_three(record, index, path, counts):
        real_add(record, index, path, counts)
        if len(record.files) == 3 and index >= 2:
            raise KeyboardInterrupt("killed")

    monkeypatch.setattr(tokenize_module.PartRecord, "add", killed_after_three)
    with pytest.raises(KeyboardInterrupt):
        tokenize(data, out, progress=False)
    monkeypatch.setattr(tokenize_module.PartRecord, "add", real_add)
    record = json.loads((out / "parts" / "files.json").read_text())
    assert record["checked"] == [data["train_tokens"], None]
    kept = sorted(out.glob("*.bin"))
    assert kept and not (out / "manifest.json").exists()
    # what a resume need not read: the files before where the kept shards end, and the finished ones
    resume_at = min(read_header(p)["next_file"] for p in kept if p.name.startswith("train"))
    skipped = {str(f) for f in fineweb["files"][:resume_at]} | {v["path"] for v in record["files"].values()}
    assert len(skipped) >= 3
    log = tmp_path / "read.log"  # appended to by the (forked) workers too

    def logged_read(path, *args):
        with open(log, "a") as f:
            f.write(f"{path}\n")
        return real_read(path, *args)

    real_read = tokenize_module.read_file
    monkeypatch.setattr(tokenize_module, "read_file", logged_read)
    monkeypatch.setattr(budget, "estimate", lambda *a, **k: pytest.fail("the budgets were checked again"))
    manifest = tokenize(data, out, progress=False)
    read = log.read_text().split()
    assert read and not skipped & set(read) and len(read) == len(set(read))
    monkeypatch.undo()
    fresh = tokenize(data, tmp_path / "fresh", progress=False)
    assert shard_bytes(out) == shard_bytes(tmp_path / "fresh") and manifest["splits"] == fresh["splits"]
    assert not (out / "parts").exists()
