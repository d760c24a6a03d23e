"""The `streamback` model of lm-evaluation-harness: a trained run scored with the project's own
forward pass, so a StreamBack model is evaluated with its trained stream format and a baseline
with its bf16 stream, each in bf16 compute as trained.

A thin adapter over `streamback.eval.scoring.Scorer` (which does the batching, the sharing of
identical model inputs, the rolling windows and greedy generation with a key/value cache). Its
model arguments, with their defaults, are `MODEL_ARGUMENTS` (`python -m streamback.eval --help`
prints them). Requests are scored task by task: a batch never mixes two tasks, so a task's
numbers do not depend on which other tasks run beside it (see docs/stages/eval.md on bf16 and batches).

From Python (importing this module registers the model):

    import lm_eval, streamback.eval.lm
    from lm_eval.tasks import TaskManager
    from streamback.eval.taskload import TASKS_DIR
    results = lm_eval.simple_evaluate(
        model="streamback", model_args={"pretrained": "results/runs/tiny-medium-baseline/model.pt"},
        tasks=["streamback_pairs_agreement"], task_manager=TaskManager(include_path=str(TASKS_DIR)))

From the shell, lm-eval's own command line with this model registered:

    python -m streamback.eval --model streamback --model_args pretrained=results/runs/tiny-medium-baseline/model.pt \\
        --include_path streamback/eval/tasks --tasks streamback_pairs_agreement --output_path results/lm-eval
        --log_samples
"""

from __future__ import annotations

from pathlib import Path

import torch
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs

from streamback.errors import StreambackError
from streamback.eval.scoring import Scorer, open_run
from streamback.model.formats import StreamFormat
from streamback.model.model import count_params
from streamback.model.weights import DTYPES
from streamback.progress import Progress, on_terminal

DEFAULT_BATCH_SIZE = 64
MODEL_ARGUMENTS = {  # name: what it is, with its default (`--model_args name=value,...`)
    "pretrained": "the model file, results/runs/<run>/model.pt (required)",
    "tokens": "the token directory of the run's corpus, whose manifest names the tokenizer (default: the one, "
    "in the results directory the model file lies in or in the repository's, whose corpus the model file records)",
    "tokenizer": "the same as tokens (the hf backend's name for it); either also takes the tokenizer.json, "
    "or a directory holding the corpus's tokenizer.json (an export-hf directory)",
    "stream": "a stream format to keep the stream in instead of the trained one, e.g. bf16, fp32, mxfp8, nvfp4_sr "
    "(default: as trained)",
    "dtype": f"compute dtype, one of {', '.join(DTYPES)} (default: as trained, bfloat16; float32 for a reference)",
    "batch_size": f"sequences per forward pass, a number: no 'auto' (default: {DEFAULT_BATCH_SIZE}; lm-eval's "
    "command line passes its --batch_size, whose default is 1)",
    "max_length": "context window in tokens (default: the model's max_seq_len, also its limit)",
    "device": "torch device (default, and when CUDA is asked for but absent: cuda if available, else cpu)",
    "max_batch_size": "accepted and ignored (lm-eval's CLI passes it; there is no automatic batch size)",
}


def model_arguments_help() -> str:
    """MODEL_ARGUMENTS as the lines `python -m streamback.eval --help` ends with."""
    width = max(map(len, MODEL_ARGUMENTS))
    return "\n".join(
        [
            "the streamback model's arguments (--model streamback --model_args name=value,...):",
            *(f"  {name:<{width}}  {text}" for name, text in MODEL_ARGUMENTS.items()),
        ]
    )


def _whole_number(name: str, value, default: int | None) -> int | None:
    if value is None:
        return default
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, str))
        or not str(value).strip().isdigit()
        or int(value) < 1
    ):
        raise StreambackError(
            f"streamback model: {name}={value!r} must be a positive whole number"
            + (" (no 'auto')" if name == "batch_size" else "")
        )
    return int(value)


