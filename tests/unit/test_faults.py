"""Faults a user meets, each met by one line naming the thing and what to do: a model file changed
after it was written (and one written before models were hashed), a full disk at every kind of
write (a checkpoint, a model, a table, a figure; a real full tmpfs where one can be mounted, and a
write that raises ENOSPC everywhere), the temporary files of a killed write, a checkpoint someone
else could have written, a manifest that disagrees with its shards or lacks a key, and the
analyses given a model and tokens that do not belong together."""

import builtins
import errno
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys

import pandas as pd
import pytest
import torch

from streamback import layout
from streamback.cli import main
from streamback.data.shards import TokenDataset, read_manifest
from streamback.errors import DiskFull, StreambackError
from streamback.io import write_csv, write_text
from streamback.model.model import ModelArgs, Transformer
from streamback.model.weights import content_sha256, read_model, save_model
from streamback.runs import run_matrix
from streamback.train import checkpoint as ckpt

from conftest import ROOT

pytestmark = pytest.mark.usefixtures("one_thread")
NO_SUCH_PID = 1 << 23  # above Linux's largest pid (pid_max is at most 2^22): never a live process


def tiny(vocab=300, seed=0):
    args = ModelArgs(n_layers=1, dim=32, n_heads=2, n_kv_heads=1, vocab_size=vocab, multiple_of=16, max_seq_len=64)
    model = Transformer(args)
    model.init_weights(seed)
    return args, model.state_dict()


def leftovers(directory):
    """Temporary files or directories under `directory`: atomic_path's .<name>.<pid>.tmp, a checkpoint's .tmp_step_*."""
    return sorted(p for p in directory.rglob("*") if p.name.startswith(".tmp") or p.name.endswith(".tmp"))


# ---- a model file is verified like a checkpoint --------------------------------------------------


