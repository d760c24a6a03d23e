"""The `streamback` model of lm-evaluation-harness: a trained run scored with the project's own
forward pass, so a StreamBack model is evaluated with its trained stream format and a baseline
with its bf16 stream, each in bf16 compute as trained.

A thin adapter over `streamback.eval.scoring.Scorer` (which does the batching, the sharing of
identical model inputs, the rolling windows and greedy generation). Model arguments:
`pretrained` (the model file, results/runs/<run>/model.pt), `tokens` (the token directory of the
run's corpus, whose manifest names the tokenizer; default: the default config's), `stream` (a
stream format label to use instead of the trained one), `dtype` (compute dtype, default as
trained: bfloat16; float32 for a reference), `batch_size` (sequences per forward, default 64),
`max_length` (context window, default the model's max_seq_len), `device` (default, and when
CUDA is asked for but absent: cuda if available, else cpu).

From Python (importing this module registers the model):

    import lm_eval, streamback.eval.lm
    from lm_eval.tasks import TaskManager
    from streamback.eval.taskdata import TASKS_DIR
    results = lm_eval.simple_evaluate(
        model="streamback", model_args={"pretrained": "results/runs/tiny-medium-baseline/model.pt"},
        tasks=["streamback_pairs_agreement"], task_manager=TaskManager(include_path=str(TASKS_DIR)))

From the shell, lm-eval's own command line with this model registered:

    python -m streamback.eval --model streamback --model_args pretrained=results/runs/tiny-medium-baseline/model.pt \\
        --include_path streamback/eval/tasks --tasks streamback_pairs_agreement --output_path results/lm-eval --log_samples
"""

from __future__ import annotations

import torch
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs

from streamback import layout
from streamback.errors import StreambackError
from streamback.eval.scoring import Scorer, open_run
from streamback.model.model import count_params
from streamback.model.weights import DTYPES
from streamback.progress import Progress, on_terminal


def _batch_size(value) -> int:
    if value is None:
        return 64
    try:
        return int(value)
    except ValueError:
        raise StreambackError(f"streamback model: batch_size must be a number of sequences, got {value!r} (no 'auto')") from None


@register_model("streamback")
class StreambackLM(TemplateLM):
    """A trained run as an lm-eval model (see the module docstring for its arguments)."""

    def __init__(self, pretrained: str, tokens: str | None = None, stream: str | None = None, dtype: str | None = None,
                 batch_size: int | str | None = None, max_length: int | str | None = None, device: str | None = None,
                 max_batch_size: int | None = None):
        super().__init__()
        if tokens is None:
            from streamback.config import load_config

            tokens = str(layout.tokens_dir(load_config()["data"]))
        if dtype is not None and dtype not in DTYPES:
            raise StreambackError(f"streamback model: dtype {dtype!r} is not one of {', '.join(DTYPES)}")
        self.run = open_run(pretrained, tokens)
        if device is None or (str(device).startswith("cuda") and not torch.cuda.is_available()):  # lm-eval's CLI passes "cuda" by default
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self._device = torch.device(device)
        self.model = self.run.model(compute_dtype=DTYPES[dtype] if dtype else None, stream=stream, device=self._device)
        self.scorer = Scorer(self.model, self.run.tokenizer, self.run.eos_id, batch_size=_batch_size(batch_size),
                             max_length=int(max_length) if max_length is not None else None)

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

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        """lm-eval's (tokenize, then `_loglikelihood_tokens`), its tokenizing bar on a terminal only:
        made with tqdm(disable=False), it would write carriage returns into a log whatever the setting."""
        return super().loglikelihood(requests, disable_tqdm=disable_tqdm or not on_terminal())

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        # in a log the meter always reports (plain lines; `loglikelihood` quiets only lm-eval's bar there)
        meter = Progress("loglikelihood", len(requests), unit="request", active=not disable_tqdm or not on_terminal())
        answers = self.scorer.loglikelihood([(context, continuation) for _, context, continuation in requests], progress=meter)
        meter.close()
        for (request, _, _), answer in zip(requests, answers):
            if request is not None:
                self.cache_hook.add_partial("loglikelihood", request, answer)
        return answers

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        texts = [request.args[0] for request in requests]
        meter = Progress("loglikelihood_rolling", None, unit="window", active=not disable_tqdm)
        totals = self.scorer.rolling([self.tok_encode(text) for text in texts], progress=meter)
        meter.close()
        for text, total in zip(texts, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", (text,), total)
        return totals

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Greedy only; requests are run in groups of equal generation arguments."""
        out: list[str | None] = [None] * len(requests)
        groups: dict[str, list[int]] = {}
        for i, request in enumerate(requests):
            groups.setdefault(repr(sorted(request.args[1].items())), []).append(i)
        eos = self.scorer.tokenizer.decode([self.eot_token_id], skip_special_tokens=False)
        meter = Progress("generate_until", len(requests), unit="request", active=not disable_tqdm)
        for members in groups.values():
            gen_kwargs = normalize_gen_kwargs(dict(requests[members[0]].args[1]), 256)
            if gen_kwargs.get("do_sample") or gen_kwargs.get("temperature", 0.0) > 0:
                raise StreambackError(f"streamback model: generation is greedy only, got {requests[members[0]].args[1]}")
            stop = handle_stop_sequences(gen_kwargs.get("until"), eos=eos)
            texts = self.scorer.generate([self.tok_encode(requests[i].args[0]) for i in members], stop, gen_kwargs["max_gen_toks"])
            for i, text in zip(members, texts):
                out[i] = text
                self.cache_hook.add_partial("generate_until", requests[i].args, text)
            meter.update(len(members))
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
                "run": run.name, "block": model.args.block, "stream": model.stream_format.label,
                "trained_stream": run.trained.stream, "tokenizer": str(run.tokenizer_file),
                "tokenizer_sha256": run.manifest["tokenizer"]["sha256"], "data_fingerprint": run.manifest["fingerprint"],
                "max_length": self.max_length, "batch_size": self.scorer.batch_size, "device": str(self._device),
            },
        }