def _directory(path: str) -> Path:
    """The directory a tokens= or tokenizer= value names (a file's is the one it lies in)."""
    return Path(path).parent if Path(path).is_file() else Path(path)


def _by_task(requests) -> dict[str, list[int]]:
    """Indices of the requests of each task, in order (lm-eval's Instance.task_name)."""
    groups: dict[str, list[int]] = {}
    for i, request in enumerate(requests):
        groups.setdefault(getattr(request, "task_name", None) or "", []).append(i)
    return groups


@register_model("streamback")
class StreambackLM(TemplateLM):
    """A trained run as an lm-eval model (its arguments: MODEL_ARGUMENTS). A bad argument is a
    StreambackError naming it (`python -m streamback.eval` prints it as one line)."""

    def __init__(
        self,
        pretrained: str | None = None,
        tokens: str | None = None,
        tokenizer: str | None = None,
        stream: str | None = None,
        dtype: str | None = None,
        batch_size: int | str | None = None,
        max_length: int | str | None = None,
        device: str | None = None,
        max_batch_size: int | None = None,
        **unknown,
    ):
        super().__init__()
        if unknown:
            raise StreambackError(
                f"streamback model: unknown argument{'s' * (len(unknown) > 1)} {', '.join(map(repr, unknown))} in "
                f"model_args; "
                f"it takes {', '.join(MODEL_ARGUMENTS)} (python -m streamback.eval --help)"
            )
        if not pretrained:
            raise StreambackError(
                "streamback model: pretrained= is required: the model file, e.g. pretrained=results/runs/<run>/model.pt"
            )
        if tokens is not None and tokenizer is not None and _directory(tokens) != _directory(tokenizer):
            raise StreambackError(
                f"streamback model: tokens={tokens} and tokenizer={tokenizer} name two directories; give one"
            )
        if dtype is not None and dtype not in DTYPES:
            raise StreambackError(f"streamback model: dtype={dtype!r} is not one of {', '.join(DTYPES)}")
        if stream is not None:
            try:
                StreamFormat.parse(stream)
            except StreambackError as err:
                raise StreambackError(f"streamback model: stream={stream!r}: {err}") from None
        batch, length = (
            _whole_number("batch_size", batch_size, DEFAULT_BATCH_SIZE),
            _whole_number("max_length", max_length, None),
        )
        if device is None or (
            str(device).startswith("cuda") and not torch.cuda.is_available()
        ):  # lm-eval's CLI passes "cuda" by default
            device = "cuda" if torch.cuda.is_available() else "cpu"
        try:
            self._device = torch.device(device)
        except (RuntimeError, TypeError) as err:
            raise StreambackError(f"streamback model: device={device!r} is not a torch device ({err})") from None
        tokens = tokens if tokens is not None else tokenizer
        try:
            self.run = open_run(pretrained, tokens)
        except StreambackError as err:
            raise StreambackError(f"streamback model: {err}") from None
        self.model = self.run.model(compute_dtype=DTYPES[dtype] if dtype else None, stream=stream, device=self._device)
        try:
            self.scorer = Scorer(self.model, self.run.tokenizer, self.run.eos_id, batch_size=batch, max_length=length)
        except StreambackError as err:
            raise StreambackError(f"streamback model: {err}") from None
        self._task = ""  # the task whose requests are being scored (progress lines name it)

    # -- what lm-eval asks of a model ---------------------------------------------------------
    @property
    def eot_token_id(self) -> int:
        return self.run.eos_id

    @property
    def max_length(self) -> int:
        return self.scorer.max_length

    @property
    def tokenizer_name(self) -> str:
        return f"streamback-{self.run.manifest['tokenizer']['sha256'][:16]}"

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        return self.scorer.encode(string)

    def _meter(self, kind: str, total: int | None, unit: str, disable_tqdm: bool) -> Progress:
        """Progress of one task's requests; in a log it always reports (plain lines)."""
        return Progress(f"{kind} {self._task}".strip(), total, unit=unit, active=not disable_tqdm or not on_terminal())

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        """lm-eval's (tokenize, then `_loglikelihood_tokens`), task by task; its tokenizing bar on a
        terminal only: made with tqdm(disable=False), it would write carriage returns into a log
        whatever the setting."""
        out: list[tuple[float, bool] | None] = [None] * len(requests)
        for task, members in _by_task(requests).items():
            self._task = task  # names the progress lines
            answers = super().loglikelihood(
                [requests[i] for i in members], disable_tqdm=disable_tqdm or not on_terminal()
            )
            for i, answer in zip(members, answers):
                out[i] = answer
        return out  # type: ignore[return-value]

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        meter = self._meter("loglikelihood", len(requests), "request", disable_tqdm)
        answers = self.scorer.loglikelihood(
            [(context, continuation) for _, context, continuation in requests], progress=meter
        )
        meter.close()
        for (request, _, _), answer in zip(requests, answers):
            if request is not None:
                self.cache_hook.add_partial("loglikelihood", request, answer)
        return answers

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        out: list[float | None] = [None] * len(requests)
        for task, members in _by_task(requests).items():
            self._task = task
            texts = [requests[i].args[0] for i in members]
            meter = self._meter("loglikelihood_rolling", None, "window", disable_tqdm)
            totals = self.scorer.rolling([self.tok_encode(text) for text in texts], progress=meter)
            meter.close()
            for i, text, total in zip(members, texts, totals):
                out[i] = total
                self.cache_hook.add_partial("loglikelihood_rolling", (text,), total)
        return out  # type: ignore[return-value]

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Greedy only; requests are run in groups of one task and equal generation arguments."""
        out: list[str | None] = [None] * len(requests)
        eos = self.scorer.tokenizer.decode([self.eot_token_id], skip_special_tokens=False)
        for task, in_task in _by_task(requests).items():
            self._task = task
            groups: dict[str, list[int]] = {}
            for i in in_task:
                groups.setdefault(repr(sorted(requests[i].args[1].items())), []).append(i)
            meter = self._meter("generate_until", len(in_task), "request", disable_tqdm)
            for members in groups.values():
                gen_kwargs = normalize_gen_kwargs(dict(requests[members[0]].args[1]), 256)
                if gen_kwargs.get("do_sample") or gen_kwargs.get("temperature", 0.0) > 0:
                    raise StreambackError(
                        f"streamback model: generation is greedy only, got {requests[members[0]].args[1]}"
                    )
                stop = handle_stop_sequences(gen_kwargs.get("until"), eos=eos)
                texts = self.scorer.generate(
                    [self.tok_encode(requests[i].args[0]) for i in members],
                    stop,
                    gen_kwargs["max_gen_toks"],
                    progress=meter,
                )
                for i, text in zip(members, texts):
                    out[i] = text
                    self.cache_hook.add_partial("generate_until", requests[i].args, text)
            meter.close()
        return out  # type: ignore[return-value]

    def get_model_info(self) -> dict:
        """Recorded in lm-eval's results.json under "config"."""
        run, model = self.run, self.model
        return {
            "model": "streamback",
            "model_args": {"pretrained": str(run.model_file), "tokens": str(run.tokens_dir)},
            "model_num_parameters": count_params(model),
            "model_dtype": str(model.compute_dtype),
            "streamback": {
                "run": run.name,
                "block": model.args.block,
                "stream": model.stream_format.label,
                "trained_stream": run.trained.stream,
                "tokenizer": str(run.tokenizer_file),
                "tokenizer_sha256": run.manifest["tokenizer"]["sha256"],
                "data_fingerprint": run.manifest["fingerprint"],
                "max_length": self.max_length,
                "batch_size": self.scorer.batch_size,
                "device": str(self._device),
            },
        }
