"""The end-to-end half of test_data.py (commands run as processes, compiled or multi-process runs, Snakemake): the same
subjects, at the pace of whole runs."""

import json

import pytest

from streamback import layout
from streamback.data.shards import TokenDataset, read_manifest

from helpers.data import SHARD


@pytest.mark.slow
def test_snakemake_rules_corpus_and_tokenize(run_snakemake, tmp_path):
    data = {"synthetic": {"documents": 300, "files": 2}, "shard_tokens": SHARD, "tokenizer": {"vocab_size": 600}}
    (tmp_path / "tiny.yaml").write_text(json.dumps({"data": data}))  # JSON is YAML
    tokens = layout.tokens_dir({"corpus": "synthetic"})
    result = run_snakemake(
        tokens / "manifest.json", "--cores", "2", "--directory", tmp_path, "--configfile", tmp_path / "tiny.yaml"
    )
    assert result.returncode == 0, result.stderr + result.stdout
    manifest = read_manifest(tmp_path / tokens)
    assert [f["path"] for f in manifest["source"]["files"]] == [
        str(p) for p in layout.corpus_files({"corpus": "synthetic", "synthetic": {"files": 2}})
    ]
    assert TokenDataset(tmp_path / tokens, "train", verify=True).num_tokens > 2 * SHARD
    log = (tmp_path / "logs/tokenize/synthetic.log").read_text()
    assert "300 documents" in log and "tokens/s" in log
    assert "wrote 300 documents to 2 files" in (tmp_path / "logs/corpus/synthetic.log").read_text()
