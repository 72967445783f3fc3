"""A small farm world: a probabilistic grammar, a word-level tokenizer, a seeded corpus and a parser.

The language (number agreement between determiner, noun and verb; animate subjects; food objects
for "eat"; places after prepositions)::

    Doc   -> BOS S S* EOS
    S     -> NP[anim, n] VP[n] "."
    VP[n] -> Vi[n] PP? | Vt[n] NP[anim, m] PP? | Veat[n] NP[food, m] PP?
    NP[c, n] -> Det[n] Adj* N[c, n] PP?
    PP    -> Prep NP[place, m]

"the" agrees with both numbers; every other determiner with one.  `is_grammatical` is an exact
recursive-descent parser of this grammar (PPs attach greedily to the nearest NP, which accepts
exactly the same strings because an optional PP is only ever followed by "." or another PP);
`generate_document` samples from it with decaying PP and adjective probabilities.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"
SPECIALS = (PAD, BOS, EOS)
END = "."

DETERMINERS = {"a": ("sg",), "this": ("sg",), "every": ("sg",), "the": ("sg", "pl"),
               "these": ("pl",), "some": ("pl",), "two": ("pl",)}
NOUNS = {  # class -> (singular, plural) pairs
    "anim": [("cat", "cats"), ("dog", "dogs"), ("hen", "hens"), ("cow", "cows"), ("goat", "goats"),
             ("duck", "ducks"), ("farmer", "farmers")],
    "food": [("apple", "apples"), ("carrot", "carrots"), ("seed", "seeds")],
    "place": [("barn", "barns"), ("field", "fields"), ("garden", "gardens"), ("pond", "ponds")],
}
VERBS = {  # kind -> (singular, plural) pairs; kind decides the object
    "intrans": [("sleeps", "sleep"), ("runs", "run"), ("sings", "sing")],
    "trans": [("sees", "see"), ("chases", "chase"), ("likes", "like"), ("follows", "follow")],
    "eat": [("eats", "eat")],
}
ADJECTIVES = ("big", "small", "red", "happy", "old", "green")
PREPOSITIONS = ("in", "near", "behind", "on")
MAX_DOC_TOKENS = 128  # documents (BOS..EOS) fit the models' context


def _words() -> list[str]:
    nouns = [w for pairs in NOUNS.values() for pair in pairs for w in pair]
    verbs = [w for pairs in VERBS.values() for pair in pairs for w in pair]
    return [*SPECIALS, *DETERMINERS, *nouns, *verbs, *ADJECTIVES, *PREPOSITIONS, END]


# word -> (category, class or kind, number) for the parser
NUMBERS = ("sg", "pl")
_NOUN_INFO = {w: (c, n) for c, pairs in NOUNS.items() for pair in pairs for w, n in zip(pair, NUMBERS, strict=True)}
_VERB_INFO = {w: (k, n) for k, pairs in VERBS.items() for pair in pairs for w, n in zip(pair, NUMBERS, strict=True)}


@dataclass(frozen=True)
class Tokenizer:
    """Word-level tokenizer: one id per word; ids 0, 1, 2 are PAD, BOS, EOS."""

    words: tuple[str, ...] = tuple(_words())

    def __post_init__(self) -> None:
        object.__setattr__(self, "ids", {w: i for i, w in enumerate(self.words)})

    @property
    def vocab_size(self) -> int:
        return len(self.words)

    @property
    def pad(self) -> int:
        return self.ids[PAD]

    @property
    def bos(self) -> int:
        return self.ids[BOS]

    @property
    def eos(self) -> int:
        return self.ids[EOS]

    def encode(self, text: str) -> list[int]:
        """'<bos> the cat sleeps . <eos>' -> ids; unknown words raise ValueError naming the word."""
        out = []
        for w in text.split():
            if w not in self.ids:
                raise ValueError(f"encode: unknown word {w!r}; the vocabulary has {self.vocab_size} words")
            out.append(self.ids[w])
        return out

    def decode(self, ids: list[int]) -> str:
        for i in ids:
            if not 0 <= int(i) < self.vocab_size:
                raise ValueError(f"decode: token id {int(i)} is outside the vocabulary [0, {self.vocab_size})")
        return " ".join(self.words[int(i)] for i in ids)


TOKENIZER = Tokenizer()


# ---------------------------------------------------------------------------------------------
# generation
def _noun_phrase(rng: random.Random, cls: str, depth: int) -> list[str]:
    number = rng.choice(("sg", "pl"))
    det = rng.choice([d for d, nums in DETERMINERS.items() if number in nums])
    adjectives = []
    while len(adjectives) < 2 and rng.random() < 0.3:
        adjectives.append(rng.choice(ADJECTIVES))
    noun = rng.choice(NOUNS[cls])[0 if number == "sg" else 1]
    pp = _prep_phrase(rng, depth + 1) if rng.random() < (0.25 if depth == 0 else 0.1 if depth == 1 else 0) else []
    return [det, *adjectives, noun, *pp]


def _prep_phrase(rng: random.Random, depth: int) -> list[str]:
    return [rng.choice(PREPOSITIONS), *_noun_phrase(rng, "place", depth)]


def generate_sentence(rng: random.Random) -> list[str]:
    subject = _noun_phrase(rng, "anim", 0)
    number = _NOUN_INFO[next(w for w in subject if w in _NOUN_INFO)][1]  # the head noun comes first
    kind = rng.choices(("intrans", "trans", "eat"), weights=(3, 4, 2))[0]
    verb = rng.choice(VERBS[kind])[0 if number == "sg" else 1]
    obj = {"intrans": [], "trans": _noun_phrase(rng, "anim", 1), "eat": _noun_phrase(rng, "food", 1)}[kind]
    pp = _prep_phrase(rng, 1) if rng.random() < 0.3 else []
    return [*subject, verb, *obj, *pp, END]


def generate_document(rng: random.Random) -> list[int]:
    """BOS, 2-4 sentences (fewer if the context would overflow, never 0), EOS -- as token ids."""
    words: list[str] = []
    for _ in range(rng.randint(2, 4)):
        sentence = generate_sentence(rng)
        if words and len(words) + len(sentence) + 2 > MAX_DOC_TOKENS:
            break
        words += sentence
    return [TOKENIZER.bos, *TOKENIZER.encode(" ".join(words)), TOKENIZER.eos]


def corpus(n_docs: int, seed: int) -> list[list[int]]:
    """`n_docs` documents from a seeded generator (same seed, same corpus, on any machine)."""
    rng = random.Random(seed)
    return [generate_document(rng) for _ in range(n_docs)]


TRAIN_SEED, TEST_SEED = 1234, 98765  # disjoint streams: the test corpus is held out


# ---------------------------------------------------------------------------------------------
# parsing
class _Parser:
    """Recursive descent over the word list; every method returns the next index or raises."""

    def __init__(self, words: list[str]) -> None:
        self.words = words

    def at(self, i: int) -> str | None:
        return self.words[i] if i < len(self.words) else None

    def noun_phrase(self, i: int, cls: str) -> tuple[int, str]:
        det = self.at(i)
        if det not in DETERMINERS:
            raise SyntaxError(f"expected a determiner at {i}, got {det!r}")
        i += 1
        while self.at(i) in ADJECTIVES:
            i += 1
        noun = self.at(i)
        if noun not in _NOUN_INFO or _NOUN_INFO[noun][0] != cls:
            raise SyntaxError(f"expected a {cls} noun at {i}, got {noun!r}")
        number = _NOUN_INFO[noun][1]
        if number not in DETERMINERS[det]:
            raise SyntaxError(f"determiner {det!r} does not agree with {noun!r}")
        return self.optional_pp(i + 1), number

    def optional_pp(self, i: int) -> int:
        if self.at(i) in PREPOSITIONS:
            return self.noun_phrase(i + 1, "place")[0]
        return i

    def sentence(self, i: int) -> int:
        i, number = self.noun_phrase(i, "anim")
        verb = self.at(i)
        if verb not in _VERB_INFO:
            raise SyntaxError(f"expected a verb at {i}, got {verb!r}")
        kind, verb_number = _VERB_INFO[verb]
        if verb_number != number:
            raise SyntaxError(f"verb {verb!r} does not agree with a {number} subject")
        i += 1
        if kind != "intrans":
            i = self.noun_phrase(i, "anim" if kind == "trans" else "food")[0]
        i = self.optional_pp(i)
        if self.at(i) != END:
            raise SyntaxError(f"expected '.' at {i}, got {self.at(i)!r}")
        return i + 1


def parse_error(ids: list[int]) -> str | None:
    """Why the token list is not a grammatical document (BOS S+ EOS), or None if it is."""
    if any(not 0 <= int(t) < TOKENIZER.vocab_size for t in ids):
        return "token id outside the vocabulary"
    words = [TOKENIZER.words[int(t)] for t in ids]
    if len(words) < 2 or words[0] != BOS or words[-1] != EOS:
        return "a document is BOS ... EOS"
    body = words[1:-1]
    parser = _Parser(body)
    try:
        i = parser.sentence(0)
        while i < len(body):
            i = parser.sentence(i)
    except SyntaxError as err:
        return str(err)
    return None


def is_grammatical(ids: list[int]) -> bool:
    return parse_error(ids) is None
