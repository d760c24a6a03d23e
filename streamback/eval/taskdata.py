"""`streamback eval-tasks`: the items of the offline default's local lm-eval tasks, drawn from the
embedded corpus generator (rule eval_tasks), never from the hub.

The tasks are lm-eval YAML files in streamback/eval/tasks/ (`taskload.TASKS_DIR`), which lm-eval loads
through its own TaskManager (`include_path`); each reads its items from
results/eval/tasks/<task>.jsonl (`layout.eval_task_file`), written here:
- `streamback_pairs_agreement`, `streamback_pairs_brackets`, `streamback_pairs_counting`: the
  grammar's minimal pairs (`corpus.minimal_pairs`; agreement pools its five phenomena) as
  multiple choice in BLiMP's form: both sentences scored whole after the end-of-text token, the
  grammatical one should score higher (acc);
- `streamback_cloze`: the last word of a held-out story given all of the story before it
  (LAMBADA's form: acc = the word is the greedy continuation; perplexity of the word);
- `streamback_perplexity`: held-out stories scored whole with `loglikelihood_rolling` (word and
  byte perplexity, bits per byte).

Held out: every item is drawn with `eval.local.seed`, which must differ from the training corpus's
`data.synthetic.seed` (a story is a pure function of (seed, index), so another seed gives stories
no model was trained on; this command refuses the corpus's seed). Cloze stories are indices
[0, documents) of that seed, perplexity stories [documents, 2 documents).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from streamback import layout
from streamback.config import add_config_arguments, section_from_args
from streamback.data.corpus import PHENOMENA, document_text, minimal_pairs
from streamback.errors import StreambackError
from streamback.io import write_text

HELP = "write the items of the local lm-eval tasks (minimal pairs, cloze, perplexity) from the corpus generator"

PAIR_GROUPS = {
    "streamback_pairs_agreement": tuple(p for p in PHENOMENA if p.startswith("agreement")),
    "streamback_pairs_brackets": ("brackets",),
    "streamback_pairs_counting": ("counting",),
}
LOCAL_TASKS = (*PAIR_GROUPS, "streamback_cloze", "streamback_perplexity")
_LAST_WORD = re.compile(r"([A-Za-z]+)[^A-Za-z]*$")


def cloze_item(text: str) -> dict:
    """A story cut before its last word: {"text", "context", "target"}; the target carries the
    space before the word (lm-eval scores the continuation as given)."""
    match = _LAST_WORD.search(text)
    if match is None:
        raise ValueError(f"no word in {text!r}")
    start = match.start(1)
    cut = start - 1 if start and text[start - 1] == " " else start
    return {"text": text, "context": text[:cut], "target": text[cut : match.end(1)]}


def task_items(task: str, local: dict) -> list[dict]:
    """The items of one local task for the `eval.local` settings (seed, pairs, documents). Every
    field the task YAML reads is stored as it is read (`context`, `choices`, `label`, `target`,
    `text`), so lm-eval renders no template per item (a Jinja compile each, the bulk of its time)."""
    seed, docs = local["seed"], local["documents"]
    if task in PAIR_GROUPS:
        return [
            {
                "phenomenon": p.phenomenon,
                "sentence_good": p.good,
                "sentence_bad": p.bad,
                "context": "",
                "choices": [p.good, p.bad],
                "label": 0,
            }
            for phenomenon in PAIR_GROUPS[task]
            for p in minimal_pairs(phenomenon, local["pairs"], seed)
        ]
    if task == "streamback_cloze":
        return [cloze_item(document_text(seed, i)) for i in range(docs)]
    if task == "streamback_perplexity":
        return [{"context": "", "text": document_text(seed, i)} for i in range(docs, 2 * docs)]
    raise StreambackError(f"{task!r} is not a local task ({', '.join(LOCAL_TASKS)})")


def write_tasks(tasks: list[str], local: dict, corpus_seed: int | None = None) -> list[Path]:
    """Write results/eval/tasks/<task>.jsonl for each local task in `tasks`; returns the paths."""
    if corpus_seed is not None and local["seed"] == corpus_seed:
        raise StreambackError(
            f"eval.local.seed {local['seed']} is the training corpus's seed (data.synthetic.seed): "
            "its stories would not be held out; choose another"
        )
    paths = []
    for task in tasks:
        path = layout.eval_task_file(task)
        write_text(path, "".join(json.dumps(item, sort_keys=True) + "\n" for item in task_items(task, local)))
        paths.append(path)
    return paths


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser, "eval")
    parser.add_argument(
        "--corpus-seed",
        type=int,
        default=None,
        help="the training corpus's seed (data.synthetic.seed), which the items must avoid",
    )


def run(args: argparse.Namespace) -> int:
    cfg = section_from_args(args, "eval")
    tasks = [t for t in cfg["tasks"] if t in LOCAL_TASKS]
    for path in write_tasks(tasks, cfg["local"], args.corpus_seed):
        print(f"eval-tasks: wrote {path} ({sum(1 for _ in path.open())} items)")
    return 0
