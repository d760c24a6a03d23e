"""The tokenize stage: shards and manifest against independent references (the corpus texts,
hashlib, the tokenizer's own encode), determinism, resume, budgets, bad input, the FineWeb path;
shard verification (a changed byte, an id outside the vocabulary: named, never read)."""

import hashlib
import json
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tokenizers import Tokenizer

from streamback.config import validate_config
from streamback.data import shards as shards_module
from streamback.data import tokenize as tokenize_module
from streamback.data.corpus import corpus_table, write_part
from streamback.data.generate import generate
from streamback.data.shards import (
    HEADER_BYTES,
    TokenDataset,
    encode_header,
    read_header,
    read_manifest,
    read_record,
    token_dtype,
    write_record,
    write_shard,
)
from streamback.data.tokenize import tokenize
from streamback.errors import StreambackError

from conftest import ROOT
from helpers.data import SHARD


def config(**overrides) -> dict:
    data = {
        "shard_tokens": SHARD,
        "val_fraction": 0.2,
        "processes": 1,
        "batch_documents": 64,
        "tokenizer": {"vocab_size": 600},
        **overrides,
    }
    return validate_config({"data": data})["data"]


def is_val(key: str, fraction: float) -> bool:
    """The split rule, restated: first 8 bytes of sha256(id), big-endian, as a fraction of 2**64."""
    return int(hashlib.sha256(key.encode()).hexdigest()[:16], 16) / 2**64 < fraction


def split_documents(data_dir, split) -> list[list[int]]:
    """A split's tokens cut at the end-of-document token."""
    ds = TokenDataset(data_dir, split, verify=True)
    tokens = ds.read(0, ds.num_tokens)
    ends = np.flatnonzero(tokens == ds.eos_id)
    return [t.tolist() for t in np.split(tokens, ends + 1)[:-1]] + (
        [tokens[ends[-1] + 1 :].tolist()] if ends[-1] + 1 < tokens.size else []
    )


def shard_bytes(data_dir) -> dict:
    return {p.name: p.read_bytes() for p in sorted(data_dir.glob("*.bin"))}


def flip_bit(path, offset):
    """Change one bit of a file in place (size, and the header if offset >= HEADER_BYTES, intact)."""
    data = bytearray(path.read_bytes())
    data[offset] ^= 1
    path.write_bytes(bytes(data))


