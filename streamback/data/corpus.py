"""The embedded offline corpus: synthetic English from a small probabilistic grammar.

Each document is a short story, a pure function of (seed, index): a cast (two names, a few
animals and things) is drawn, then sentences of these kinds, with long-range structure a small
Llama can learn well below the unigram baseline:

- agreement: a subject's number decides its verb's form across attractor phrases ("the key to
  the cabinets *is*"), subject relatives ("the dog that sees the cats *runs*") and object
  relatives ("the dogs that the cat sees *are*"), and across sentences ("... . They *are* ...");
- brackets and quotes: parentheticals nest "(" and "[" and close in the matching order; a quoted
  sentence opens and closes its quote marks;
- counting: "Mia counts to five: one, two, three, four, five." and "The bell rings three times:
  ding, ding, ding." (the announced number sets the length of the list).

The grammar stays accessible: `minimal_pairs(phenomenon, n, seed)` draws sentences from the same
productions and returns each with an ungrammatical twin differing in one word (BLiMP-style), for
the offline evaluation tasks (use a seed other than the corpus's). `write_part` writes documents
as parquet with FineWeb's columns and types, so the tokenize stage reads them through the same
`datasets` path as FineWeb.
"""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass
from pathlib import Path

from streamback.io import atomic_path

SG, PL = 0, 1

# (singular, plural) forms. Animate nouns can see, like and follow; things cannot.
ANIMATE = [
    ("dog", "dogs"),
    ("cat", "cats"),
    ("bird", "birds"),
    ("horse", "horses"),
    ("fox", "foxes"),
    ("wolf", "wolves"),
    ("mouse", "mice"),
    ("child", "children"),
    ("man", "men"),
    ("woman", "women"),
    ("teacher", "teachers"),
    ("farmer", "farmers"),
    ("doctor", "doctors"),
    ("painter", "painters"),
    ("sailor", "sailors"),
    ("baker", "bakers"),
    ("student", "students"),
    ("king", "kings"),
    ("queen", "queens"),
    ("pilot", "pilots"),
    ("singer", "singers"),
    ("neighbor", "neighbors"),
    ("friend", "friends"),
    ("rabbit", "rabbits"),
    ("goose", "geese"),
]
THINGS = [
    ("key", "keys"),
    ("box", "boxes"),
    ("cabinet", "cabinets"),
    ("book", "books"),
    ("letter", "letters"),
    ("house", "houses"),
    ("tree", "trees"),
    ("river", "rivers"),
    ("city", "cities"),
    ("story", "stories"),
    ("ship", "ships"),
    ("lamp", "lamps"),
    ("garden", "gardens"),
    ("road", "roads"),
    ("song", "songs"),
    ("window", "windows"),
    ("table", "tables"),
    ("chair", "chairs"),
    ("apple", "apples"),
    ("stone", "stones"),
    ("cup", "cups"),
    ("coin", "coins"),
    ("map", "maps"),
    ("hill", "hills"),
    ("bridge", "bridges"),
    ("door", "doors"),
    ("picture", "pictures"),
    ("basket", "baskets"),
    ("candle", "candles"),
    ("shelf", "shelves"),
]
INTRANSITIVE = [
    ("sleeps", "sleep"),
    ("runs", "run"),
    ("sings", "sing"),
    ("waits", "wait"),
    ("laughs", "laugh"),
    ("smiles", "smile"),
    ("jumps", "jump"),
    ("walks", "walk"),
    ("rests", "rest"),
    ("dances", "dance"),
    ("hides", "hide"),
    ("listens", "listen"),
    ("works", "work"),
    ("plays", "play"),
    ("cries", "cry"),
    ("goes", "go"),
]
TRANSITIVE = [  # animate subject; the object is any noun phrase
    ("sees", "see"),
    ("likes", "like"),
    ("follows", "follow"),
    ("finds", "find"),
    ("carries", "carry"),
    ("watches", "watch"),
    ("paints", "paint"),
    ("remembers", "remember"),
    ("wants", "want"),
    ("knows", "know"),
    ("visits", "visit"),
    ("misses", "miss"),
    ("helps", "help"),
    ("chases", "chase"),
]
COPULA = ("is", "are")
HAVE = ("has", "have")
ADJECTIVES = [
    "big",
    "small",
    "old",
    "young",
    "happy",
    "tired",
    "red",
    "green",
    "blue",
    "quiet",
    "clever",
    "brave",
    "little",
    "heavy",
    "bright",
    "dark",
    "warm",
    "cold",
    "kind",
    "busy",
    "hungry",
    "strange",
    "new",
    "gentle",
]
LOCATIONS = ["near", "behind", "under", "beside", "above", "inside", "next to", "far from"]
ATTRACTOR_PREPS = ["to", "of", "near", "behind", "beside", "with", "from", "under"]
ADVERBS = ["often", "always", "never", "quietly", "slowly", "today", "again", "sometimes"]
NAMES = [
    "Anna",
    "Ben",
    "Mia",
    "Tom",
    "Lena",
    "Omar",
    "Sara",
    "Leo",
    "Nina",
    "Hugo",
    "Ida",
    "Karl",
    "Rosa",
    "Ali",
    "Emma",
    "Jonas",
    "Lucy",
    "Ravi",
    "Vera",
    "Otto",
]
SAY = ["says", "whispers", "shouts", "writes", "asks"]
THINK = ["thinks", "knows", "hopes", "says", "believes"]
NUMBERS = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]
SOUNDS = [("bell", "ding"), ("clock", "tick"), ("drum", "boom"), ("bird", "tweet"), ("dog", "woof")]
DETERMINERS = (
    ["the", "the", "the", "a", "this", "that", "every", "my", "her", "his"],
    ["the", "the", "the", "some", "these", "those", "many", "my", "her", "his", "two", "three", "four"],
)
BRACKETS = [("(", ")"), ("[", "]")]

