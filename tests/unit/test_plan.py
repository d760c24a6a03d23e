"""`streamback plan` (streamback/plan.py) on the tiers' configs and on one made to mismatch, and the
matrix's disk check (streamback/preflight/table.py) on constructed sizes, a disk_usage passed in and
`lfs quota`'s output."""

import re
from collections import namedtuple
from pathlib import Path

import pytest

from streamback import layout
from streamback.check import read_files, resolve
from streamback.plan import plan_table
from streamback.preflight.table import GB, disk_problems, matrix_disk, matrix_disk_needs, parse_lfs_quota
from streamback.runs import run_matrix

ROOT = Path(__file__).resolve().parents[2]
Usage = namedtuple("Usage", "total used free")


def roomy(path):
    """A file system with 100 TB free: the tiers' disks are the cluster's, not this machine's."""
    return Usage(10**15, 0, 10**14)


def no_quota(path):
    return None, "no quota seen (test)"


def tier(name, **changes):
    config = resolve(read_files([ROOT / "config" / name]))[0]
    for dotted, value in changes.items():
        section, *keys = dotted.split(".")
        node = config[section]
        for key in keys[:-1]:
            node = node[key]
        node[keys[-1]] = value
    return config


@pytest.mark.parametrize("name", ["paper.yaml", "one-gpu.yaml"])
def test_the_gpu_tiers_have_no_mismatch_on_an_80_gb_or_a_141_gb_gpu(name):
    table = plan_table(tier(name), {}, roomy, no_quota)
    assert set(table.gpu) == {"80 GB", "141 GB", "any"}
    assert {"train", "export_hf", "analyze_layer_error", "evaluate", "matrix"} <= set(table.job)
    assert table.ok.all(), table[~table.ok].to_string()
    # the H100's figures are the H200's derived, and say so
    train_80 = table[(table.job == "train") & (table.gpu == "80 GB") & (table.measure == "GPU-hours of the matrix")]
    train_141 = table[(table.job == "train") & (table.gpu == "141 GB") & (table.measure == "GPU-hours of the matrix")]
    assert train_80.needed.iloc[0] > train_141.needed.iloc[0]
    assert "H100 bound" in train_80.basis.iloc[0]


def test_a_config_made_to_mismatch_names_each_mismatch():
    config = tier(
        "paper.yaml",
        **{
            "analysis.batch_size": 4,
            "analysis.export_resources.mem_mb": 2000,
            "train.resources.retries": 0,
            "train.budget_gpu_hours": 1000,
        },
    )
    table = plan_table(config, {}, lambda path: Usage(10**12, 0, 10**11), no_quota)
    bad = table[~table.ok]
    found = {(row.job, row.gpu, row.measure.split(":")[0]) for row in bad.itertuples()}
    # medium's layer-error at batch 4 fits the 141 GB GPU, not the 80 GB one; the fix names the batch that fits
    assert ("analyze_layer_error", "80 GB", "GPU memory") in found
    assert ("analyze_layer_error", "141 GB", "GPU memory") not in found
    layer = bad[(bad.job == "analyze_layer_error") & (bad.measure == "GPU memory")]
    assert layer.fix.iloc[0] == "set analysis.batch_size to 2 (or run on a larger GPU)"
    assert ("export_hf", "80 GB", "host memory (skinny-tall)") in found
    # 100B tokens on 8 GPUs: more than one 48-hour job, with no retry to resume
    assert ("train", "141 GB", "medium-streamback") in found
    assert ("train", "80 GB", "GPU-hours of the matrix") in found and (
        "train",
        "141 GB",
        "GPU-hours of the matrix",
    ) in found
    assert any(row.job == "matrix" and not row.ok for row in bad.itertuples())  # 100 GB free: far too little
    assert all(bad.fix.str.len() > 0)


def test_the_matrix_disk_sums_the_paths_of_one_file_system_and_names_the_shortfall(tmp_path):
    """Two directories on one file system: their needs summed against its free space; the quota, where smaller,
    is the room."""
    a, b = tmp_path / "a", tmp_path / "b" / "deeper"  # b does not exist yet: its nearest existing parent counts
    a.mkdir()
    needs = {a: (30 * GB, "checkpoints"), b: (25 * GB, "models")}
    seen = []

    def usage(path):
        seen.append(Path(path))
        return Usage(100 * GB, 50 * GB, 50 * GB)

    (entry,) = matrix_disk(needs, usage, no_quota)
    assert entry["needed_bytes"] == 55 * GB and entry["free_bytes"] == 50 * GB
    assert not entry["passed"] and entry["shortfall_bytes"] == 5 * GB
    assert str(a) in entry["path"] and str(b) in entry["path"]
    (fits,) = matrix_disk({a: (30 * GB, "checkpoints")}, usage, no_quota)
    assert fits["passed"] and fits["shortfall_bytes"] == 0
    (quota,) = matrix_disk({a: (30 * GB, "checkpoints")}, usage, lambda path: (20 * GB, "lfs quota"))
    assert quota["free_bytes"] == 20 * GB and quota["shortfall_bytes"] == 10 * GB and "lfs quota" in quota["basis"]


