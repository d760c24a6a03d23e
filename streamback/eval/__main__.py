"""`python -m streamback.eval [lm-eval's arguments]`: lm-eval's own command line with the `streamback`
model registered (lm-eval finds no model outside its package by itself), e.g.

    python -m streamback.eval --model streamback --model_args pretrained=results/runs/<run>/model.pt \\
        --include_path streamback/eval/tasks --tasks streamback_cloze --output_path results/lm-eval --log_samples

`--help` ends with the streamback model's arguments; an error of the project (a bad model
argument, an unreadable model file, a tokenizer of another corpus) is one line and status 2.
"""

import sys

from lm_eval.__main__ import cli_evaluate

import streamback.eval.lm  # noqa: F401  (registers the model)
from streamback.errors import StreambackError
from streamback.eval.lm import model_arguments_help

try:
    cli_evaluate()
except SystemExit:
    if any(arg in ("-h", "--help") for arg in sys.argv[1:]):
        print("\n" + model_arguments_help())
    raise
except StreambackError as err:
    print(f"python -m streamback.eval: error: {err}", file=sys.stderr)
    sys.exit(2)