OPEN_QUOTE, CLOSE_QUOTE = "\x01", "\x02"  # both print as '"'; kept apart while joining words
_NO_SPACE_AFTER = {"(", "[", OPEN_QUOTE}
_NO_SPACE_BEFORE = {")", "]", ".", ",", ":", "!", "?", CLOSE_QUOTE}

PHENOMENA = (
    "agreement_simple",
    "agreement_attractor",
    "agreement_subject_relative",
    "agreement_object_relative",
    "agreement_across_sentences",
    "brackets",
    "counting",
)

MAX_DEPTH = 3
GENERATOR_VERSION = "streamback-synthetic-1"


def join_words(words: list[str]) -> str:
    """Words to text: punctuation attaches to its neighbour, quotes become '"'."""
    out: list[str] = []
    for i, word in enumerate(words):
        if i and word not in _NO_SPACE_BEFORE and words[i - 1] not in _NO_SPACE_AFTER:
            out.append(" ")
        out.append(word)
    return "".join(out).replace(OPEN_QUOTE, '"').replace(CLOSE_QUOTE, '"')


def _capitalize(words: list[str]) -> list[str]:
    for i, word in enumerate(words):
        if word[0].isalpha():
            return words[:i] + [word[0].upper() + word[1:]] + words[i + 1 :]
    return words


def _fix_articles(words: list[str]) -> list[str]:
    return ["an" if w == "a" and i + 1 < len(words) and words[i + 1][0] in "aeiou" else w for i, w in enumerate(words)]


def sentence_text(words: list[str]) -> str:
    """A sentence's words as text: 'a'/'an' fixed, first letter capitalised, punctuation joined."""
    return join_words(_capitalize(_fix_articles(words)))


