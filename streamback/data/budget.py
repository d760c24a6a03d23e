"""Whether a source holds the token budgets asked of it, checked before tokenize writes a shard.

What a source holds is estimated from its own metadata and a sample: the documents from the
parquet footers (exact), the tokens per document from documents encoded with the run's tokenizer.
The sample is two-stage: `row_groups` row groups drawn with probability proportional to their
rows (with replacement), then `documents_per_group` documents of each drawn at random. The mean
of the groups' sample means is then unbiased for the mean over all documents, and the t interval
of those group means (`stats.t_interval`, groups - 1 degrees of freedom) is its interval (the
usual estimator of probability-proportional-to-size sampling; it needs no model of how documents
differ between files). A source no larger than the sample is read whole: the counts are exact.

A split holds the tokens of its documents: only `val_fraction` of the documents (by id hash) are
validation, so `val_tokens` needs about `val_tokens / val_fraction` source tokens. Which documents
the hash picks adds its own spread (a binomial count of documents), added to the interval's.
A budget above the upper end of its split's interval is refused (`check`), with one line naming
the key, what it needs, the estimate with its interval and the fixes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from streamback import stats
from streamback.data.sources import is_validation
from streamback.errors import StreambackError


@dataclass
class Estimate:
    """What a source holds: `documents` (footers), `tokens_per_document` (mean, low, high; EOS
    included, 0 for an empty document), and per split (estimate, low, high) tokens."""

    documents: int
    files: int
    sampled: int
    groups: int
    census: bool
    confidence: float
    tokens_per_document: tuple[float, float, float]
    splits: dict[str, tuple[float, float, float]]

    def basis(self) -> str:
        """How the estimate was made, for a message or a log line."""
        if self.census:
            return f"all {self.documents:,} documents of {self.files} parquet files encoded with the run's tokenizer"
        mean, low, high = self.tokens_per_document
        return (
            f"{self.documents:,} documents (parquet footers of {self.files} files) x {mean:,.1f} tokens a document "
            f"({self.confidence:.0%} interval {low:,.1f}-{high:,.1f}; {self.sampled:,} documents of {self.groups} row "
            "groups encoded with the run's tokenizer)"
        )


def _token_counts(texts: list[str], tokenizer) -> np.ndarray:
    """Tokens each document adds to its split, as tokenize counts them: encoded without special
    tokens, plus the end-of-document token; 0 for an empty or blank one (tokenize skips it)."""
    keep = [i for i, t in enumerate(texts) if t and not t.isspace()]
    counts = np.zeros(len(texts), np.int64)
    encodings = tokenizer.encode_batch_fast([texts[i] for i in keep], add_special_tokens=False)
    counts[keep] = [len(e.ids) + 1 for e in encodings]
    return counts


def estimate(
    files: list[Path],
    tokenizer,
    data: dict,
    row_groups: int,
    documents_per_group: int,
    confidence: float,
    seed: int = 0,
) -> Estimate:
    """What the parquet `files` hold in tokens of `tokenizer`, per split of `data` (its
    text_column, id_column, val_fraction); the sample is drawn with numpy's generator of `seed`."""
    import pyarrow.parquet as pq

    text_column, id_column, fraction = data["text_column"], data["id_column"], data["val_fraction"]
    groups = []  # (file, row group, rows)
    for path in files:
        try:
            meta = pq.read_metadata(path)
        except Exception as err:  # pyarrow raises several types for a file that is not parquet
            raise StreambackError(f"corpus file {path} is not a readable parquet file: {err}") from None
        groups += [(path, g, meta.row_group(g).num_rows) for g in range(meta.num_row_groups)]
    rows = np.array([n for _, _, n in groups], np.int64)
    documents = int(rows.sum())
    if documents == 0:
        raise StreambackError(f"empty corpus: {', '.join(map(str, files))} hold no documents")

    def read(path, group):
        columns = [text_column] + ([id_column] if id_column in pq.read_schema(path).names else [])
        table = pq.ParquetFile(path).read_row_group(group, columns=columns)
        texts = [t or "" for t in table.column(text_column).to_pylist()]
        ids = table.column(id_column).to_pylist() if id_column in table.column_names else [None] * len(texts)
        return texts, [str(i) if i is not None else t for i, t in zip(ids, texts)]

    if documents <= row_groups * documents_per_group:  # read it all: exact
        totals = {"train": 0, "val": 0}
        for path, group, _ in groups:
            texts, keys = read(path, group)
            for count, key in zip(_token_counts(texts, tokenizer), keys):
                totals["val" if is_validation(key, fraction) else "train"] += int(count)
        mean = (totals["train"] + totals["val"]) / documents
        return Estimate(
            documents, len(files), documents, len(groups), True, confidence, (mean, mean, mean),
            {split: (float(n), float(n), float(n)) for split, n in totals.items()},
        )  # fmt: skip

    rng = np.random.default_rng(seed)
    drawn = rng.choice(len(groups), size=row_groups, p=rows / documents)
    means, squares = [], []
    for k in drawn:
        path, group, n = groups[k]
        texts, _ = read(path, group)
        pick = rng.choice(n, size=min(documents_per_group, n), replace=False)
        counts = _token_counts([texts[i] for i in pick], tokenizer).astype(np.float64)
        means.append(counts.mean())
        squares.append((counts**2).mean())
    mean, low, high = stats.t_interval(means, confidence)
    second = float(np.mean(squares))  # E[t^2] per document, for the spread of the hash's pick
    z = math.sqrt(2) * _erfinv(confidence)
    splits = {}
    for split, share in (("train", 1 - fraction), ("val", fraction)):
        # tokens of a split = sum over documents of t_i * [picked]: its estimate documents x share x
        # mean; its spread, that of the mean (t half-width, scaled) and of a binomial pick of
        # documents (variance documents x share x (1 - share) x E[t^2]), added in quadrature
        centre = documents * share * mean
        half = math.hypot(documents * share * (high - mean), z * math.sqrt(documents * share * (1 - share) * second))
        splits[split] = (centre, max(0.0, centre - half), centre + half)
    return Estimate(
        documents,
        len(files),
        len(drawn) * documents_per_group,
        row_groups,
        False,
        confidence,
        (mean, low, high),
        splits,
    )