def test_a_model_file_records_the_sha256_of_its_contents_and_a_changed_bit_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    path = layout.model_file("tiny-baseline")
    args, state = tiny()
    save_model(path, args, state)
    record = torch.load(path, weights_only=True)
    digest = hashlib.sha256(
        json.dumps({k: v for k, v in record.items() if k not in ("model", "sha256")}, sort_keys=True).encode()
    )
    for key in sorted(state):  # the documented layout, computed here on its own
        digest.update(f"\n{key} {state[key].dtype} {tuple(state[key].shape)}\n".encode())
        digest.update(state[key].numpy().tobytes())
    assert record["sha256"] == digest.hexdigest() == content_sha256(record)
    assert all(torch.equal(read_model(path).state[k], state[k]) for k in state)

    data = bytearray(path.read_bytes())  # one bit inside the embedding's bytes, which torch.load alone accepts
    at = data.find(state["tok_embeddings.weight"].numpy().tobytes()[:64])
    assert at > 0
    data[at + 1001] ^= 0x04
    path.write_bytes(bytes(data))
    torch.load(path, weights_only=True)
    with pytest.raises(StreambackError) as refused:
        read_model(path)
    message = str(refused.value)
    assert (
        message.startswith(f"model file {path}: the sha256 of its contents is ")
        and "it changed after it was written" in message
    )
    assert f"`snakemake --cores 1 --forcerun {path}` (rule train" in message
    # every reader reads through read_model: export-hf, through the CLI, prints that one line
    assert main(["export-hf", "--checkpoint", str(path), "--out", str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the sha256 of its contents is" in err and not (tmp_path / "hf").exists()

    record["stream"] = "fp32"  # a changed field outside the tensors, the old seal kept
    torch.save(record, tmp_path / "edited.pt")
    with pytest.raises(
        StreambackError, match=r"edited\.pt: the sha256 of its contents .* rebuild it with the command that made it"
    ):
        read_model(tmp_path / "edited.pt")


def test_a_model_file_that_records_no_sha256_is_refused(tmp_path):
    args, state = tiny()
    save_model(tmp_path / "model.pt", args, state)
    record = torch.load(tmp_path / "model.pt", weights_only=True)
    del record["sha256"]
    torch.save(record, tmp_path / "old.pt")
    with pytest.raises(
        StreambackError, match=r"old\.pt records no sha256, so its contents cannot be verified: rebuild it"
    ):
        read_model(tmp_path / "old.pt")


# ---- a model and tokens that do not belong together ---------------------------------------------


@pytest.fixture
def analysis_dir(tmp_path, tokens, monkeypatch):
    """A one-shape matrix (baseline, streamback) trained on `tokens` as far as its files say, and its config."""
    import yaml

    from streamback.config import validate_config

    monkeypatch.chdir(tmp_path)
    config = validate_config(
        {
            "data": {"dir": str(tokens)},
            "model": {"shapes": {"t": {"n_layers": 1, "dim": 32, "n_heads": 2, "n_kv_heads": 1, "multiple_of": 16}}},
            "train": {
                "runs": {"shapes": ["t"], "streams": []},
                "seq_len": 16,
                "tokens": 160,
                "batch_size": 1,
                "micro_batch_size": 1,
                "schedule": {"warmup_steps": 1, "decay_steps": 1},
                "log": {"val_sequences": 4},
            },
            "analysis": {"batch_size": 2, "variants": ["bf16"], "loss_windows": 4},
        }
    )
    manifest = read_manifest(tokens)
    corpus = {"fingerprint": manifest["fingerprint"], "tokenizer_sha256": manifest["tokenizer"]["sha256"]}
    for seed, (run, spec) in enumerate(run_matrix(config["train"]).items()):
        args = ModelArgs.from_config(config["model"], spec.shape, manifest["vocab_size"], spec.block, spec.stream)
        model = Transformer(args)
        model.init_weights(seed)
        save_model(layout.model_file(run), args, model.state_dict(), data=corpus)
        layout.metrics_file(run).write_text(
            "".join(json.dumps({"step": s, "tokens": 16 * s, "loss": 5.0 - s / 10}) + "\n" for s in (1, 2))
        )
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    return tmp_path / "config.yaml", corpus


def analyze(config, *args):
    return main(["analyze", *map(str, args), "--config", str(config), "--device", "cpu", "--threads", "1"])


def test_the_analyses_refuse_a_model_of_another_corpus_before_writing_anything(analysis_dir, capsys):
    config, corpus = analysis_dir
    assert analyze(config, "layer-error") == 0  # the pair belongs together: analysed
    capsys.readouterr()
    trained = read_model(layout.model_file("t-baseline"))
    save_model(layout.model_file("t-baseline"), trained.args, trained.state, data={**corpus, "fingerprint": "f" * 64})
    os.remove(layout.table("layer_error"))
    for kind in ("layer-error", "loss-difference"):  # the per-model read and the loss windows' own read
        assert analyze(config, kind) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1
        assert (
            f"run t-baseline ({layout.model_file('t-baseline')}) was trained on another corpus than" in err
            and "its fingerprint is ffff" in err
        )
        assert not any(layout.table(name).exists() for name in layout.ANALYSIS_TABLES[kind])


def test_an_imported_model_records_its_tokenizer_and_the_analyses_check_it(analysis_dir, tmp_path, capsys):
    """import-hf records the tokenizer of the directory it reads; the analyses then refuse the tokens of another."""
    import yaml

    from streamback.data.tokenizer import train_bpe
    from streamback.model.export_hf import export

    config, corpus = analysis_dir
    tokens = yaml.safe_load(config.read_text())["data"]["dir"]
    export(layout.model_file("t-baseline"), tmp_path / "hf", tokens)
    assert main(["import-hf", "--hf", str(tmp_path / "hf"), "--out", str(tmp_path / "same.pt")]) == 0
    assert read_model(tmp_path / "same.pt").data == {
        "tokenizer_sha256": corpus["tokenizer_sha256"]
    }  # the round trip keeps the tokenizer
    other = train_bpe(["a quite different corpus, with other words in it"] * 20, 280)
    (tmp_path / "hf" / "tokenizer.json").write_text(other.to_str())
    assert main(["import-hf", "--hf", str(tmp_path / "hf"), "--out", str(tmp_path / "other.pt")]) == 0
    capsys.readouterr()
    assert analyze(config, "swallowed", "--runs", "t-baseline", "--model", f"same={tmp_path / 'same.pt'}") == 0
    capsys.readouterr()
    assert analyze(config, "swallowed", "--runs", "t-baseline", "--model", f"other={tmp_path / 'other.pt'}") == 2
    assert "was trained on another corpus than" in capsys.readouterr().err


# ---- a full disk, at every kind of write --------------------------------------------------------


class _FullFile:
    """A file opened for writing on a "full disk": every write raises ENOSPC."""

    def __init__(self, real):
        self._real = real

    def write(self, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def __getattr__(self, name):
        return getattr(self._real, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._real.close()


@pytest.fixture(params=["patched", "tmpfs"])
def full_disk(request, tmp_path, monkeypatch):
    """(a directory to prepare, `fill()`, after which every write in it fails with ENOSPC):
    a real 1 MB tmpfs filled up (where this process may mount one), or every write under it
    raising ENOSPC (open patched)."""
    directory = tmp_path / "disk"
    directory.mkdir()
    if request.param == "tmpfs":
        mounted = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(directory)], capture_output=True
        )
        if mounted.returncode:
            pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip() or 'not root'}")
        request.addfinalizer(lambda: subprocess.run(["umount", "-l", str(directory)], check=True))

        def fill():
            with open(directory / ".filler", "wb") as f, pytest.raises(OSError) as full:
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
            assert full.value.errno == errno.ENOSPC
    else:
        real_open = io.open

        def full_open(file, mode="r", *args, **kwargs):
            handle = real_open(file, mode, *args, **kwargs)
            writing = isinstance(file, (str, os.PathLike)) and any(c in mode for c in "wax+")
            return _FullFile(handle) if writing and str(os.path.abspath(file)).startswith(str(directory)) else handle

        def fill():
            monkeypatch.setattr(builtins, "open", full_open)
            monkeypatch.setattr(io, "open", full_open)

    return directory, fill


def test_a_full_disk_while_a_checkpoint_is_written_is_named_and_leaves_nothing(full_disk):
    disk, fill = full_disk
    model = torch.nn.Linear(64, 64)
    state = ckpt.TrainState(model, torch.optim.AdamW(model.parameters()))
    root = disk / "recipe-0123456789abcdef"
    root.mkdir()
    fill()
    with pytest.raises(DiskFull) as full:
        ckpt.save_checkpoint(root, 20, state, {"identity": {}}, keep=2)
    message = str(full.value)
    assert message.startswith(f"no space left on device while writing {root / 'step_000000020'} (")
    assert "MB free on its filesystem): free space there" in message and "`streamback checkpoints --prune`" in message
    assert ckpt.list_checkpoints(root) == [] and leftovers(disk) == []


def test_a_full_disk_while_a_model_is_written_is_named_and_leaves_nothing(full_disk):
    disk, fill = full_disk
    args, state = tiny()
    path = disk / "results" / "runs" / "tiny-baseline" / "model.pt"
    path.parent.mkdir(parents=True)
    fill()
    with pytest.raises(
        DiskFull,
        match=rf"^no space left on device while writing {path} \(.* MB free on its filesystem\): "
        r"free space there, then write it again with `snakemake --cores 1 --forcerun",
    ):
        save_model(path, args, state)
    assert not path.exists() and leftovers(disk) == []


def test_a_full_disk_while_a_table_is_written_is_one_line_of_the_command(full_disk, monkeypatch, capsys):
    disk, fill = full_disk
    monkeypatch.chdir(disk)
    runs = ["tiny-fat-short-baseline", "tiny-fat-short-streamback"]
    for run in runs:
        write_text(
            layout.metrics_file(run),
            "".join(
                json.dumps({"step": s, "tokens": 2048 * s, "loss": 5.0, "lr": 1e-3, "grad_norm": 1.0}) + "\n"
                for s in (1, 2)
            ),
        )
    fill()
    params = json.dumps({"runs": {"shapes": ["tiny-fat-short"], "blocks": ["baseline", "streamback"], "streams": []}})
    assert main(["training-curves", "--params", params, "--runs", *runs]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(
        "streamback training-curves: error: no space left on device while writing "
        f"{layout.table(layout.TRAINING_TABLE)} ("
    )
    with pytest.raises(DiskFull, match=r"while writing .*t\.csv"):
        write_csv(disk / "t.csv", pd.DataFrame({"a": [1.0]}))
    assert not layout.table(layout.TRAINING_TABLE).exists() and leftovers(disk) == []


def test_a_full_disk_while_a_figure_is_written_is_named_and_leaves_nothing(full_disk, monkeypatch):
    import altair as alt

    from streamback.charts import save_figure

    disk, fill = full_disk
    monkeypatch.chdir(disk)
    chart = alt.Chart(pd.DataFrame({"x": [1, 2], "y": [3, 4]})).mark_line().encode(x="x", y="y")
    layout.FIGURES_DIR.mkdir(parents=True)
    fill()
    with pytest.raises(DiskFull, match=rf"while writing {layout.figure('drift_ratio', 'svg')} "):
        save_figure(chart, "drift_ratio")
    assert list(layout.FIGURES_DIR.iterdir()) == [] and leftovers(disk) == []


def test_an_expected_os_error_is_one_line_and_a_bug_keeps_its_traceback(monkeypatch, capsys):
    import streamback.check

    faults = iter(
        [
            OSError(errno.ENOSPC, "No space left on device"),
            PermissionError(errno.EACCES, "Permission denied", "results/x"),
            KeyboardInterrupt(),
            OSError(errno.EBADF, "Bad file descriptor"),
        ]
    )

    def run(args):
        raise next(faults)

    monkeypatch.setattr(streamback.check, "run", run)
    assert main(["check"]) == 2
    assert capsys.readouterr().err == (
        "streamback check: error: no space left on device while writing a file the system does not "
        "name: free space there (or write elsewhere), then rerun\n"
    )
    assert main(["check"]) == 2
    assert capsys.readouterr().err == "streamback check: error: Permission denied: results/x\n"
    assert main(["check"]) == 130
    assert capsys.readouterr().err == "streamback check: interrupted\n"
    with pytest.raises(OSError, match="Bad file descriptor"):
        main(["check"])


# ---- temporary files of a killed write -----------------------------------------------------------


def test_a_killed_write_leaves_a_temporary_file_that_the_next_write_removes_and_names(tmp_path, capsys):
    target = tmp_path / "summary.json"
    killed = subprocess.run(
        [
            sys.executable,
            "-c",
            (
                "import os, signal, sys\n"
                "from streamback.io import atomic_path\n"
                "with atomic_path(sys.argv[1]) as tmp:\n"
                "    tmp.write_text('half')\n"
                "    os.kill(os.getpid(), signal.SIGKILL)\n"
            ),
            str(target),
        ],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert killed.returncode == -9
    (left,) = leftovers(tmp_path)
    alive = target.with_name(f".{target.name}.{os.getppid()}.tmp")  # a live process's: it may still be writing
    alive.write_text("busy")
    write_text(target, "{}\n")
    assert target.read_text() == "{}\n" and leftovers(tmp_path) == [alive]
    assert capsys.readouterr().err == f"removed {left}, left behind by a write of {target} that was killed\n"


def test_a_killed_checkpoint_save_and_tokenize_leave_temporaries_the_next_run_removes_and_names(
    tmp_path, tokens, capsys
):
    from streamback.config import validate_config
    from streamback.data.tokenize import tokenize

    root = tmp_path / "recipe-0123456789abcdef"
    (root / ".tmp_step_000000040").mkdir(parents=True)
    (root / ".tmp_step_000000040" / "__0_0.distcp").write_bytes(b"half")
    said = []
    ckpt.remove_partial(root, say=said.append)
    assert said == [
        f"removed {root / '.tmp_step_000000040'}, the temporary directory of a checkpoint save that was killed"
    ]
    assert list(root.iterdir()) == []

    copy = tmp_path / "tokens"
    shutil.copytree(tokens, copy)
    (copy / f".train-00000.bin.{NO_SUCH_PID}.tmp").write_bytes(b"half")
    data = validate_config(
        {"data": {"tokenizer": {"vocab_size": 300}, "val_fraction": 0.1, "shard_tokens": 20000, "processes": 1}}
    )["data"]
    tokenize(data, copy, inputs=[tokens.parent / "part.parquet"], processes=1, progress=True)
    err = capsys.readouterr().err
    assert (
        f"tokenize: removed {copy / f'.train-00000.bin.{NO_SUCH_PID}.tmp'}, a temporary file of a tokenize that was "
        f"killed" in err
    )
    assert "nothing to do" in err and leftovers(copy) == []


# ---- the checkpoint trust boundary ---------------------------------------------------------------


@pytest.fixture
def saved(tmp_path):
    """A checkpoint of a small module under umask 002 (which gives the group write permission), and a fresh state to
    load it into."""

    def state(seed):
        torch.manual_seed(seed)
        model = torch.nn.Linear(8, 8)
        return ckpt.TrainState(model, torch.optim.AdamW(model.parameters()))

    root = tmp_path / "recipe-0123456789abcdef"
    previous = os.umask(0o002)
    try:
        path = ckpt.save_checkpoint(root, 5, state(0), {"identity": {}}, keep=2)
    finally:
        os.umask(previous)
    return root, path, state(1)


def test_a_checkpoint_is_written_writable_by_its_owner_alone_and_resumes(saved):
    root, path, fresh = saved
    assert all(not p.stat().st_mode & 0o022 for p in [path, *path.iterdir()])
    assert ckpt.load_newest(root, fresh)["step"] == 5
    torch.manual_seed(0)
    assert torch.equal(fresh.model.weight, torch.nn.Linear(8, 8).weight)


@pytest.mark.parametrize(
    "change, problem",
    [
        (
            lambda p: os.chmod(p / ".metadata", 0o664),
            r"\.metadata may be written by its group or others \(-rw-rw-r--\)",
        ),
        (lambda p: os.chmod(p, 0o757), r"step_000000005 may be written by its group or others \(drwxr-xrwx\)"),
        (
            lambda p: os.chown(p / ".metadata", 65534, 65534),
            r"\.metadata is owned by (nobody \()?uid 65534\)?, not by you",
        ),
    ],
    ids=["group-writable-metadata", "world-writable-directory", "another-owner"],
)
def test_a_checkpoint_someone_else_could_have_written_is_refused_naming_it(saved, change, problem):
    root, path, fresh = saved
    if "owned by" in problem and os.geteuid() != 0:
        pytest.skip("only root can give a file to another user")
    change(path)
    before = fresh.model.weight.clone()
    with pytest.raises(
        StreambackError,
        match=r"not resuming from checkpoint .*step_000000005: loading a checkpoint runs its "
        rf"pickled \.metadata(.|\n)*{problem}(.|\n)*chmod -R go-w",
    ):
        ckpt.load_newest(root, fresh)
    assert torch.equal(fresh.model.weight, before) and ckpt.list_checkpoints(root) == [(5, path)]


# ---- a manifest that disagrees with its shards, or lacks a key --------------------------------------


def test_a_manifest_that_disagrees_with_a_shard_names_both_and_which_is_newer(tokens, tmp_path):
    data = shutil.copytree(tokens, tmp_path / "tokens")
    manifest = json.loads((data / "manifest.json").read_text())
    recorded = manifest["splits"]["train"]["shards"][0]["sha256"]
    manifest["splits"]["train"]["shards"][0]["sha256"] = "0" * 64
    (data / "manifest.json").write_text(json.dumps(manifest))
    os.utime(data / "train-00000.bin", (1e9, 1e9))
    with pytest.raises(StreambackError) as edited:
        TokenDataset(data, "train")
    assert str(edited.value) == (
        f"shard {data / 'train-00000.bin'} and {data / 'manifest.json'} disagree on its sha256: the shard's header "
        f"records "
        f"{recorded[:16]}..., the manifest {'0' * 16}...; manifest.json was written after train-00000.bin (so "
        f"manifest.json is the one "
        "that changed, or the other is a copy from another tokenize): rerun tokenize (`snakemake --forcerun tokenize`) "
        "to write both again"
    )
    os.utime(data / "manifest.json", (1e9, 1e9))
    os.utime(data / "train-00000.bin", None)
    with pytest.raises(StreambackError, match=r"train-00000\.bin was written after manifest\.json"):
        TokenDataset(data, "train")


@pytest.mark.parametrize(
    "drop, named",
    [
        (lambda m: m.pop("vocab_size"), " lacks 'vocab_size'"),
        (lambda m: m["tokenizer"].pop("sha256"), "'s tokenizer lacks 'sha256'"),
        (lambda m: m["splits"].pop("val"), "'s splits lacks 'val'"),
    ],
)
def test_a_manifest_without_a_key_it_needs_is_named(tokens, tmp_path, drop, named):
    data = shutil.copytree(tokens, tmp_path / "tokens")
    manifest = json.loads((data / "manifest.json").read_text())
    drop(manifest)
    (data / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(
        StreambackError,
        match=rf"^{data / 'manifest.json'}{named} \(edited, or not written by tokenize\): rerun tokenize",
    ):
        TokenDataset(data, "train")