class Grammar:
    """The productions. Every method draws from `rng`; nouns prefer the document's cast."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.names = rng.sample(NAMES, 2)
        self.animate = rng.sample(ANIMATE, 3)
        self.things = rng.sample(THINGS, 3)

    # -- lexical choices -------------------------------------------------------------------
    def num(self) -> int:
        return self.rng.choice((SG, PL))

    def noun(self, animate: bool) -> tuple[str, str]:
        cast, lexicon = (self.animate, ANIMATE) if animate else (self.things, THINGS)
        return self.rng.choice(cast if self.rng.random() < 0.7 else lexicon)

    def name(self) -> str:
        return self.rng.choice(self.names if self.rng.random() < 0.85 else NAMES)

    # -- phrases ---------------------------------------------------------------------------
    def noun_phrase(self, num: int, animate: bool, depth: int, modifiers: bool = True) -> list[str]:
        """Determiner, maybe an adjective, the noun, and (while depth allows) a PP or relative."""
        words = [self.rng.choice(DETERMINERS[num])]
        if self.rng.random() < 0.3:
            words.append(self.rng.choice(ADJECTIVES))
        words.append(self.noun(animate)[num])
        if modifiers and depth < MAX_DEPTH:
            r = self.rng.random()
            if r < 0.15:
                words += self.attractor(depth + 1)
            elif r < 0.25 and animate:
                words += self.subject_relative(num, depth + 1)
            elif r < 0.32:
                words += self.object_relative(depth + 1)
        return words

    def attractor(self, depth: int, num: int | None = None) -> list[str]:
        """A prepositional phrase whose noun may differ in number from the head it follows."""
        num = self.num() if num is None else num
        return [self.rng.choice(ATTRACTOR_PREPS)] + self.noun_phrase(num, self.rng.random() < 0.3, depth)

    def subject_relative(self, num: int, depth: int, other: int | None = None) -> list[str]:
        """'that/who' + a verb agreeing with the head noun + an object (of number `other`)."""
        verb = self.rng.choice(TRANSITIVE)[num]
        obj_num = self.num() if other is None else other
        return [self.rng.choice(("that", "who")), verb] + self.noun_phrase(
            obj_num, self.rng.random() < 0.5, depth, modifiers=False
        )

    def object_relative(self, depth: int, inner: int | None = None) -> list[str]:
        """'that' + an animate subject + a transitive verb agreeing with that inner subject."""
        inner = self.num() if inner is None else inner
        return ["that"] + self.noun_phrase(inner, True, depth, modifiers=False) + [self.rng.choice(TRANSITIVE)[inner]]

    def verb_phrase(self, num: int, animate: bool, depth: int) -> tuple[tuple[str, str], list[str]]:
        """(the agreeing verb's two forms, the rest of the phrase); the verb comes first."""
        r = self.rng.random()
        if animate and r < 0.3:
            return self.rng.choice(INTRANSITIVE), ([self.rng.choice(ADVERBS)] if self.rng.random() < 0.3 else [])
        if animate and r < 0.6:
            return self.rng.choice(TRANSITIVE), self.noun_phrase(self.num(), self.rng.random() < 0.4, depth + 1)
        if r < 0.8:
            return COPULA, [self.rng.choice(ADJECTIVES)]
        if r < 0.9:
            return COPULA, [self.rng.choice(LOCATIONS)] + self.noun_phrase(
                self.num(), False, depth + 1, modifiers=False
            )
        return HAVE, self.noun_phrase(self.num(), False, depth + 1, modifiers=False)

    def clause(self, depth: int = 0) -> tuple[list[str], int, bool]:
        """Subject + agreeing verb phrase; returns (words, subject number, subject animate)."""
        if self.rng.random() < 0.2:
            subject, num, animate = [self.name()], SG, True
        else:
            num, animate = self.num(), self.rng.random() < 0.6
            subject = self.noun_phrase(num, animate, depth)
        verb, rest = self.verb_phrase(num, animate, depth)
        return subject + [verb[num]] + rest, num, animate

    def bracketed(self, depth: int) -> list[str]:
        """A parenthetical: an open bracket, a modifier (maybe nesting another), its close."""
        opening, closing = self.rng.choice(BRACKETS)
        r = self.rng.random()
        if r < 0.4:
            inner = [
                self.rng.choice(("with", "and")),
                self.rng.choice(DETERMINERS[PL][3:]),
                self.noun(self.rng.random() < 0.5)[PL],
            ]
        elif r < 0.7:
            inner = [self.rng.choice(ADJECTIVES), "and", self.rng.choice(ADJECTIVES)]
        else:
            inner = [self.rng.choice(("as", "of", "near")), self.name()]
        if depth < MAX_DEPTH and self.rng.random() < 0.45:
            cut = self.rng.randrange(1, len(inner) + 1)
            inner = inner[:cut] + self.bracketed(depth + 1) + inner[cut:]
        return [opening] + inner + [closing]

    # -- sentences -------------------------------------------------------------------------
    def sentence(self, previous: tuple[int, bool] | None) -> tuple[list[str], tuple[int, bool] | None]:
        """One sentence of the story; `previous` is the last plain subject (number, animate)."""
        r = self.rng.random()
        if previous is not None and r < 0.15:  # a pronoun picks up the last subject's number
            num, animate = previous
            pronoun = (
                ("they" if num == PL else "it")
                if not animate or num == PL or self.rng.random() < 0.5
                else self.rng.choice(("he", "she"))
            )
            verb, rest = self.verb_phrase(num, animate, 1)
            return [pronoun, verb[num]] + rest + ["."], previous
        if r < 0.55:
            words, num, animate = self.clause()
            return words + ["."], (num, animate) if words[0] not in NAMES else None
        if r < 0.67:
            num, animate = self.num(), self.rng.random() < 0.6
            subject = self.noun_phrase(num, animate, MAX_DEPTH) + self.bracketed(1)
            verb, rest = self.verb_phrase(num, animate, 1)
            return subject + [verb[num]] + rest + ["."], (num, animate)
        if r < 0.77:
            inner, _, _ = self.clause(depth=1)
            return [self.name(), self.rng.choice(SAY), ",", OPEN_QUOTE] + _capitalize(inner) + [".", CLOSE_QUOTE], None
        if r < 0.85:
            inner, _, _ = self.clause(depth=1)
            return [self.name(), self.rng.choice(THINK), "that"] + inner + ["."], None
        return self.counting(), None

    def counting(self) -> list[str]:
        """An announced number, then a list of exactly that many items."""
        kind, name, source = self.rng.random(), self.name(), self.rng.choice(SOUNDS)
        count = self.rng.randint(2, 9)
        return counting_words(kind, name, source, count, count)

    def document(self) -> str:
        sentences, previous = [], None
        for _ in range(self.rng.randint(4, 12)):
            words, previous = self.sentence(previous)
            sentences.append(sentence_text(words))
        return " ".join(sentences)


def counting_words(kind: float, name: str, source: tuple[str, str], announced: int, count: int) -> list[str]:
    """'<name> counts to <announced>: one, ...' (or down from, or '<source> rings N times: ding, ...')."""
    if kind < 0.4:
        head, items = [name, "counts", "to", NUMBERS[announced - 1], ":"], NUMBERS[:count]
    elif kind < 0.6:
        head, items = [name, "counts", "down", "from", NUMBERS[announced - 1], ":"], NUMBERS[:count][::-1]
    else:
        thing, sound = source
        verb = "rings" if thing in ("bell", "clock") else "sounds"
        head, items = ["the", thing, verb, NUMBERS[announced - 1], "times", ":"], [sound] * count
    body: list[str] = []
    for item in items:
        body += [item, ","]
    return head + body[:-1] + ["."]


def document_text(seed: int, index: int) -> str:
    """The text of document `index` of the corpus with `seed` (independent of all others)."""
    return Grammar(random.Random(f"{GENERATOR_VERSION}/doc/{seed}/{index}")).document()


def document_id(seed: int, index: int) -> str:
    """A FineWeb-style id, '<urn:uuid:...>', stable for (seed, index)."""
    return f"<urn:uuid:{uuid.uuid5(uuid.NAMESPACE_URL, f'{GENERATOR_VERSION}/{seed}/{index}')}>"


# -- minimal pairs -------------------------------------------------------------------------


@dataclass(frozen=True)
class MinimalPair:
    """A grammatical sentence and its ungrammatical twin, differing in one word."""

    phenomenon: str
    good: str
    bad: str


def _pair_words(g: Grammar, phenomenon: str) -> tuple[list[str], list[str]]:
    """(good, bad) words for one pair; agreement pairs flip the number of the critical verb."""
    num = g.num()
    if phenomenon == "brackets":
        (o1, c1), (o2, c2) = g.rng.sample(BRACKETS, 2)
        inner = [g.rng.choice(("with", "and")), g.rng.choice(DETERMINERS[PL][3:]), g.noun(False)[PL]]
        nested = [g.rng.choice(ADJECTIVES), "and", g.rng.choice(ADJECTIVES)]
        before = g.noun_phrase(num, True, MAX_DEPTH) + [o1] + inner + [o2] + nested
        verb, rest = g.verb_phrase(num, True, MAX_DEPTH)
        after = [c1, verb[num]] + rest + ["."]
        return before + [c2] + after, before + [c1] + after
    if phenomenon == "counting":
        kind, name, source = g.rng.random(), g.name(), g.rng.choice(SOUNDS)
        count = g.rng.randint(2, 9)
        wrong = count + g.rng.choice((-1, 1)) if 2 < count < 9 else (3 if count == 2 else 8)
        return counting_words(kind, name, source, count, count), counting_words(kind, name, source, wrong, count)
    if phenomenon == "agreement_simple":
        subject = g.noun_phrase(num, True, MAX_DEPTH)
        verb, rest = g.verb_phrase(num, True, MAX_DEPTH)
    elif phenomenon == "agreement_attractor":
        subject = g.noun_phrase(num, g.rng.random() < 0.5, MAX_DEPTH) + g.attractor(MAX_DEPTH, 1 - num)
        verb, rest = COPULA, [g.rng.choice(ADJECTIVES)]
    elif phenomenon == "agreement_subject_relative":
        subject = g.noun_phrase(num, True, MAX_DEPTH) + g.subject_relative(num, MAX_DEPTH, 1 - num)
        verb, rest = g.verb_phrase(num, True, MAX_DEPTH)
    elif phenomenon == "agreement_object_relative":
        subject = g.noun_phrase(num, g.rng.random() < 0.5, MAX_DEPTH) + g.object_relative(MAX_DEPTH, 1 - num)
        verb, rest = COPULA, [g.rng.choice(ADJECTIVES)]
    else:  # agreement_across_sentences: the pronoun carries the number into the next sentence
        verb0, rest0 = g.verb_phrase(num, False, MAX_DEPTH)
        first = g.noun_phrase(num, False, MAX_DEPTH) + [verb0[num]] + rest0
        subject = _capitalize(first) + [".", "It" if num == SG else "They"]
        verb, rest = g.verb_phrase(num, False, MAX_DEPTH)
    return subject + [verb[num]] + rest + ["."], subject + [verb[1 - num]] + rest + ["."]


def minimal_pairs(phenomenon: str, n: int, seed: int) -> list[MinimalPair]:
    """`n` minimal pairs for `phenomenon` (one of PHENOMENA), deterministic in `seed`.

    The good sentence is drawn from the corpus grammar; the bad one changes one word: the verb's
    number (agreement_*), the type of a closing bracket (brackets), the announced count
    (counting). Use a seed different from the training corpus's for held-out items.
    """
    if phenomenon not in PHENOMENA:
        raise ValueError(f"unknown phenomenon {phenomenon!r}; known: {', '.join(PHENOMENA)}")
    pairs = []
    for i in range(n):
        g = Grammar(random.Random(f"{GENERATOR_VERSION}/pair/{phenomenon}/{seed}/{i}"))
        good, bad = _pair_words(g, phenomenon)
        pairs.append(MinimalPair(phenomenon, sentence_text(good), sentence_text(bad)))
    return pairs


# -- the corpus as parquet -----------------------------------------------------------------


def corpus_table(seed: int, start: int, stop: int, file_path: str):
    """Documents [start, stop) as an Arrow table with FineWeb's columns and types.

    `token_count` counts words here (FineWeb's counts GPT-2 tokens); `date` is fixed so the
    files are byte-identical for the same seed.
    """
    import pyarrow as pa

    texts = [document_text(seed, i) for i in range(start, stop)]
    n = len(texts)
    return pa.table(
        {
            "text": pa.array(texts, pa.string()),
            "id": pa.array([document_id(seed, i) for i in range(start, stop)], pa.string()),
            "dump": pa.array([GENERATOR_VERSION] * n, pa.string()),
            "url": pa.array(
                [f"https://synthetic.streamback.invalid/{seed}/{i}" for i in range(start, stop)], pa.string()
            ),
            "date": pa.array(["2024-01-01T00:00:00Z"] * n, pa.string()),
            "file_path": pa.array([file_path] * n, pa.string()),
            "language": pa.array(["en"] * n, pa.string()),
            "language_score": pa.array([1.0] * n, pa.float64()),
            "token_count": pa.array([len(t.split()) for t in texts], pa.int64()),
        }
    )


def write_part(seed: int, start: int, stop: int, path: str | Path) -> None:
    """Write documents [start, stop) to one parquet file (atomically)."""
    import pyarrow.parquet as pq

    path = Path(path)
    table = corpus_table(seed, start, stop, path.name)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, compression="zstd")


def part_ranges(documents: int, files: int) -> list[tuple[int, int]]:
    """Contiguous [start, stop) document ranges, one per file, sizes differing by at most one."""
    bounds = [documents * k // files for k in range(files + 1)]
    return list(zip(bounds[:-1], bounds[1:]))
