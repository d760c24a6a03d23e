"""`python -m streamback.eval [lm-eval's arguments]`: lm-eval's own command line with the `streamback`
model registered (lm-eval finds no model outside its package by itself), e.g.

    python -m streamback.eval --model streamback --model_args pretrained=results/runs/<run>/model.pt \\
        --include_path streamback/eval/tasks --tasks streamback_cloze --output_path results/lm-eval --log_samples
"""

import streamback.eval.lm  # noqa: F401  (registers the model)
from lm_eval.__main__ import cli_evaluate

cli_evaluate()
