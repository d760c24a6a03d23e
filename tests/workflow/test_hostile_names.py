"""Hostile names: config path values and file names holding `$(...)`, backquotes, `;`, spaces and
quotes reach every rule's shell line as single arguments and never run (a real tokenize job on
such files into such a directory, and every job of both configs' dry runs, parsed as the shell
does); a name that would climb out of its directory is refused, and no delete leaves the
directory it belongs to. Also what Snakemake's dry run checks against the tokenized data (a token
budget larger than it), and what it prints for a missing --configfile."""

import json
import os
import re
import shlex

import pytest
import yaml

from streamback import layout
from streamback.cli import main
from streamback.errors import StreambackError
from streamback.io import remove

from conftest import ROOT

# kernels: its in-process stages (cli.main) must leave the caller's kernel path as they found it;
# CI runs it with the kernel-sensitive tests again on the other kernel path (.ci/run)
pytestmark = pytest.mark.kernels

MARK = "PWNED"  # every injected command would create a file whose name holds it
HOSTILE_DIR = f"tok $(touch {MARK}1); 'x' \"y\" `touch {MARK}2`"
HOSTILE_FILES = [f"in/a.jsonl;touch {MARK}3;.jsonl", f"in/b $(touch {MARK}4) 'q' \"d\".jsonl"]
HOSTILE_CONFIG = f"cfg $(touch {MARK}5) ';'.yaml"
HOSTILE_TOKENIZER = f"tk $(touch {MARK}6).json"
HOSTILE_TASKS_DIR = f"tasks; touch {MARK}7 'z'"
HOSTILE_DATASET = f"hub `touch {MARK}8` $(touch {MARK}9)"


def injected(directory):
    return sorted(
        p
        for p in [*directory.rglob(f"*{MARK}*"), *ROOT.glob(f"*{MARK}*")]
        if MARK not in p.parent.name and p.name.startswith(MARK)
    )


