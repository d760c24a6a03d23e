"""The trained model's file (`results/runs/<run>/model.pt`): the one writer and reader.

A `torch.save`d dict, written atomically:
- `model_args`: `dataclasses.asdict(ModelArgs)`, the architecture, block and stream;
- `model`: the state dict, fp32 master weights under the model's own (TorchTitan's) names, no
  wrapper prefixes;
- `stream`: the label of the stream the model was trained with (`bf16` for the baseline at bf16
  compute, `fp32` for StreamBack, `mxfp8`, `nvfp4_sr`, ...);
- `compute_dtype`: the compute dtype it was trained in (`bfloat16`);
- `data`: the corpus it was trained on, `{"fingerprint", "tokenizer_sha256"}` of the data manifest
  (written by the trainer; `import-hf` records the tokenizer alone), so a reader can refuse the
  tokens of another corpus (`check_corpus`, the one check every reader of a model and tokens makes);
- `step`: the optimizer step the weights are of (written by the trainer: the final model and the
  earlier ones of eval.last_checkpoints);
- `sha256`: the sha256 of everything else in the file (`content_sha256`), checked by `read_model`,
  so a file changed after it was written is refused, naming it and how to rebuild it. Hashing
  runs at the speed of hashlib's sha256: `python benchmarks/bench_model_hash.py` prints the rate
  and what it costs a 1B model. A file written before models were hashed is read with a warning.

`load_model` gives a ready `Transformer` in evaluation mode: by default as trained, or in
another compute dtype (e.g. fp32 for a reference) and with another stream format (a StreamBack
model with a `bf16` stream computes exactly what the baseline does, so every variant of the
same weights is one `stream` argument away).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from streamback import layout
from streamback.data.shards import read_manifest
from streamback.errors import StreambackError
from streamback.io import atomic_path
from streamback.model.model import ModelArgs, Transformer, model_args_from_dict

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class TrainedModel:
    """A model file's contents, checked against each other."""

    args: ModelArgs
    state: dict[str, torch.Tensor]
    stream: str  # the StreamFormat label of the trained stream
    compute_dtype: torch.dtype
    data: dict | None = None  # {"fingerprint", "tokenizer_sha256"} of the corpus, if recorded
    step: int | None = None  # the optimizer step of the weights, if recorded


def save_model(
    path: str | os.PathLike,
    args: ModelArgs,
    state: dict[str, torch.Tensor],
    compute_dtype: torch.dtype = torch.bfloat16,
    data: dict | None = None,
    step: int | None = None,
) -> None:
    """Write a trained model (`state`: the full, unsharded state dict) to `path`, atomically;
    `data`: the corpus it was trained on, `step`: the step of the weights (see the module docstring)."""
    name = next((k for k, v in DTYPES.items() if v == compute_dtype), None)
    if name is None:
        raise StreambackError(f"compute dtype must be one of {list(DTYPES.values())}, got {compute_dtype}")
    record = {
        "model_args": dataclasses.asdict(args),
        "model": state,
        "stream": args.stream_format(compute_dtype).label,
        "compute_dtype": name,
    }
    if data is not None:
        record["data"] = data
    if step is not None:
        record["step"] = step
    record[HASH] = content_sha256(record)
    with (
        atomic_path(path, hint=f"free space there, then write it again with {rebuild(path)}") as tmp,
        open(tmp, "wb") as f,
    ):
        torch.save(
            record, f
        )  # through a Python file, so a full disk is an OSError (torch's own writer says "unexpected pos")


HASH = "sha256"  # the record's key for content_sha256


def content_sha256(record: dict) -> str:
    """sha256 of a model file's record: its other fields as canonical JSON, then each tensor of
    `model` by name (name, dtype, shape, then its bytes as stored)."""
    digest = hashlib.sha256(
        json.dumps({k: v for k, v in record.items() if k not in ("model", HASH)}, sort_keys=True).encode()
    )
    for key in sorted(record["model"]):
        tensor = record["model"][key].detach().cpu().contiguous()
        digest.update(f"\n{key} {tensor.dtype} {tuple(tensor.shape)}\n".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy())
    return digest.hexdigest()


def rebuild(path: str | os.PathLike) -> str:
    """What writes the model file at `path` again: a run's (results/runs/<run>/model.pt) its rule,
    any other the command that made it."""
    path = Path(path)
    if path.name == layout.MODEL_FILE and path.parent.parent.name == layout.run_dir("run").parent.name:
        return (
            f"`snakemake --cores 1 --forcerun {path}` (rule train: the run resumes from its last checkpoint and writes "
            "the same weights)"
        )
    return "the command that made it (`streamback import-hf` for a converted model)"


