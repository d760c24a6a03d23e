"""The paper's first evidence on public models (`streamback analyze public`): per-layer error and
sign flips, and swallowed updates, of a deep model the study did not train.

Each model of `analysis.public_models` (a name -> a local Hugging Face directory, read by
`streamback.model.import_hf.read_hf`) runs on the pipeline's own validation text: the val split
decoded with the study's tokenizer, document by document, and encoded again with the model's own
`tokenizer.json` (its end-of-document token between documents), cut into `public_sequences`
windows of `public_seq_len` tokens. The variants are bf16 compute with a bf16 stream (the
paper's baseline), with an fp32 stream (its full-precision stream) and with every format of
`analysis.variants`, against the ground truth `analysis.reference` (`precision.layer_error`).

Each window is its own forward and backward pass (its own loss), so the windows are independent
draws and every count has an interval over them. Per variant, kind and layer, `max_abs_error` is
the largest over the windows, `sign_flips` their sum, `sign_flip_fraction` and `rel_error` their
mean (every window has as many entries). The flip ratio of a variant to the bf16 stream (the
paper: the full-precision stream has "roughly half as many sign flips as the bfloat16
baseline"), per layer and over all layers, is the ratio of the summed flips with a percentile
bootstrap interval over windows (`stats.bootstrap_ratio_ci`). Swallowed updates
(`precision.swallowed`) are measured on all windows as one batch.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import torch

from streamback.analysis.precision import KINDS, layer_errors, swallowed
from streamback.data import tokenizer as tk
from streamback.data.shards import TokenDataset
from streamback.errors import StreambackError
from streamback.model.import_hf import read_hf
from streamback.progress import Progress
from streamback.stats import bootstrap_ratio_ci

STUDY_PAIR = ("bf16", "fp32")  # the paper's baseline and full-precision streams, always measured
ALL_LAYERS = "all"  # the flip-ratio table's layer for the sum over every layer
RATIO_COLUMNS = [
    "model",
    "kind",
    "variant",
    "layer",
    "sign_flips",
    "bf16_sign_flips",
    "flip_ratio",
    "flip_ratio_low",
    "flip_ratio_high",
    "sequences",
    "tokens",
]


def public_variants(variants: list[str]) -> list[str]:
    """bf16 and fp32 streams first, then the config's other formats."""
    return list(dict.fromkeys([*STUDY_PAIR, *variants]))


def study_documents(tokens_dir: str | Path):
    """The validation split's documents as text, in order (decoded with the study's tokenizer), a generator."""
    dataset = TokenDataset(tokens_dir, "val")
    decoder = tk.load_file(Path(tokens_dir) / dataset.manifest["tokenizer"]["file"])
    eos, offset, partial, chunk = dataset.manifest["eos_id"], 0, [], 1 << 16
    while offset < dataset.num_tokens:
        tokens = dataset.read(offset, min(chunk, dataset.num_tokens - offset)).tolist()
        offset += len(tokens)
        for token in tokens:
            if token == eos:
                yield decoder.decode(partial)
                partial = []
            else:
                partial.append(token)
    if partial:
        yield decoder.decode(partial)


def public_windows(
    tokens_dir: str | Path, tokenizer_file: str | Path, seq_len: int, count: int, vocab_size: int
) -> torch.Tensor:
    """`count` windows [count, seq_len + 1] of the study's validation text in the tokens of `tokenizer_file`
    (documents joined by its end-of-document token), for a model whose embedding has `vocab_size` rows."""
    tokenizer = tk.load_file(tokenizer_file)
    _, eos = tk.eos_id(tokenizer, None, str(tokenizer_file))
    need, ids = count * (seq_len + 1), []
    for document in study_documents(tokens_dir):
        ids += tokenizer.encode(document, add_special_tokens=False).ids + [eos]
        if len(ids) >= need:
            break
    else:
        raise StreambackError(
            f"{tokens_dir}: the val split's text gives {len(ids)} tokens of {tokenizer_file}, fewer than the "
            f"{count} x {seq_len + 1} asked for (analysis.public_sequences, analysis.public_seq_len)"
        )
    windows = torch.tensor(ids[:need], dtype=torch.int64).view(count, seq_len + 1)
    if int(windows.max()) >= vocab_size:
        raise StreambackError(
            f"{tokenizer_file} gives token {int(windows.max())}, outside the model's {vocab_size}-row embedding: "
            "not the model's tokenizer"
        )
    return windows