@pytest.fixture(scope="module")
def hostile(tmp_path_factory, run_snakemake):
    """A working directory whose local corpus files, token directory and config file have hostile
    names, tokenized by a real `snakemake` run of rule tokenize."""
    root = tmp_path_factory.mktemp("hostile")
    (root / "in").mkdir()
    for k, name in enumerate(HOSTILE_FILES):
        (root / name).write_text(
            "".join(
                json.dumps({"id": str(i), "text": f"the cat {i} sat on the mat near the dog {i % 7}. " * 6}) + "\n"
                for i in range(k, 240, 2)
            )
        )
    data = {
        "source": "local",
        "dir": HOSTILE_DIR,
        "local": {"files": HOSTILE_FILES},
        "tokenizer": {"vocab_size": 300},
        "val_fraction": 0.1,
    }
    (root / HOSTILE_CONFIG).write_text(yaml.safe_dump({"data": data}))
    result = run_snakemake(
        "--cores", "1", f"{HOSTILE_DIR}/manifest.json", "--directory", root, "--configfile", root / HOSTILE_CONFIG
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    return root, data


def shell_commands(output):
    """Each job's shell command in a dry run's output (--printshellcmds), split into words as the shell does."""
    commands = [
        line.removeprefix("Shell command: ") for line in output.splitlines() if line.startswith("Shell command: ")
    ]
    return [list(shlex.shlex(cmd, posix=True, punctuation_chars=True)) for cmd in commands]


def strings(value):
    """The strings in a JSON value, at any depth."""
    if isinstance(value, str):
        return [value]
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else []
    return [s for item in items for s in strings(item)]


def arguments(words, option):
    """The words after `option`, up to the next option or shell operator."""
    at = words.index(option) + 1
    end = next(
        (k for k in range(at, len(words)) if words[k].startswith("--") or words[k] in (">", "||", ";", "&&", ">>")),
        len(words),
    )
    return words[at:end]


HOSTILE = (HOSTILE_DIR, *HOSTILE_FILES, HOSTILE_CONFIG, HOSTILE_TOKENIZER, HOSTILE_TASKS_DIR, HOSTILE_DATASET)


@pytest.mark.slow
def test_hostile_paths_are_single_arguments_of_every_job_and_never_run(hostile, run_snakemake):
    root, data = hostile
    assert injected(root) == []
    manifest = json.loads((root / HOSTILE_DIR / "manifest.json").read_text())
    assert [f["path"] for f in manifest["source"]["files"]] == HOSTILE_FILES and manifest["splits"]["train"][
        "tokens"
    ] > 0

    # every job of the default study, and of the paper's (FineWeb from the hub, torchrun), with every path key hostile
    extra = {
        "data": {**data, "tokenizer": {"kind": "file", "file": HOSTILE_TOKENIZER}},
        "eval": {"include_path": [HOSTILE_TASKS_DIR]},
    }
    paper = {
        "data": {"dir": HOSTILE_DIR, "hub": {"dataset": HOSTILE_DATASET}},
        "eval": {"include_path": [HOSTILE_TASKS_DIR]},
    }
    (root / "extra.yaml").write_text(yaml.safe_dump(extra))
    (root / "paper-hostile.yaml").write_text(yaml.safe_dump(paper))
    (root / HOSTILE_TASKS_DIR).mkdir(exist_ok=True)  # the task names are checked against it before any job
    given = {}  # option -> the hostile words given with it, over every job
    in_json = set()  # the hostile values that reached a job inside a --params JSON
    for configs in (
        [root / HOSTILE_CONFIG, root / "extra.yaml"],
        [ROOT / "config" / "paper.yaml", root / "paper-hostile.yaml"],
    ):
        result = run_snakemake("-n", "-p", "--forceall", "--directory", root, "--configfile", *configs)
        out = result.stdout + result.stderr
        assert result.returncode == 0, out[-3000:]
        jobs = shell_commands(out)
        assert len(jobs) > 10
        for words in jobs:
            for word in words:  # an injected command would be words of its own: `$`, `(`, `touch`, `PWNED1`, `)`
                if MARK in word and not word.startswith("{"):
                    assert any(word == h or word.endswith("/" + h) for h in HOSTILE), (word, words)
            for option in [w for w in words if w.startswith("--")]:
                for word in arguments(words, option):
                    if word.startswith("{"):
                        in_json |= {h for h in HOSTILE if h in strings(json.loads(word))}
                    elif MARK in word:
                        given.setdefault(option, set()).add(word)
    assert (
        given["--out"] == given["--data"] == given["--tokens"] == {HOSTILE_DIR}
    )  # tokenize, train and analyses, evaluate
    assert given["--inputs"] == set(HOSTILE_FILES) and given["--config-files"] == {str(root / HOSTILE_CONFIG)}
    assert in_json >= {HOSTILE_TOKENIZER, HOSTILE_TASKS_DIR, HOSTILE_DATASET}  # and the study page's whole config
    assert injected(root) == []


@pytest.mark.slow
def test_a_path_snakemake_would_read_as_a_wildcard_is_refused_with_its_key(run_snakemake, tmp_path):
    (tmp_path / "braces.yaml").write_text(yaml.safe_dump({"data": {"dir": "tok{x}"}}))
    result = run_snakemake("-n", "--directory", tmp_path, "--configfile", tmp_path / "braces.yaml")
    out = result.stdout + result.stderr
    assert result.returncode != 0 and "data.dir: 'tok{x}' does not match '^[^{}]*$'" in out and "Traceback" not in out


def test_every_value_in_a_rule_s_shell_line_is_quoted_there_or_by_construction():
    """Each `{...}` of a shell line carries `:q`, or is a param made shell-quoted in common.smk
    (as_json, shell_words, train_settings), the thread count, or train's launcher (a command line)."""
    quoted = {
        "data",
        "execution",
        "drift",
        "analysis",
        "train",
        "model",
        "eval",
        "config",
        "runs",
        "files",
        "seed",
        "resources",
        "snapshots",
        "checkpoint_scores",
        "gate",
        "disk",
    }
    sources = {smk.name: smk.read_text() for smk in sorted((ROOT / "workflow" / "rules").glob("*.smk"))}
    shells = [
        (name, m.group(1))
        for name, text in sources.items()
        for m in re.finditer(r"(?:shell:\n|_SHELL = \()((?:\s+(?:\"[^\n]*\"|'[^\n]*'))+)", text)
    ]
    assert len(shells) == 20  # every rule with a shell: line, counted so that a new one is read here too
    for name, shell in shells:
        for field in re.findall(r"(?<!\{)\{([^{}]+)\}(?!\})", shell):
            ok = (
                field.endswith(":q") or field in {"threads", "params.launch"} or field.removeprefix("params.") in quoted
            )
            assert ok, f"{name}: {{{field}}} is neither :q nor quoted by construction"
    # and those params are made by the quoting functions, in every params block and in analysis_params
    definitions = [
        (name, key, value)
        for name, text in sources.items()
        for block in re.findall(r"\n    params:\n((?:        .*\n)+)", text)
        for key, value in re.findall(r"^        (\w+)=(.*),$", block, flags=re.M)
    ]
    body = sources["common.smk"].split("def analysis_params")[1].split("\ndef ")[0]
    definitions += [
        ("common.smk", key, value) for key, value in re.findall(r'^        "(\w+)": (.*),$', body, flags=re.M)
    ]
    assert len(definitions) > 20
    for name, key, value in definitions:
        if key in quoted:
            assert re.match(
                r"(\*\*)?(untracked\()?(lambda wildcards(, input|, output)?: )?(as_json|shell_words|train_settings|CORPUS_SEED)",
                value,
            ), (name, key, value)
    assert "CORPUS_SEED = shell_words(" in sources["eval.smk"]


# ---- path escapes --------------------------------------------------------------------------------


def test_a_name_is_checked_in_one_place_with_the_schema_s_pattern():
    schema = yaml.safe_load((ROOT / "config" / "schema" / "config.schema.yaml").read_text())["$defs"]
    for pattern in (
        schema["data"]["properties"]["corpus"]["pattern"],
        schema["eval"]["properties"]["tasks"]["items"]["pattern"],
    ):
        for text in [chr(c) for c in range(32, 127)] + [
            f"a{chr(c)}" for c in range(32, 127)
        ]:  # the same names, however spelt
            assert bool(re.match(pattern, text)) == bool(re.match(layout.NAME_PATTERN, text)), (pattern, text)
    for good in ("tiny-medium-streamback-bf16_sr", "streamback_cloze", "arc_easy", "llama-3.2-1b", "{run}"):
        assert layout.checked_name(good) == good
    for bad, where in [
        ("../../x", lambda n: layout.run_dir(n)),
        ("a/b", lambda n: layout.checkpoint_dir(n)),
        (".hidden", lambda n: layout.eval_dir(n)),
        ("..", lambda n: layout.hf_dir(n)),
        ("x/../../y", lambda n: layout.eval_samples("r", n)),
        ("", lambda n: layout.figure(n, "svg")),
        ("t b", lambda n: layout.table(n)),
        ("{a}/..", lambda n: layout.eval_task_file(n)),
    ]:
        with pytest.raises(StreambackError, match=r"cannot name a file or directory: a name is letters, digits"):
            where(bad)


def test_a_run_name_that_climbs_out_of_results_is_refused(tmp_path, monkeypatch, capsys):
    work = tmp_path / "work" / "deep"
    victim = tmp_path / "victim" / "recipe-0123456789abcdef"
    victim.mkdir(parents=True)
    (victim / "keep.txt").write_text("mine")
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    assert main(["checkpoints", "--prune", "../../victim"]) == 2
    assert "run name '../../victim' cannot name a file or directory" in capsys.readouterr().err
    assert (victim / "keep.txt").read_text() == "mine"
    assert main(["evaluate", "--run-name", "../../x", "--tokens", str(tmp_path)]) == 2
    assert "run name '../../x' cannot name a file or directory" in capsys.readouterr().err
    assert (
        main(["analyze", "envelope", "--model", f"../x={tmp_path / 'model.pt'}", "--runs", "tiny-medium-baseline"]) == 2
    )
    assert "--model name '../x' cannot name a file or directory" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.rglob("*")) == [
        "deep",
        "keep.txt",
        "recipe-0123456789abcdef",
        "victim",
        "work",
    ]