def copy_tokens(source, target):
    target.mkdir()
    for path in source.iterdir():
        (target / path.name).write_bytes(path.read_bytes())
    return target


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A 300-document synthetic corpus in two parquet files, and its full tokenization."""
    root = tmp_path_factory.mktemp("corpus")
    files = [root / "part-00000-of-00002.parquet", root / "part-00001-of-00002.parquet"]
    write_part(3, 0, 150, files[0])
    write_part(3, 150, 300, files[1])
    table = pa.concat_tables([pq.read_table(f) for f in files])
    out = root / "tokens"
    manifest = tokenize(config(), out, inputs=files, progress=False)
    return {
        "files": files,
        "texts": table.column("text").to_pylist(),
        "ids": table.column("id").to_pylist(),
        "out": out,
        "manifest": manifest,
    }


def test_shards_hold_every_document_once_in_its_split(corpus):
    manifest, out = corpus["manifest"], corpus["out"]
    tokenizer = Tokenizer.from_file(str(out / manifest["tokenizer"]["file"]))
    assert manifest["vocab_size"] == tokenizer.get_vocab_size() <= 600
    assert manifest["eos_id"] == tokenizer.token_to_id("<|endoftext|>")
    assert manifest["dtype"] == "uint16"
    assert manifest["tokenizer"]["sha256"] == hashlib.sha256((out / "tokenizer.json").read_bytes()).hexdigest()
    assert [f["sha256"] for f in manifest["source"]["files"]] == [
        hashlib.sha256(f.read_bytes()).hexdigest() for f in corpus["files"]
    ]
    for split in ("train", "val"):
        expected = [
            text for text, doc_id in zip(corpus["texts"], corpus["ids"]) if is_val(doc_id, 0.2) == (split == "val")
        ]
        docs = split_documents(out, split)
        assert [tokenizer.decode(d[:-1]) for d in docs] == expected
        assert all(d[-1] == manifest["eos_id"] for d in docs)
        assert docs[0][:-1] == tokenizer.encode(expected[0], add_special_tokens=False).ids
        entry = manifest["splits"][split]
        assert entry["documents"] == len(expected)
        assert entry["tokens"] == sum(s["tokens"] for s in entry["shards"]) == sum(map(len, docs))
    assert len(manifest["splits"]["train"]["shards"]) > 2
    assert 0.1 < manifest["splits"]["val"]["documents"] / len(corpus["texts"]) < 0.3


def test_read_crosses_shard_boundaries(corpus):
    ds = TokenDataset(corpus["out"], "train")
    raw = np.concatenate([np.fromfile(p, dtype="<u2", offset=HEADER_BYTES) for p in ds.paths]).astype(np.int64)
    assert ds.num_tokens == raw.size and ds.vocab_size == corpus["manifest"]["vocab_size"]
    for offset, length in [(0, 10), (SHARD - 3, 7), (SHARD - 1, 2 * SHARD + 5), (raw.size - 4, 4), (17, 0)]:
        window = ds.read(offset, length)
        assert window.dtype == np.int64
        np.testing.assert_array_equal(window, raw[offset : offset + length])
    with pytest.raises(ValueError):
        ds.read(raw.size - 2, 3)


def test_deterministic_and_independent_of_processes(corpus, tmp_path):
    """Same seed -> same shards byte for byte: a regenerated corpus, tokenized by 2 processes."""
    files = [tmp_path / f.name for f in corpus["files"]]
    write_part(3, 0, 150, files[0])
    write_part(3, 150, 300, files[1])
    tokenize(config(processes=2, batch_documents=16), tmp_path / "tokens", inputs=files, progress=False)
    assert shard_bytes(tmp_path / "tokens") == shard_bytes(corpus["out"])
    assert (tmp_path / "tokens" / "tokenizer.json").read_bytes() == (corpus["out"] / "tokenizer.json").read_bytes()


def test_resume_after_an_interrupted_run(corpus, tmp_path, monkeypatch):
    out = tmp_path / "tokens"
    real_write, calls, read = tokenize_module.write_shard, [], []

    def crash_after_first_val_shard(path, tokens, meta):
        calls.append(path.name)
        if calls[-2:-1] == ["val-00000.bin"]:
            raise KeyboardInterrupt("killed")
        return real_write(path, tokens, meta)

    monkeypatch.setattr(tokenize_module, "write_shard", crash_after_first_val_shard)
    with pytest.raises(KeyboardInterrupt):
        tokenize(config(), out, inputs=corpus["files"], progress=False)
    assert sorted(p.name for p in out.glob("*.bin")) == sorted(calls[:-1]) and not (out / "manifest.json").exists()
    assert not list(out.glob(".*"))  # the shard being written was not left behind
    finished = {v["path"] for v in json.loads((out / "parts" / "files.json").read_text())["files"].values()}
    assert finished  # the files encoded before the kill are recorded
    (out / ".train-00007.bin.999.tmp").write_bytes(b"left by a SIGKILL")
    monkeypatch.setattr(tokenize_module, "write_shard", real_write)
    real_read = tokenize_module.read_file
    monkeypatch.setattr(tokenize_module, "read_file", lambda path, *a: read.append(path) or real_read(path, *a))
    manifest = tokenize(config(), out, inputs=corpus["files"], progress=False)
    assert shard_bytes(out) == shard_bytes(corpus["out"])
    assert manifest["splits"] == corpus["manifest"]["splits"]
    assert not list(out.glob(".*")) and not (out / "parts").exists()
    assert not finished & set(read)  # a finished file is not read again

    # a damaged shard (right name, wrong size) is not taken as complete: it and later ones are redone
    victim = out / "train-00001.bin"
    victim.write_bytes(victim.read_bytes()[:-10])
    (out / "manifest.json").unlink()
    tokenize(config(), out, inputs=corpus["files"], progress=False)
    assert shard_bytes(out) == shard_bytes(corpus["out"])


def test_resume_keeps_only_shards_whose_tokens_match(corpus, tmp_path, capsys):
    """One changed token byte (size and header intact): the shard and those after it are written
    again, so the corruption never reaches a manifest that lists the original hash."""
    out = copy_tokens(corpus["out"], tmp_path / "tokens")
    (out / "manifest.json").unlink()  # as after a killed run
    flip_bit(out / "train-00002.bin", HEADER_BYTES + 11)
    manifest = tokenize(config(), out, inputs=corpus["files"])
    assert (
        "not resuming from train-00002.bin: the sha256 of its tokens differs from its header's"
        in capsys.readouterr().err
    )
    assert shard_bytes(out) == shard_bytes(corpus["out"]) and manifest["splits"] == corpus["manifest"]["splits"]


def test_rerun_with_a_complete_manifest_does_nothing(corpus, tmp_path, capsys):
    out = tmp_path / "tokens"
    tokenize(config(), out, inputs=corpus["files"], progress=False)
    stamp = {p.name: p.stat().st_mtime_ns for p in out.glob("*.bin")}
    tokenize(config(), out, inputs=corpus["files"], progress=False)
    assert {p.name: p.stat().st_mtime_ns for p in out.glob("*.bin")} == stamp
    # "nothing to do" only when every shard matches its sha256: a changed byte is found and repaired
    flip_bit(out / "val-00000.bin", HEADER_BYTES + 3)
    tokenize(config(), out, inputs=corpus["files"])
    err = capsys.readouterr().err
    assert f"redoing {out / 'manifest.json'}: shard {out / 'val-00000.bin'}: the sha256 of its tokens is" in err
    assert "not resuming from val-00000.bin: the sha256 of its tokens differs" in err
    assert shard_bytes(out) == shard_bytes(corpus["out"])
    # a different config does not reuse them
    tokenize(config(val_fraction=0.3), out, inputs=corpus["files"], progress=False)
    assert read_manifest(out)["splits"]["val"]["documents"] != corpus["manifest"]["splits"]["val"]["documents"]


def test_token_budgets_cut_exactly(corpus, tmp_path):
    manifest = tokenize(config(train_tokens=10_000, val_tokens=3_000), tmp_path, inputs=corpus["files"], progress=False)
    assert manifest["splits"]["train"]["tokens"] == 10_000 and manifest["splits"]["val"]["tokens"] == 3_000
    for split, n in (("train", 10_000), ("val", 3_000)):
        ds = TokenDataset(tmp_path, split)
        full = TokenDataset(corpus["out"], split)
        np.testing.assert_array_equal(ds.read(0, n), full.read(0, n))


def test_budget_larger_than_the_data(corpus, tmp_path):
    """Parquet files: refused before any work, their count being exact (the files are smaller than
    the check's sample). Other files (no footers to count): found at their end."""
    have = corpus["manifest"]["splits"]["train"]["tokens"]
    with pytest.raises(
        StreambackError, match=rf"data.train_tokens = {have + 1:,} .* holds an estimated {have:,} train"
    ):
        tokenize(config(train_tokens=have + 1), tmp_path / "tokens", inputs=corpus["files"], progress=False)
    assert not (tmp_path / "tokens").exists()
    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in corpus["texts"][:40]))
    data = config(source="local", local={"files": [str(tmp_path / "a.jsonl")]}, train_tokens=10**6)
    with pytest.raises(StreambackError, match=r"ran out after \d+ train tokens.*train_tokens asks for 1000000"):
        tokenize(data, tmp_path / "tokens", progress=False)
    assert not (tmp_path / "tokens" / "manifest.json").exists() and not list((tmp_path / "tokens").glob(".*"))
    assert all(read_header(p)["tokens"] == SHARD for p in (tmp_path / "tokens").glob("train-*.bin"))