def summed_layer_error(per_window: pd.DataFrame) -> pd.DataFrame:
    """Per variant, kind and layer over the windows: max of max_abs_error, sum of sign_flips, mean of the fractions."""
    return (
        per_window.groupby(["variant", "kind", "layer"], sort=False)
        .agg(
            max_abs_error=("max_abs_error", "max"),
            rel_error=("rel_error", "mean"),
            sign_flips=("sign_flips", "sum"),
            sign_flip_fraction=("sign_flip_fraction", "mean"),
        )
        .reset_index()
    )


def flip_ratios(per_window: pd.DataFrame, confidence: float, seed: int) -> pd.DataFrame:
    """Per variant other than bf16, kind and layer (and `ALL_LAYERS`): its summed sign flips over the bf16 stream's,
    with the bootstrap interval over windows (columns of RATIO_COLUMNS less model, sequences, tokens)."""
    rows = []
    flips = per_window.pivot_table(
        index=["kind", "layer", "window"], columns="variant", values="sign_flips", aggfunc="sum"
    )
    for kind in [k for k in KINDS if k in flips.index.get_level_values("kind")]:
        table = flips.xs(kind, level="kind")
        layers = list(dict.fromkeys(table.index.get_level_values("layer")))
        for variant in [v for v in table.columns if v != "bf16"]:
            for layer in [*layers, ALL_LAYERS]:
                part = table.groupby(level="window").sum() if layer == ALL_LAYERS else table.xs(layer, level="layer")
                ratio, low, high = bootstrap_ratio_ci(
                    part[variant].to_numpy(), part["bf16"].to_numpy(), confidence, seed=seed
                )
                rows.append(
                    {
                        "kind": kind,
                        "variant": variant,
                        "layer": str(layer),
                        "sign_flips": int(part[variant].sum()),
                        "bf16_sign_flips": int(part["bf16"].sum()),
                        "flip_ratio": ratio,
                        "flip_ratio_low": low,
                        "flip_ratio_high": high,
                    }
                )
    return pd.DataFrame(rows)


def public_tables(models: dict[str, str], cfg: dict, tokens_dir: str | Path, device) -> dict[str, pd.DataFrame]:
    """The three tables of `streamback analyze public` (public_layer_error, public_swallowed, public_flip_ratio) over
    `models`."""
    variants = public_variants(cfg["variants"])
    count, seq_len = cfg["public_sequences"], cfg["public_seq_len"]
    progress = Progress("analyze public", len(models) * (count * (len(variants) + 1) + len(variants)), "pass")
    errors, swallows, ratios = [], [], []
    for name, directory in models.items():
        trained = read_hf(directory)
        if trained.args.max_seq_len < seq_len:
            raise StreambackError(
                f"public model {name}: analysis.public_seq_len {seq_len} exceeds its max_position_embeddings "
                f"{trained.args.max_seq_len}"
            )
        windows = public_windows(
            tokens_dir, Path(directory) / "tokenizer.json", seq_len, count, trained.args.vocab_size
        )
        per_window = layer_errors(
            trained,
            windows.split(1),
            cfg["reference"],
            variants,
            device,
            cfg["seed"],
            compute_dtype=torch.bfloat16,
            progress=progress,
        )
        size = {"sequences": count, "tokens": count * seq_len}
        errors.append(summed_layer_error(per_window).assign(**size).assign(model=name))
        ratios.append(flip_ratios(per_window, cfg["confidence"], cfg["seed"]).assign(**size).assign(model=name))
        swallows.append(
            swallowed(trained, windows, variants, device, cfg["seed"], progress=progress).assign(
                model=name, tokens=count * seq_len
            )
        )
        progress.write(f"analyze public: {name} done ({progress.line()})")
    progress.close()

    def first(frames, column="model"):
        table = pd.concat(frames, ignore_index=True)
        return table[[column, *[c for c in table.columns if c != column]]]

    return {
        "public_layer_error": first(errors),
        "public_swallowed": first(swallows),
        "public_flip_ratio": first(ratios)[RATIO_COLUMNS],
    }
