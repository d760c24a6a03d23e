"""Tokenizers for the data stage: train a byte-level BPE, or load one (hub id or tokenizer.json).

The paper's config loads the Llama 3 tokenizer by hub id (`meta-llama/Meta-Llama-3-8B`, a gated
repository: accept its license on huggingface.co and export HF_TOKEN=<your access token>); the
default config trains a small byte-level BPE on the training split of the synthetic corpus.
Either way the tokenizer is saved as `tokenizer.json` beside the shards and identified by the
sha256 of that file.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from streamback.data.hubcache import FETCH_HINT
from streamback.errors import StreambackError

BPE_EOS = "<|endoftext|>"
# End-of-document tokens of common tokenizers, tried in order when `eos_token` is not set.
EOS_CANDIDATES = ("<|end_of_text|>", "<|endoftext|>", "</s>", "<eos>", "<|im_end|>")


def train_bpe(texts: Iterable[str], vocab_size: int, eos_token: str = BPE_EOS) -> Tokenizer:
    """A byte-level BPE (GPT-2 style: any byte sequence encodes, no unknown token) trained on
    `texts`, with `eos_token` as its only special token (id 0). Deterministic for the same texts.
    The vocabulary stops short of `vocab_size` when the texts have fewer distinct merges."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[eos_token],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    return tokenizer


def load_file(path: str | Path) -> Tokenizer:
    """A tokenizer from a `tokenizer.json` file."""
    path = Path(path)
    if not path.is_file():
        raise StreambackError(f"tokenizer file {path} does not exist")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as err:  # tokenizers raises a bare Exception for unparsable files
        raise StreambackError(f"tokenizer file {path} cannot be loaded: {err}") from None


def load_hub(repo_id: str, revision: str | None) -> tuple[Tokenizer, str]:
    """The `tokenizer.json` of a hub model repository, and the commit it came from.

    Uses the Hugging Face cache; HF_TOKEN in the environment authenticates gated repositories
    (Llama 3). Offline (HF_HUB_OFFLINE=1: every job of a config with a `hub_cache` but `fetch`,
    streamback.data.hubcache) only what the cache holds is read, and a file it lacks is named with
    `snakemake fetch`."""
    from huggingface_hub import constants, hf_hub_download
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError

    try:
        path = hf_hub_download(repo_id, "tokenizer.json", revision=revision)
    except GatedRepoError:
        raise StreambackError(
            f"tokenizer repository {repo_id} is gated: accept its license on https://huggingface.co/{repo_id} "
            "and export HF_TOKEN=<a read access token of that account>"
        ) from None
    except RepositoryNotFoundError:
        raise StreambackError(
            f"tokenizer repository {repo_id} not found on the hub (or private: export HF_TOKEN)"
        ) from None
    except LocalEntryNotFoundError as err:
        if constants.is_offline_mode():
            raise StreambackError(
                f"tokenizer.json of {repo_id} (revision {revision}) is not in the Hub cache {constants.HF_HUB_CACHE}; "
                f"{FETCH_HINT}"
            ) from None
        raise StreambackError(f"cannot fetch tokenizer.json of {repo_id} (revision {revision}): {err}") from None
    except (HfHubHTTPError, OSError) as err:
        raise StreambackError(f"cannot fetch tokenizer.json of {repo_id} (revision {revision}): {err}") from None
    commit = Path(path).parent.name  # the cache stores files under snapshots/<commit>/
    return load_file(path), commit


def eos_id(tokenizer: Tokenizer, eos_token: str | None, where: str) -> tuple[str, int]:
    """The end-of-document token and its id: `eos_token` if set, else the first of
    EOS_CANDIDATES the vocabulary holds. `where` names the tokenizer in errors."""
    candidates = (eos_token,) if eos_token else EOS_CANDIDATES
    for token in candidates:
        token_id = tokenizer.token_to_id(token)
        if token_id is not None:
            return token, token_id
    if eos_token:
        raise StreambackError(f"tokenizer {where} has no token {eos_token!r} (data.tokenizer.eos_token)")
    raise StreambackError(
        f"tokenizer {where} has none of the usual end-of-document tokens "
        f"{', '.join(EOS_CANDIDATES)}: set data.tokenizer.eos_token"
    )


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
