"""`snakemake --profile slurm` submits real jobs to a (local, one-node) Slurm cluster.

.ci/run installs Debian's slurm-wlm and munge and starts the cluster with
tests/slurm/start-cluster.sh; on a machine without Slurm this test is skipped.
"""

import shutil
import subprocess

import pytest

from streamback import layout

from conftest import ROOT

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("sbatch") is None, reason="Slurm is not installed (see tests/slurm/)"),
]


def test_profile_submits_jobs_to_slurm(run_snakemake, tmp_path):
    small = tmp_path / "small.yaml"
    small.write_text("drift: {steps: 200, coords: 256, seeds: [0]}\n")
    subprocess.run(["bash", str(ROOT / "tests" / "slurm" / "start-cluster.sh")], check=True, timeout=120)
    result = run_snakemake(
        layout.DRIFT_DIR / layout.DRIFT_FILES["summary"],
        "--profile", "slurm",  # resolved from the working directory, the repository root
        # site settings a real cluster would put in the profile: this one has no accounting
        "--slurm-no-account", "--slurm-status-command", "squeue",
        "--slurm-init-seconds-before-status-checks", "1",
        "--directory", tmp_path,
        "--configfile", small,  # merged over config/config.yaml
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "has been submitted with SLURM jobid" in result.stderr
    assert (tmp_path / layout.DRIFT_DIR / layout.DRIFT_FILES["summary"]).stat().st_size > 0
    slurm_logs = list((tmp_path / "logs" / "slurm").rglob("*.log"))
    assert slurm_logs, "the profile's slurm-logdir holds the job's Slurm log"
