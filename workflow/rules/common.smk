# Shared helpers for the rule files: how rules call the CLI and pass their config section.

import json
import shlex
import sys

from snakemake.settings.types import DeploymentMethod

# Rules run `python -m streamback <stage>` with the repository on PYTHONPATH. With --use-conda
# that is the python of the rule's environment (envs/); otherwise it is the interpreter running
# Snakemake, so an un-activated venv (`.venv/bin/snakemake`) works as well as an activated one.
shell.prefix(f"export PYTHONPATH={shlex.quote(workflow.basedir)}${{{{PYTHONPATH:+:$PYTHONPATH}}}}; set -euo pipefail; ")
if DeploymentMethod.CONDA in workflow.deployment_settings.deployment_method:
    PYTHON = "python"
else:
    PYTHON = shlex.quote(sys.executable)
STREAMBACK = f"{PYTHON} -m streamback"

# Each rule file appends the final outputs of its stage; `rule all` asks for all of them.
TARGETS = []


def params_json(section):
    """A config section as a shell-quoted JSON argument for `--params`."""
    return shlex.quote(json.dumps(config[section], sort_keys=True))