def test_fineweb_path_offline(corpus, tmp_path):
    """A local copy of a FineWeb-shaped hub repository, read as data.source: hub."""
    repo = tmp_path / "fineweb"
    (repo / "sample" / "100BT").mkdir(parents=True)
    pq.write_table(
        corpus_table(3, 0, 300, "s3://fake/CC-MAIN.warc.gz"), repo / "sample" / "100BT" / "000_00000.parquet"
    )
    (repo / "README.md").write_text(
        "---\nconfigs:\n- config_name: sample-100BT\n  data_files:\n  - split: train\n    path: sample/100BT/*\n---\n"
    )
    data = config(
        source="hub",
        hub={"dataset": str(repo), "name": "sample-100BT"},
        tokenizer={"kind": "file", "file": str(corpus["out"] / "tokenizer.json")},
    )
    manifest = tokenize(data, tmp_path / "tokens", progress=False)
    assert manifest["source"]["kind"] == "hub" and manifest["source"]["name"] == "sample-100BT"
    assert {"path": "sample/100BT/000_00000.parquet"}.items() <= manifest["source"]["local_copy"][1].items()
    for split in ("train", "val"):
        a, b = TokenDataset(tmp_path / "tokens", split), TokenDataset(corpus["out"], split)
        np.testing.assert_array_equal(a.read(0, a.num_tokens), b.read(0, b.num_tokens))


