"""The synthetic corpus: deterministic, FineWeb's schema, and its long-range structure holds
(checked by independent, hand-written rules, not by the grammar's own tables)."""

import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from streamback.data.corpus import PHENOMENA, document_id, document_text, minimal_pairs, part_ranges, write_part

# FineWeb's parquet schema (HuggingFaceFW/fineweb, data/*/*.parquet).
FINEWEB_SCHEMA = pa.schema(
    [
        ("text", pa.string()),
        ("id", pa.string()),
        ("dump", pa.string()),
        ("url", pa.string()),
        ("date", pa.string()),
        ("file_path", pa.string()),
        ("language", pa.string()),
        ("language_score", pa.float64()),
        ("token_count", pa.int64()),
    ]
)
NUMBER_WORDS = {
    "one": 1,
    "two": 2,
    "three": 3,
    "four": 4,
    "five": 5,
    "six": 6,
    "seven": 7,
    "eight": 8,
    "nine": 9,
    "ten": 10,
}
# A hand-made agreement key for a few nouns, independent of corpus.py's lexicon.
NOUN_NUMBER = {
    "dog": "sg",
    "dogs": "pl",
    "mouse": "sg",
    "mice": "pl",
    "child": "sg",
    "children": "pl",
    "box": "sg",
    "boxes": "pl",
    "goose": "sg",
    "geese": "pl",
    "shelf": "sg",
    "shelves": "pl",
}
VERB_NUMBER = {"is": "sg", "are": "pl", "has": "sg", "have": "pl"}
DOCS = [document_text(7, i) for i in range(400)]


def brackets_balanced(text: str) -> bool:
    stack = []
    for ch in text:
        if ch in "([":
            stack.append(ch)
        elif ch in ")]":
            if not stack or stack.pop() != {")": "(", "]": "["}[ch]:
                return False
    return not stack


def counts_agree(text: str) -> bool:
    """Every counting sentence lists as many items as it announces (and counts correctly)."""
    for kind, number, items in re.findall(
        r"(counts to|counts down from|(?:rings|sounds)) (\w+)(?: times)?: ([^.]*)\.", text
    ):
        n, listed = NUMBER_WORDS[number], items.split(", ")
        if len(listed) != n:
            return False
        words = [w for w, _ in sorted(NUMBER_WORDS.items(), key=lambda kv: kv[1])][:n]
        if kind == "counts to" and listed != words or kind == "counts down from" and listed != words[::-1]:
            return False
    return True


def test_documents_are_a_pure_function_of_seed_and_index():
    assert document_text(7, 3) == DOCS[3]
    assert document_text(8, 3) != DOCS[3]
    assert len(set(DOCS)) == len(DOCS)
    assert document_id(7, 3) == document_id(7, 3) != document_id(7, 4)
    assert re.fullmatch(r"<urn:uuid:[0-9a-f-]{36}>", document_id(7, 3))


def test_parquet_has_fineweb_schema_and_is_byte_identical(tmp_path):
    write_part(7, 0, 50, tmp_path / "a" / "part.parquet")
    write_part(7, 0, 50, tmp_path / "b" / "part.parquet")
    assert (tmp_path / "a" / "part.parquet").read_bytes() == (tmp_path / "b" / "part.parquet").read_bytes()
    table = pq.read_table(tmp_path / "a" / "part.parquet")
    assert table.schema.remove_metadata() == FINEWEB_SCHEMA
    assert table.column("text").to_pylist() == DOCS[:50]
    assert table.column("token_count").to_pylist() == [len(t.split()) for t in DOCS[:50]]
    assert part_ranges(10, 3) == [(0, 3), (3, 6), (6, 10)]


def test_long_range_structure_holds_in_every_document():
    assert all(brackets_balanced(doc) for doc in DOCS)
    assert all(doc.count('"') % 2 == 0 for doc in DOCS)
    assert all(counts_agree(doc) for doc in DOCS)
    checked = 0
    for doc in DOCS:  # "<The|Some|...> <noun> <is|are|has|have>": the verb agrees with the noun
        for noun, verb in re.findall(r"(?:^|\. )\w+ (\w+) (is|are|has|have)\b", doc):
            if noun in NOUN_NUMBER:
                assert NOUN_NUMBER[noun] == VERB_NUMBER[verb], doc
                checked += 1
    assert checked > 20
    text = " ".join(DOCS)
    for phenomenon_marker in ("(", "[", '"', " that ", "counts to", "times:", " They ", " It "):
        assert phenomenon_marker in text, phenomenon_marker


def plural_noun(word: str) -> bool:
    return word in {"children", "men", "women", "mice", "geese"} or word.endswith("s")


def singular_verb(word: str) -> bool:
    return word in {"is", "has"} or word.endswith("s") and not word.endswith("ss")


def number_pair(a: str, b: str) -> bool:
    """a and b are one verb in its two numbers (sings/sing, watches/watch, carries/carry, is/are)."""

    def third_person(plural):
        return {plural + "s", plural + "es", plural[:-1] + "ies", {"are": "is", "have": "has"}.get(plural)}

    return a in third_person(b) or b in third_person(a)


@pytest.mark.parametrize("phenomenon", PHENOMENA)
def test_minimal_pairs_differ_in_one_word(phenomenon):
    pairs = minimal_pairs(phenomenon, 40, seed=1000)
    assert pairs == minimal_pairs(phenomenon, 40, seed=1000)
    assert pairs != minimal_pairs(phenomenon, 40, seed=1001)
    for pair in pairs:
        good, bad = re.findall(r"\w+|[^\w\s]", pair.good), re.findall(r"\w+|[^\w\s]", pair.bad)
        assert len(good) == len(bad)
        diff = [i for i, (g, b) in enumerate(zip(good, bad)) if g != b]
        assert len(diff) == 1, (pair.good, pair.bad)
        i = diff[0]
        if phenomenon.startswith("agreement"):
            assert number_pair(good[i], bad[i]), (good[i], bad[i])
        if phenomenon == "agreement_attractor":  # Det (Adj) HEAD prep Det (Adj) NOUN <verb>
            head = good[
                good.index(
                    next(w for w in good[2:] if w in {"to", "of", "near", "behind", "beside", "with", "from", "under"})
                )
                - 1
            ]
            assert plural_noun(head) != singular_verb(good[i]) and plural_noun(head) != plural_noun(good[i - 1])
        elif phenomenon == "agreement_subject_relative":  # HEAD that/who verb Det (Adj) NOUN <verb>
            head = good[next(k for k, w in enumerate(good) if w in {"that", "who"}) - 1]
            assert plural_noun(head) != singular_verb(good[i]) and plural_noun(head) != plural_noun(good[i - 1])
        elif phenomenon == "agreement_object_relative":  # HEAD that Det (Adj) NOUN verb <verb>
            head = good[good.index("that") - 1]
            assert plural_noun(head) != singular_verb(good[i]) and plural_noun(head) != plural_noun(good[i - 2])
            assert plural_noun(good[i - 2]) != singular_verb(good[i - 1])
        elif phenomenon == "agreement_across_sentences":
            assert good[i - 1] in {"It", "They"} and (good[i - 1] == "It") == singular_verb(good[i])
        elif phenomenon == "brackets":
            assert brackets_balanced(pair.good) and not brackets_balanced(pair.bad)
        elif phenomenon == "counting":
            assert counts_agree(pair.good) and not counts_agree(pair.bad)


def test_unknown_phenomenon():
    with pytest.raises(ValueError, match="unknown phenomenon"):
        minimal_pairs("binding", 1, 0)