def read_model(path: str | os.PathLike) -> TrainedModel:
    """Read and check a model file: its model_args must build a model whose state dict it matches."""
    path = Path(path)
    if not path.is_file():
        raise StreambackError(f"model file {path} does not exist (train the run first: rule train)")
    try:
        record = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises many types for a corrupt or foreign file
        raise StreambackError(f"model file {path} cannot be read by torch.load: {err}") from None
    if not isinstance(record, dict) or not {"model_args", "model"} <= set(record):
        raise StreambackError(f"model file {path} must be a dict with keys 'model_args' and 'model'")
    _check_hash(path, record)
    try:
        args = model_args_from_dict(record["model_args"])
    except (StreambackError, TypeError) as err:
        raise StreambackError(f"model file {path}: {err}") from None
    compute = record.get("compute_dtype", "bfloat16")
    if compute not in DTYPES:
        raise StreambackError(f"model file {path}: compute_dtype {compute!r} is not one of {', '.join(DTYPES)}")
    state = record["model"]
    with torch.device("meta"):
        expected = {k: v.shape for k, v in Transformer(args).state_dict().items()}
    missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    if missing or unexpected:
        raise StreambackError(
            f"model file {path}: state dict is missing {missing[:5]} and has unexpected {unexpected[:5]}"
        )
    for key, shape in expected.items():
        if state[key].shape != shape:
            raise StreambackError(
                f"model file {path}: {key} has shape {tuple(state[key].shape)}, model_args give {tuple(shape)}"
            )
    stream = record.get("stream") or args.stream_format(DTYPES[compute]).label
    return TrainedModel(args, state, stream, DTYPES[compute], record.get("data"), record.get("step"))


def _check_hash(path: Path, record: dict) -> None:
    """The file's contents against the sha256 it records; a file that records none is refused."""
    if HASH not in record:
        raise StreambackError(
            f"model file {path} records no sha256, so its contents cannot be verified: rebuild it with {rebuild(path)}"
        )
    try:
        actual = content_sha256(record)
    except (AttributeError, TypeError, RuntimeError, ValueError):  # a field that is no longer a tensor or JSON
        actual = "not computable (a field is damaged)"
    if actual != record[HASH]:
        raise StreambackError(
            f"model file {path}: the sha256 of its contents is {actual[:16]}..., the file records "
            f"{str(record[HASH])[:16]}...: it changed after it was written (disk, copy or edit): rebuild it with "
            f"{rebuild(path)}"
        )


def load_model(
    path: str | os.PathLike | TrainedModel,
    compute_dtype: torch.dtype | None = None,
    stream: str | None = None,
    device: str | torch.device = "cpu",
) -> Transformer:
    """The trained model at `path`, ready for evaluation (`eval()`, on `device`).

    `path` may also be what `read_model` returned, so one read of a large file serves every variant.

    `compute_dtype`: the dtype of the sublayers' compute (default: as trained, bf16).
    `stream`: a StreamFormat label (e.g. `bf16`, `fp32`, `mxfp8`, `nvfp4_sr`) to keep the stream
    in instead of the trained one; the model is then a StreamBack model with that stream (the
    reversible stream is dropped: it changes memory, not values).
    """
    trained = path if isinstance(path, TrainedModel) else read_model(path)
    args = trained.args
    if stream is not None:
        args = dataclasses.replace(args, block="streamback", stream=stream, reversible=False)
    with torch.device("meta"):
        model = Transformer(args, compute_dtype or trained.compute_dtype)
    model.to_empty(device=device)
    model.init_buffers()
    model.load_state_dict(trained.state)
    return model.eval()


def check_corpus(
    trained: TrainedModel, model_file: str | os.PathLike, tokens_dir: str | os.PathLike
) -> tuple[dict, Path]:
    """(manifest, tokenizer file) of the tokenized corpus in `tokens_dir`, checked to be one the
    model can read: the tokenizer file is the one the manifest names (sha256), its vocabulary fits
    the embedding, and the corpus fingerprint and tokenizer the model file records (all, some or
    none of them) are the manifest's. The one check of every command that reads a model and
    tokens together (evaluate, export-hf, the analyses); StreambackError names what differs."""

    model_file, tokens_dir = Path(model_file), Path(tokens_dir)
    manifest = read_manifest(tokens_dir)
    tokenizer_file = tokens_dir / manifest["tokenizer"]["file"]
    try:
        text = tokenizer_file.read_text()
    except OSError as err:
        raise StreambackError(f"tokenizer file {tokenizer_file} cannot be read: {err}") from None
    if hashlib.sha256(text.encode()).hexdigest() != manifest["tokenizer"]["sha256"]:
        raise StreambackError(
            f"tokenizer {tokenizer_file} is not the one {tokens_dir / 'manifest.json'} was made with (sha256 differs)"
        )
    if manifest["vocab_size"] > trained.args.vocab_size:
        raise StreambackError(
            f"tokenizer {tokenizer_file} has {manifest['vocab_size']} tokens, but the embedding of {model_file} has "
            f"{trained.args.vocab_size} rows: not the tokenizer the model was trained with; give the token "
            "directory of its own tokenizer"
        )
    corpus = {"fingerprint": manifest["fingerprint"], "tokenizer_sha256": manifest["tokenizer"]["sha256"]}
    for key, value in corpus.items():
        if trained.data is not None and key in trained.data and trained.data[key] != value:
            raise StreambackError(
                f"run {model_file.parent.name} ({model_file}) was trained on another corpus than {tokens_dir}: its "
                f"{key} is {trained.data[key]}, {tokens_dir / 'manifest.json'} has {value}; "
                "give the token directory it was trained on"
            )
    return manifest, tokenizer_file