def test_local_jsonl_and_text_files(tmp_path):
    docs = [f"Document number {i} says hello {'again ' * (i % 5)}." for i in range(60)]
    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in docs[:56]))
    for i, text in enumerate(docs[56:]):
        (tmp_path / f"t{i:02d}.txt").write_text(text)
    data = config(
        source="local", local={"files": [str(tmp_path / "a.jsonl"), str(tmp_path / "t*.txt")]}, val_fraction=0.25
    )
    manifest = tokenize(data, tmp_path / "tokens", progress=False)
    tokenizer = Tokenizer.from_file(str(tmp_path / "tokens" / "tokenizer.json"))
    assert len(manifest["source"]["files"]) == 5
    for split in ("train", "val"):  # no id column: the text decides the split
        expected = [t for t in docs if is_val(t, 0.25) == (split == "val")]
        assert [tokenizer.decode(d[:-1]) for d in split_documents(tmp_path / "tokens", split)] == expected


def test_uint32_shards_and_header_round_trip(tmp_path):
    assert token_dtype(65536) == "uint16" and token_dtype(65537) == "uint32"
    tokens = np.array([0, 70000, 128255, 5], np.uint32)
    digest = write_shard(tmp_path / "s.bin", tokens, {"dtype": "uint32", "split": "train", "index": 0})
    assert digest == hashlib.sha256(tokens.astype("<u4").tobytes()).hexdigest()
    header = read_header(tmp_path / "s.bin")
    assert header == {"dtype": "uint32", "split": "train", "index": 0, "tokens": 4, "sha256": digest}
    assert (tmp_path / "s.bin").stat().st_size == HEADER_BYTES + 16
    np.testing.assert_array_equal(np.fromfile(tmp_path / "s.bin", "<u4", offset=HEADER_BYTES), tokens)
    with pytest.raises(ValueError, match="exceeds"):
        encode_header({"x": "y" * 2000})


# -- bad input ------------------------------------------------------------------------------


def write(path, content: bytes):
    path.write_bytes(content)
    return str(path)


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("empty.parquet", None, r"empty corpus: .*empty\.parquet hold no documents"),
        ("empty.txt", b"", r"empty corpus: .*empty\.txt hold no documents"),
        ("blank.jsonl", b'{"text": ""}\n{"text": "  "}\n', r"empty corpus: .*blank\.jsonl holds no document with text"),
        ("nocol.parquet", "content", r"nocol\.parquet has no column 'text' \(columns: content\)"),
        ("nocol.jsonl", b'{"body": "hello"}\n', r"nocol\.jsonl has no column 'text' \(columns: body\)"),
        ("latin1.txt", "café".encode("latin-1"), r"latin1\.txt is not valid UTF-8"),
        ("latin1.jsonl", b'{"text": "caf\xe9"}\n', r"latin1\.jsonl is not valid UTF-8"),
        ("missing.parquet", "absent", r"corpus file .*missing\.parquet does not exist"),
    ],
)
def test_bad_corpus_files(tmp_path, name, content, message):
    path = tmp_path / name
    if content is None:
        pq.write_table(pa.table({"text": pa.array([], pa.string())}), path)
    elif content == "content":
        pq.write_table(pa.table({"content": ["hello"]}), path)
    elif content != "absent":
        path.write_bytes(content)
    with pytest.raises(StreambackError, match=message):
        tokenize(config(source="local", local={"files": [str(path)]}), tmp_path / "tokens", progress=False)
    assert not (tmp_path / "tokens").exists()  # a failed run leaves no (empty) output directory


