"""A finished study is relocatable: the project (its code and its working directory with results/
and Snakemake's records) copied to another directory plans nothing there, so no rule's params nor
any record that decides a rerun holds an absolute path."""

import os
import shutil
import subprocess
import sys

from conftest import ROOT

# what a clone of the checkout has besides its code: none of it is part of the workflow
NOT_CODE = shutil.ignore_patterns(".git", ".venv", "results", "logs", ".snakemake", "__pycache__", ".pytest_cache")


def plan(snakefile, workdir, configfile, pythonpath):
    cmd = [
        sys.executable,
        "-m",
        "snakemake",
        "-s",
        str(snakefile),
        "-n",
        "--cores",
        "1",
        "--directory",
        str(workdir),
        "--configfile",
        str(configfile),
    ]
    env = {**os.environ, "PYTHONPATH": str(pythonpath)}
    return subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True, timeout=600)


def test_a_copied_study_plans_nothing(study, tmp_path):
    here = plan(ROOT / "Snakefile", study.root, study.root / "small.yaml", ROOT)
    assert here.returncode == 0 and "Nothing to be done" in here.stdout + here.stderr, (
        here.stdout[-3000:] + here.stderr[-3000:]
    )
    code, work = tmp_path / "elsewhere" / "streamback", tmp_path / "elsewhere" / "study"
    shutil.copytree(
        ROOT, code, ignore=NOT_CODE, symlinks=True
    )  # copy2: the files keep their times, as `cp -a` or rsync -a
    shutil.copytree(study.root, work, symlinks=True)
    moved = plan(code / "Snakefile", work, work / "small.yaml", code)
    out = moved.stdout + moved.stderr
    assert moved.returncode == 0 and "Nothing to be done" in out, out[-4000:]