def test_a_delete_never_leaves_the_directory_it_belongs_to(tmp_path, monkeypatch, capsys):
    owner, outside = tmp_path / "owner", tmp_path / "outside"
    (owner / "a").mkdir(parents=True)
    outside.mkdir()
    (outside / "precious").write_text("x")
    for path in (outside, owner / ".." / "outside", owner, tmp_path):
        with pytest.raises(StreambackError, match="refusing to delete .*: it is not inside .*owner"):
            remove(path, owner)
    (owner / "link").symlink_to(outside, target_is_directory=True)
    remove(owner / "link", owner)  # the link, never what it points to
    remove(owner / "a", owner)
    assert sorted(p.name for p in owner.iterdir()) == [] and (outside / "precious").read_text() == "x"

    # --prune of a run whose old recipe directory is a link elsewhere removes the link alone
    monkeypatch.chdir(tmp_path)
    checkpoints = layout.checkpoint_dir("tiny-medium-baseline")
    (checkpoints / "recipe-aaaaaaaaaaaaaaaa" / "step_000000005").mkdir(parents=True)
    (checkpoints / "recipe-bbbbbbbbbbbbbbbb").symlink_to(outside, target_is_directory=True)
    os.utime(outside, (1e9, 1e9))  # written before the other recipe: the one pruned
    assert main(["checkpoints", "--prune", "tiny-medium-baseline"]) == 0
    assert "removed results/checkpoints/tiny-medium-baseline/recipe-bbbbbbbbbbbbbbbb" in capsys.readouterr().out
    assert not (checkpoints / "recipe-bbbbbbbbbbbbbbbb").is_symlink() and (outside / "precious").read_text() == "x"
    assert layout.recipe_dirs(checkpoints) == [checkpoints / "recipe-aaaaaaaaaaaaaaaa"]