@pytest.mark.parametrize(
    "tokenizer, message",
    [
        (
            {"kind": "file", "file": "/nonexistent/tokenizer.json"},
            r"tokenizer file /nonexistent/tokenizer\.json does not exist",
        ),
        ({"kind": "file", "file": "GARBAGE"}, r"tokenizer file .*garbage\.json cannot be loaded"),
        ({"kind": "file", "file": "BPE", "eos_token": "<|eot|>"}, r"has no token '<\|eot\|>'"),
    ],
)
def test_tokenizer_that_cannot_be_loaded(corpus, tmp_path, tokenizer, message):
    if tokenizer["file"] == "GARBAGE":
        tokenizer["file"] = write(tmp_path / "garbage.json", b'{"model": ')
    elif tokenizer["file"] == "BPE":
        tokenizer["file"] = str(corpus["out"] / "tokenizer.json")
    with pytest.raises(StreambackError, match=message):
        tokenize(config(tokenizer=tokenizer), tmp_path / "tokens", inputs=corpus["files"], progress=False)


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda d: (d / "train-00001.bin").unlink(), r"shard .*train-00001\.bin listed in .*manifest\.json is missing"),
        (
            lambda d: (d / "val-00000.bin").write_bytes((d / "val-00000.bin").read_bytes()[:-2]),
            r"val-00000\.bin is \d+ bytes, its header promises",
        ),
        (lambda d: (d / "train-00000.bin").write_bytes(b"not a shard"), r"train-00000\.bin has no streamback header"),
        (
            lambda d: (d / "train-00000.bin").write_bytes((d / "train-00001.bin").read_bytes()),
            r"train-00000\.bin and .*manifest\.json disagree on its ",
        ),
    ],
)
def test_shards_whose_header_or_size_do_not_match(corpus, tmp_path, damage, message):
    out = copy_tokens(corpus["out"], tmp_path / "tokens")
    damage(out)
    with pytest.raises(StreambackError, match=message):
        TokenDataset(out, "val" if "val" in message else "train")


def test_a_changed_byte_is_found_before_it_is_read(corpus, tmp_path):
    out = copy_tokens(corpus["out"], tmp_path / "tokens")
    flip_bit(out / "train-00002.bin", HEADER_BYTES + 2 * 5)  # the sixth token of the third shard
    ds = TokenDataset(out, "train")
    good = TokenDataset(corpus["out"], "train")
    np.testing.assert_array_equal(ds.read(0, 100), good.read(0, 100))  # shards 0 and 1 are intact
    message = (
        r"shard .*train-00002\.bin: the sha256 of its tokens is [0-9a-f]{16}\.\.\., .*manifest\.json records "
        r"[0-9a-f]{16}"
    )
    for _ in range(2):  # refused every time, never remembered as good
        with pytest.raises(StreambackError, match=message):
            ds.read(ds.starts[2], 8)
    with pytest.raises(StreambackError, match=r"1 token shard\(s\) in .* do not match manifest\.json:\n  " + message):
        TokenDataset(out, "train").verify(threads=2)
    with pytest.raises(StreambackError, match="streamback tokenize"):  # the message says how to repair it
        TokenDataset(out, "train").verify()