# `lfs quota -u bob /mnt/lustre` as the Lustre manual documents it (kbytes, quota, limit, grace, files, ...)
LFS = """Disk quotas for usr bob (uid 6000):
     Filesystem  kbytes   quota   limit   grace   files   quota   limit   grace
    /mnt/lustre  7636560  10000000 12000000       -   51234       0       0       -
"""
# a long file system name puts the figures on the next line; '*' marks a figure over its quota
LFS_WRAPPED = """Disk quotas for usr bob (uid 6000):
     Filesystem  kbytes   quota   limit   grace   files   quota   limit   grace
/lustre/scratch/projects/streamback
                 10200000*  10000000 12000000   6d23h   51234       0       0       -
"""
LFS_NONE = """Disk quotas for usr bob (uid 6000):
     Filesystem  kbytes   quota   limit   grace   files   quota   limit   grace
    /mnt/lustre  7636560       0       0       -   51234       0       0       -
"""


def test_lfs_quota_is_parsed_from_its_documented_output():
    assert parse_lfs_quota(LFS) == (10000000 - 7636560) * 1024  # the soft quota is the nearer bound
    assert parse_lfs_quota(LFS_WRAPPED) == 0  # over its soft quota: no room
    assert parse_lfs_quota(LFS_NONE) is None  # no limit set: no quota to count
    assert parse_lfs_quota("lfs: unknown option\n") is None


def test_the_preflight_table_fails_a_matrix_over_the_disk_naming_the_path_and_shortfall():
    config = tier("paper.yaml")
    needs = matrix_disk_needs(config, {}, 128256)
    # six runs of about 1.2-1.4B parameters, four checkpoints of 12 bytes a parameter each
    assert 350 * GB < needs[layout.CHECKPOINTS_DIR][0] < 450 * GB
    assert needs[layout.tokens_dir(config["data"])][0] == (10**11 + 10**8) * 4  # uint32 tokens, none written yet
    (line,) = disk_problems(config, {}, lambda path: Usage(10**12, 0, 500 * GB), no_quota)
    assert str(layout.CHECKPOINTS_DIR) in line and "more than the 500.0 GB there" in line
    shortfall = sum(n for n, _ in needs.values()) / GB - 500
    assert f"{shortfall:,.1f} GB more" in line
    assert disk_problems(config, {}, roomy, no_quota) == []


def test_a_preflights_measured_checkpoint_replaces_the_estimate():
    config = tier("paper.yaml")
    runs = run_matrix(config["train"])
    arm = next(iter(runs.values())).arm
    record = {"checks": [{"name": "disk", "values": {"checkpoint_bytes": 40 * GB}}]}
    base = matrix_disk_needs(config, {}, 128256)[layout.CHECKPOINTS_DIR][0]
    measured = matrix_disk_needs(config, {arm: record}, 128256)[layout.CHECKPOINTS_DIR][0]
    keep = config["train"]["checkpoint"]["keep"] + 1
    params = 1164608512  # skinny-tall at Llama 3's vocabulary: test_sizes checks the count against the model
    assert measured - base == keep * (40 * GB - 12 * params)


def test_streamback_plan_prints_each_mismatch_and_writes_the_table(tmp_path, capsys):
    """The command on a file merged over the default config, as `streamback check` takes them: the table at
    --out, one line per mismatch on stderr, and exit status 1 with --strict only."""
    import pandas as pd
    import yaml

    from streamback.cli import main

    merged = tmp_path / "mismatch.yaml"
    merged.write_text(yaml.safe_dump({"analysis": {"batch_size": 4}}))
    files = [str(ROOT / "config" / "paper.yaml"), str(merged)]
    assert main(["plan", *files, "--out", str(tmp_path / "plan.csv")]) == 0
    err = capsys.readouterr().err
    assert re.search(
        r"^plan: MISMATCH analyze_layer_error on 80 GB: GPU memory asked 72,000 MB, needs [\d,]+ MB: set "
        r"analysis.batch_size to 2 \(or run on a larger GPU\)$",
        err,
        re.MULTILINE,
    )
    assert "analyze_layer_error on 141 GB" not in err
    table = pd.read_csv(tmp_path / "plan.csv")
    assert list(table.columns) == ["job", "jobs", "gpu", "measure", "asked", "needed", "unit", "ok", "basis", "fix"]
    assert main(["plan", *files, "--out", str(tmp_path / "plan.csv"), "--strict"]) == 1


def test_a_preflights_projection_replaces_the_stated_cost_without_the_h100_bound():
    """An arm with a preflight record: its runs' hours are that projection, as measured on its GPUs (no bound on
    top); the other arms keep their share of the stated cost."""
    config = tier("paper.yaml")
    arm = "medium-baseline"
    record = {
        "device": "NVIDIA H100 80GB HBM3",
        "kernels": "native bf16 on cuda",
        "checks": [
            {"name": "speed", "values": {"projected_hours": 800.0}},
            {"name": "memory", "values": {"available_bytes": 85 * 10**9}},
        ],
    }
    table = plan_table(config, {arm: record}, roomy, no_quota)
    assert "NVIDIA H100 80GB HBM3" in set(table.gpu)  # the measured GPU is planned for too
    row = table[(table.gpu == "80 GB") & (table.measure == f"{arm}: jobs of 2880 min")].iloc[0]
    assert row.basis.startswith("800.0 GPU-hours on 8 GPUs (the preflight of medium-baseline on NVIDIA H100")
    assert row.needed == 3  # 100 hours on 8 GPUs: three 48-hour jobs