# ---- what Snakemake checks before any job --------------------------------------------------------


@pytest.mark.slow
def test_a_token_budget_larger_than_the_tokenized_data_stops_the_dry_run(hostile, run_snakemake):
    """docs/stages/train.md: such a run stops before any job starts. The dry run reads the data's manifest when
    it is current (made with these settings, from these files); when tokenize will run again, it
    cannot know the count, and the train job refuses it before its first step."""
    root, data = hostile
    tokens = json.loads((root / HOSTILE_DIR / "manifest.json").read_text())["splits"]["train"]["tokens"]
    big = {"train": {"tokens": 100_000_000}}
    for name, override in [
        ("big", big),
        ("repeat", {"train": {**big["train"], "repeat_data": True}}),
        ("retokenized", {**big, "data": {**data, "val_fraction": 0.2}}),
    ]:
        (root / f"{name}.yaml").write_text(yaml.safe_dump(override))
        result = run_snakemake("-n", "--directory", root, "--configfile", root / HOSTILE_CONFIG, root / f"{name}.yaml")
        out = result.stdout + result.stderr
        if name == "big":
            assert result.returncode != 0 and "Traceback" not in out
            assert (
                "train.tokens (100,000,000) takes 195,312 steps x 4 windows of 129 tokens = 781,248 windows, but the "
                f"train split "
                f"of {HOSTILE_DIR} holds {tokens:,} tokens"
            ) in out
        else:
            assert result.returncode == 0, out[-2000:]


def test_a_missing_configfile_is_what_troubleshooting_says_snakemake_prints(run_snakemake, tmp_path):
    """Snakemake reads --configfile before the Snakefile runs, so the Snakefile cannot name it: the
    troubleshooting table (docs/troubleshooting.md) says what Snakemake prints, and this keeps it true."""
    result = run_snakemake("-n", "--directory", tmp_path, "--configfile", "missing.yaml")
    assert result.returncode != 0
    printed = "FileNotFoundError: [Errno 2] No such file or directory: 'missing.yaml'"
    assert printed in result.stdout + result.stderr
    assert f"`{printed}`" in (ROOT / "docs" / "troubleshooting.md").read_text()