def test_a_token_id_outside_the_vocabulary_is_named(corpus, tmp_path):
    """A manifest whose vocabulary is smaller than its shards' ids (hashes intact): named per shard
    with the largest id, checked against numpy's own max of the raw shard."""
    out = copy_tokens(corpus["out"], tmp_path / "tokens")
    manifest = json.loads((out / "manifest.json").read_text())
    largest = {p.name: int(np.fromfile(p, "<u2", offset=HEADER_BYTES).max()) for p in sorted(out.glob("train-*.bin"))}
    manifest["vocab_size"] = max(largest.values())  # the largest id is now one past the end
    (out / "manifest.json").write_text(json.dumps(manifest))
    ds = TokenDataset(out, "train")
    with pytest.raises(StreambackError) as err:
        ds.verify()
    bad = [name for name, top in largest.items() if top >= manifest["vocab_size"]]
    assert bad and str(err.value).count("outside the vocabulary") == len(bad)
    for name in bad:
        assert (
            f"{name}: it holds token id {largest[name]}, outside the vocabulary of {manifest['vocab_size']} ids"
            in str(err.value)
        )
    with pytest.raises(StreambackError, match="outside the vocabulary"):
        ds.read(ds.starts[int(bad[0][6:11])], 1)


def test_each_shard_is_hashed_once_per_process(corpus, tmp_path, monkeypatch):
    out = copy_tokens(corpus["out"], tmp_path / "tokens")
    real, hashed = shards_module.scan_tokens, []
    monkeypatch.setattr(shards_module, "scan_tokens", lambda path, dtype: hashed.append(path.name) or real(path, dtype))
    ds = TokenDataset(out, "train")
    ds.read(0, ds.num_tokens)
    ds.read(0, 10)
    TokenDataset(out, "train").verify()
    TokenDataset(out, "train").read(0, ds.num_tokens)
    assert sorted(hashed) == [p.name for p in ds.paths]
    (out / "train-00001.bin").write_bytes((out / "train-00001.bin").read_bytes())  # same bytes, written again
    TokenDataset(out, "train").verify()
    assert hashed[len(ds.paths) :] == ["train-00001.bin"]  # a file written since is hashed again


def test_a_verification_record_spares_only_unchanged_shards(corpus, tmp_path, monkeypatch):
    out = copy_tokens(corpus["out"], tmp_path / "tokens")
    ds = TokenDataset(out, "train")
    ds.verify()
    write_record(tmp_path / "record.json", ds.verified_record())
    record = read_record(tmp_path / "record.json")
    assert len(record) == len(ds.paths) and read_record(tmp_path / "absent.json") == {}
    monkeypatch.setattr(shards_module, "_VERIFIED", {})  # as in a new process
    assert TokenDataset(out, "train").unverified(record) == []
    monkeypatch.setattr(shards_module, "_VERIFIED", {})
    flip_bit(out / "train-00001.bin", HEADER_BYTES)
    assert TokenDataset(out, "train").unverified(record) == [1]  # its stamp changed: hashed again
    record[str((out / "train-00000.bin").resolve())]["sha256"] = "0" * 64
    monkeypatch.setattr(shards_module, "_VERIFIED", {})
    assert TokenDataset(out, "train").unverified(record) == [0, 1]  # a record never overrides the manifest


def test_unwritable_output_directories_are_named_before_any_work(corpus, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(StreambackError, match=rf"token directory {blocker}/tokens is not writable \(Not a directory\)"):
        tokenize(config(), blocker / "tokens", inputs=corpus["files"], progress=False)
    data = config(synthetic={"documents": 10, "files": 1})
    with pytest.raises(StreambackError, match=rf"corpus directory {blocker}/corpus is not writable"):
        generate(data, blocker / "corpus")


def test_cli_reports_bad_input(tmp_path):
    params = json.dumps({"source": "local", "local": {"files": [str(tmp_path / "none*.parquet")]}})
    result = subprocess.run(
        [sys.executable, "-m", "streamback", "tokenize", "--params", params, "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert result.returncode == 2
    assert "streamback tokenize: error: empty corpus: data.local.files matched no files" in result.stderr
