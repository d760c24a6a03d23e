"""Scoring text with a trained run: log-likelihoods, rolling-window log-likelihoods and greedy
continuations, batched, through the model's own forward pass.

The engine under the `streamback` lm-eval model (`streamback.eval.lm`, a thin adapter); it imports
no lm-eval, so a bare GPU node (benchmarks/gpu_checks.py) can time it. It follows the conventions
of lm-eval's `hf` backend, so the two give the same numbers on the same model:
- a request is (context tokens, continuation tokens); the model reads (context + continuation),
  left-truncated to max_length + 1 tokens, without its last token, and the continuation is scored
  at the last len(continuation) positions; `is_greedy` says whether every continuation token is
  the argmax there;
- requests are sorted by length, longest first, right-padded (attention is causal, so padding on
  the right never reaches an earlier position) and run `batch_size` at a time, one forward each;
- requests whose model input is the same token sequence share one row of a batch (lm-eval's
  cache of one-token continuations, here for any continuation: the choices of a multiple-choice
  item that differ only in their last token cost one row);
- rolling log-likelihood: lm-eval's disjoint windows of max_length tokens, the first conditioned
  on the end-of-text token, scored as requests in the same batches;
- greedy generation: the argmax token is appended until a stop string, the end-of-text token or
  max_new_tokens; rows of different lengths are right-padded, the contexts run once and each new
  token is one step of the rows still running with a key/value cache (`streamback.eval.decode`).

`open_run` reads a trained run and its tokenizer (from the run's data manifest) and checks that
they belong together before anything is scored; a `Scorer` itself needs no tokenizer library
when given token ids.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from streamback import layout
from streamback.config import ROOT, load_config
from streamback.data import tokenizer as tk
from streamback.data.shards import file_sha256
from streamback.errors import StreambackError
from streamback.eval.decode import CachedDecoder
from streamback.model.weights import TrainedModel, check_corpus, load_model, read_model

Request = tuple[Sequence[int], Sequence[int]]  # (context tokens, continuation tokens)


@dataclass
class Run:
    """A trained run and the tokenizer of the corpus it was trained on."""

    name: str
    model_file: Path
    tokens_dir: Path
    trained: TrainedModel
    manifest: dict
    tokenizer: object  # tokenizers.Tokenizer
    tokenizer_file: Path

    @property
    def eos_id(self) -> int:
        return self.manifest["eos_id"]

    def model(self, compute_dtype: torch.dtype | None = None, stream: str | None = None, device="cpu"):
        """The Transformer, ready for evaluation: as trained by default (bf16 compute, its stream).
        Its parameters are held in the compute dtype: the values the forward would cast them to at
        every use (the model's outputs are bit for bit the same), without the cast, which costs
        bf16 scoring and generation half their time on a CPU."""
        model = load_model(self.trained, compute_dtype=compute_dtype, stream=stream, device=device)
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.data = parameter.data.to(model.compute_dtype)
        return model


def open_run(model_file: str | Path, tokens_dir: str | Path | None = None) -> Run:
    """Read a trained model and the tokenizer of its corpus (`tokens_dir`/manifest.json names it;
    None: `find_tokens_dir`), checked to belong together (`weights.check_corpus`) before anything
    is scored."""

    model_file = Path(model_file)
    trained = read_model(model_file)
    tokens_dir = (
        token_dir_of(Path(tokens_dir), model_file, trained)
        if tokens_dir is not None
        else find_tokens_dir(model_file, trained)
    )
    manifest, tokenizer_file = check_corpus(trained, model_file, tokens_dir)
    if trained.data is None:
        warnings.warn(
            f"{model_file} does not record the corpus it was trained on: only the tokenizer's vocabulary size was "
            f"checked",
            stacklevel=2,
        )
    return Run(
        model_file.parent.name, model_file, tokens_dir, trained, manifest, tk.load_file(tokenizer_file), tokenizer_file
    )


def token_dir_of(path: Path, model_file: Path, trained: TrainedModel) -> Path:
    """The token directory that `path` names: a token directory itself (it holds manifest.json),
    its tokenizer file, or a tokenizer outside one (a tokenizer.json, or a directory holding one,
    e.g. a `streamback export-hf` directory), whose corpus is then looked for as `find_tokens_dir`
    does and must have been tokenized with that very tokenizer. Anything else: StreambackError."""
    directory = path.parent if path.is_file() else path
    if not path.exists():
        raise StreambackError(
            f"{path} does not exist: give the token directory of the model's corpus, or its tokenizer.json"
        )
    if (directory / "manifest.json").is_file():
        return directory
    tokenizer_file = path if path.is_file() else path / "tokenizer.json"
    if not tokenizer_file.is_file():
        raise StreambackError(
            f"{path} is neither a token directory (it has no manifest.json) nor a tokenizer.json or a directory "
            "holding one: give the token directory of the model's corpus"
        )
    found = find_tokens_dir(model_file, trained)
    recorded = json.loads((found / "manifest.json").read_text())["tokenizer"]["sha256"]
    if file_sha256(tokenizer_file) != recorded:
        raise StreambackError(
            f"tokenizer {tokenizer_file} is not the one of {found}, the corpus {model_file} was trained on "
            "(sha256 differs): give that corpus's token directory"
        )
    return found


def find_tokens_dir(model_file: Path, trained: TrainedModel) -> Path:
    """The token directory of the corpus a model file records, for a caller that names none. Looked
    for where results/ is, never in the working directory as such: in the results directory the
    model file lies in (<dir>/results/runs/<run>/model.pt), then in the repository's; there, the
    default config's token directory and every results/tokens/<corpus>/ are candidates, and the
    one whose manifest has the fingerprint the model file records is taken (a model file without
    that record takes the default config's directory)."""

    default = layout.tokens_dir(load_config()["data"])
    model_file = model_file.resolve()
    runs = layout.run_dir("x").parent.parts  # ("results", "runs")
    bases = [model_file.parents[3]] if model_file.parents[1].parts[-len(runs) :] == runs else []
    bases += [ROOT] if ROOT not in bases else []
    candidates = [
        d
        for base in bases
        for d in (base / default, *sorted(p.parent for p in (base / layout.RESULTS / "tokens").glob("*/manifest.json")))
    ]
    for directory in dict.fromkeys(candidates):
        try:
            fingerprint = json.loads((directory / "manifest.json").read_text()).get("fingerprint")
        except (OSError, ValueError, AttributeError):
            continue
        if trained.data is None or fingerprint == trained.data.get("fingerprint"):
            return directory
    wanted = (
        f"the corpus {model_file} was trained on (fingerprint {trained.data.get('fingerprint')})"
        if trained.data
        else "a tokenized corpus"
    )
    raise StreambackError(
        f"no token directory was given, and none of {', '.join(str(b / layout.RESULTS / 'tokens') for b in bases)} "
        f"holds {wanted}: give its token directory"
    )


def rolling_windows(tokens: Sequence[int], prefix_token: int, max_length: int) -> list[tuple[list[int], list[int]]]:
    """lm-eval's disjoint rolling windows of a token list (`get_rolling_token_windows` with
    context_len=1, then `make_disjoint_window`) as (context, continuation) requests: every token is
    scored once, the first window after `prefix_token`, each later one with max_length tokens of context."""
    tokens = list(tokens)
    if not tokens:
        return []
    first = min(max_length, len(tokens))
    windows = [([prefix_token], tokens[:first])]
    scored = first
    while scored < len(tokens):
        size = min(len(tokens) - scored, max_length)
        end = scored + size
        window = tokens[end - max_length - 1 : end - 1]
        windows.append((window[: len(window) - (size - 1)], tokens[end - size : end]))
        scored = end
    return windows


class Scorer:
    """Scores requests with `model` (a Transformer in eval mode) `batch_size` sequences at a time,
    on contexts of at most `max_length` tokens (default and limit: the model's max_seq_len)."""

    def __init__(self, model, tokenizer, eos_id: int, batch_size: int = 64, max_length: int | None = None):
        limit = model.args.max_seq_len
        if max_length is not None and not 1 <= max_length <= limit:
            raise StreambackError(f"max_length {max_length} must be between 1 and the model's max_seq_len {limit}")
        if batch_size < 1:
            raise StreambackError(f"batch_size must be positive, got {batch_size}")
        self.model, self.tokenizer, self.eos_id = model, tokenizer, eos_id
        self.batch_size, self.max_length = batch_size, max_length or limit
        self.device = next(model.parameters()).device

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, without special tokens (the tokenizer adds none)."""
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    @torch.inference_mode()
    def loglikelihood(self, requests: Sequence[Request], progress=None) -> list[tuple[float, bool]]:
        """(log-probability of the continuation given the context in nats, is_greedy) per request;
        `progress` (a streamback.progress.Progress) counts the requests done."""
        width = self.max_length
        rows: dict[tuple[int, ...], list[int]] = {}
        for i, (context, continuation) in enumerate(requests):
            if not len(context) or not len(continuation):
                raise StreambackError(
                    f"request {i}: the context and the continuation must each hold at least one token"
                )
            if len(continuation) > width:
                raise StreambackError(
                    f"request {i}: a continuation of {len(continuation)} tokens does not fit max_length {width}"
                )
            whole = [*context, *continuation]
            rows.setdefault(tuple(whole[-(width + 1) : -1]), []).append(i)
        inputs = sorted(rows, key=lambda seq: (-len(seq), seq))
        out: list[tuple[float, bool] | None] = [None] * len(requests)
        for start in range(0, len(inputs), self.batch_size):
            batch = inputs[start : start + self.batch_size]
            tokens = torch.zeros((len(batch), len(batch[0])), dtype=torch.long)
            for b, seq in enumerate(batch):
                tokens[b, : len(seq)] = torch.tensor(seq)
            logits = self.model(tokens.to(self.device))
            members = [(b, i) for b, seq in enumerate(batch) for i in rows[seq]]
            row, pos, target, owner = [], [], [], []
            for k, (b, i) in enumerate(members):
                continuation, end = requests[i][1], len(batch[b])
                row += [b] * len(continuation)
                pos += range(end - len(continuation), end)
                target += continuation
                owner += [k] * len(continuation)
            picked = logits[torch.tensor(row, device=self.device), torch.tensor(pos, device=self.device)].float()
            target_t, owner_t = torch.tensor(target, device=self.device), torch.tensor(owner, device=self.device)
            token_ll = torch.log_softmax(picked, dim=-1).gather(1, target_t[:, None]).squeeze(1).double()
            ll = torch.zeros(len(members), dtype=torch.float64, device=self.device).index_add_(0, owner_t, token_ll)
            misses = torch.zeros(len(members), dtype=torch.long, device=self.device).index_add_(
                0, owner_t, (picked.argmax(-1) != target_t).long()
            )
            for k, (ll_k, miss_k) in enumerate(zip(ll.tolist(), misses.tolist())):
                out[members[k][1]] = (ll_k, miss_k == 0)
            if progress is not None:
                progress.update(len(members))
        return out  # type: ignore[return-value]

    def rolling(self, token_lists: Sequence[Sequence[int]], progress=None) -> list[float]:
        """Log-likelihood (nats) of each whole token list over disjoint max_length windows
        (`progress` counts the windows done)."""
        requests, owner = [], []
        for d, tokens in enumerate(token_lists):
            windows = rolling_windows(tokens, self.eos_id, self.max_length)
            requests += windows
            owner += [d] * len(windows)
        totals = [0.0] * len(token_lists)
        for d, (ll, _) in zip(owner, self.loglikelihood(requests, progress)):
            totals[d] += ll
        return totals

    @torch.inference_mode()
    def generate(
        self, contexts: Sequence[Sequence[int]], stop: Sequence[str] = (), max_new_tokens: int = 256, progress=None
    ) -> list[str]:
        """Greedy continuation of each context, cut before the first stop string, ended by the
        end-of-text token or after max_new_tokens tokens. Contexts are left-truncated to leave room.
        `progress` counts the contexts done (and says how many tokens were generated so far)."""
        room = self.max_length - max_new_tokens
        if room < 1:
            raise StreambackError(
                f"max_new_tokens {max_new_tokens} leaves no room for a context in max_length {self.max_length}"
            )
        if any(not len(c) for c in contexts):
            raise StreambackError("generation needs a non-empty context (start it with the end-of-text token)")
        contexts = [list(c)[-room:] for c in contexts]
        order = sorted(range(len(contexts)), key=lambda i: -len(contexts[i]))
        out = [""] * len(contexts)
        generated = 0
        for start in range(0, len(order), self.batch_size):
            batch = order[start : start + self.batch_size]
            lengths = torch.tensor([len(contexts[i]) for i in batch])
            tokens = torch.zeros((len(batch), int(lengths.max())), dtype=torch.long)
            for b, i in enumerate(batch):
                tokens[b, : lengths[b]] = torch.tensor(contexts[i])
            decoder = CachedDecoder(
                self.model, tokens.to(self.device), lengths, int(lengths.max()) + max_new_tokens - 1
            )
            new: list[list[int]] = [[] for _ in batch]
            running = list(range(len(batch)))  # the batch rows still generating, in the decoder's row order
            for step in range(max_new_tokens):
                next_ids = decoder.logits.argmax(-1)
                kept = []  # indices into `running` of the rows that go on
                for k, (b, token) in enumerate(zip(running, next_ids.tolist())):
                    if token != self.eos_id:
                        new[b].append(token)
                        generated += 1
                        if step < max_new_tokens - 1 and not any(s and s in self.decode(new[b]) for s in stop):
                            kept.append(k)
                            continue
                    if progress is not None:
                        progress.update(1, f"{generated:,} tokens generated")
                if not kept:
                    break
                if len(kept) < len(running):
                    decoder.keep(kept)
                    running, next_ids = [running[k] for k in kept], next_ids[kept]
                decoder.step(next_ids)
                if progress is not None:
                    progress.update(0, f"{generated:,} tokens generated")
            for b, i in enumerate(batch):
                text = self.decode(new[b])
                for s in stop:
                    if s:
                        text = text.split(s)[0]
                out[i] = text
        return out
