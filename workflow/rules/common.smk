# Shared helpers for the rule files: how rules call the CLI and pass their config section.

import json
import shlex

# Rules run `python -m streamback <stage>` with the repository on PYTHONPATH, so the same rule
# works in the user's environment and in the per-family conda environments of envs/.
shell.prefix(f"export PYTHONPATH={shlex.quote(workflow.basedir)}${{PYTHONPATH:+:$PYTHONPATH}}; set -euo pipefail; ")
STREAMBACK = "python -m streamback"

# Each rule file appends the final outputs of its stage; `rule all` asks for all of them.
TARGETS = []


def params_json(section):
    """A config section as a shell-quoted JSON argument for `--params`."""
    return shlex.quote(json.dumps(config[section], sort_keys=True))