def _erfinv(confidence: float) -> float:
    from scipy.special import erfinv  # imported here, as stats does: only the sampled check needs it

    return float(erfinv(confidence))


def check(data: dict, found: Estimate, where: str) -> None:
    """Refuse budgets of `data` above the upper end of their split's interval, naming the key,
    what it needs, the estimate and the fixes (one line for every budget that cannot fit)."""
    fraction, problems = data["val_fraction"], []
    shares = (("train", 1 - fraction, "1 - data.val_fraction"), ("val", fraction, "data.val_fraction"))
    for split, share, share_key in shares:
        budget = data[f"{split}_tokens"]
        centre, low, high = found.splits[split]
        if budget is None or budget <= high:
            continue
        needs = budget / share
        interval = "exact" if found.census else f"{found.confidence:.0%} interval {low:,.0f}-{high:,.0f}"
        fixes = [f"lower data.{split}_tokens to at most {math.floor(low):,}"]
        if split == "val" and found.tokens_per_document[1] > 0:
            least = budget / (found.documents * found.tokens_per_document[1])
            if least < 1:
                fixes.append(f"raise data.val_fraction to at least {least:.3g}")
        fixes.append("choose a larger source (data.hub.name, e.g. a larger FineWeb sample)")
        if not found.census:
            fixes.append("or, if the estimate is near the budget, sample more (data.budget_check.row_groups)")
        problems.append(
            f"data.{split}_tokens = {budget:,} needs about {needs:,.0f} source tokens (the {split} split holds "
            f"{share_key} = {share:g} of the documents), but {where} holds an estimated {centre:,.0f} {split} tokens "
            f"({interval}; {found.basis()}): {', '.join(fixes)}"
        )
    if problems:
        raise StreambackError("; ".join(problems))
