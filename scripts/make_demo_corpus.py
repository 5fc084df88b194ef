#!/usr/bin/env python3
"""Generate the demo English->German corpus in data/demo/ (deterministic, no copied text).

Every sentence comes from a handful of templates chosen so that a tiny Transformer has to
learn what makes German hard for a translation model:
  - number words become one compound word with the units before the tens:
    "three hundred twenty-one" -> "dreihunderteinundzwanzig";
  - noun compounds are written as one word: "kitchen chairs" -> "Küchenstühle";
  - verbs move: the participle and the infinitive go to the end ("ich habe ... gekauft",
    "wir wollen ... kaufen"), subordinate clauses are verb-final ("..., dass wir ... kaufen"),
    and a leading time adverb puts the verb before the subject ("morgen kaufen wir ...").
The vocabulary is small and the sentences short (at most 14 words), so the task is learnable
in minutes on a CPU. Splits never share a source sentence.

usage: python scripts/make_demo_corpus.py [--out data/demo] [--train 10000] [--valid 500]
                                          [--test 500] [--seed 1]
The committed files are this script's output with the default arguments.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

# ---------------------------------------------------------------------------------------
# Number words. English: American style without "and" ("one hundred twenty-one").
# German: one word below a million; 100 is "hundert" and 1000 is "tausend" (not "einhundert",
# "eintausend"); a final 1 is "eins" ("hunderteins") except inside a compound
# ("einundzwanzig", "einhunderttausend" is written "hunderteintausend").
# ---------------------------------------------------------------------------------------

EN_ONES = [
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
]
EN_TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
DE_ONES = [
    "null",
    "eins",
    "zwei",
    "drei",
    "vier",
    "fünf",
    "sechs",
    "sieben",
    "acht",
    "neun",
    "zehn",
    "elf",
    "zwölf",
    "dreizehn",
    "vierzehn",
    "fünfzehn",
    "sechzehn",
    "siebzehn",
    "achtzehn",
    "neunzehn",
]
DE_TENS = [
    "",
    "",
    "zwanzig",
    "dreißig",
    "vierzig",
    "fünfzig",
    "sechzig",
    "siebzig",
    "achtzig",
    "neunzig",
]


def english_number(n: int) -> str:
    """0 <= n < 1,000,000 as English words: 321 -> "three hundred twenty-one"."""
    if not 0 <= n < 1_000_000:
        raise ValueError(f"number out of range: {n}")
    if n < 20:
        return EN_ONES[n]
    if n < 100:
        tens, unit = divmod(n, 10)
        return EN_TENS[tens] + (f"-{EN_ONES[unit]}" if unit else "")
    if n < 1000:
        hundreds, rest = divmod(n, 100)
        return f"{EN_ONES[hundreds]} hundred" + (f" {english_number(rest)}" if rest else "")
    thousands, rest = divmod(n, 1000)
    return f"{english_number(thousands)} thousand" + (f" {english_number(rest)}" if rest else "")


def _german_below_thousand(n: int, final: bool) -> str:
    """1 <= n < 1000; `final` is False inside a compound, where a last 1 is "ein"."""
    hundreds, rest = divmod(n, 100)
    head = "" if hundreds == 0 else ("hundert" if hundreds == 1 else DE_ONES[hundreds] + "hundert")
    if rest == 0:
        return head
    if rest == 1:
        return head + ("eins" if final else "ein")
    if rest < 20:
        return head + DE_ONES[rest]
    tens, unit = divmod(rest, 10)
    if unit == 0:
        return head + DE_TENS[tens]
    return head + ("ein" if unit == 1 else DE_ONES[unit]) + "und" + DE_TENS[tens]


def german_number(n: int) -> str:
    """0 <= n < 1,000,000 as one German word: 321 -> "dreihunderteinundzwanzig"."""
    if not 0 <= n < 1_000_000:
        raise ValueError(f"number out of range: {n}")
    if n == 0:
        return DE_ONES[0]
    thousands, rest = divmod(n, 1000)
    head = ""
    if thousands:
        head = "tausend" if thousands == 1 else _german_below_thousand(thousands, False) + "tausend"
    return head + (_german_below_thousand(rest, True) if rest else "")


# ---------------------------------------------------------------------------------------
# Lexicon. Objects are always plural accusative without an article, so adjectives take the
# strong ending -e ("drei rote Stühle") and no gender or case agreement is needed.
# ---------------------------------------------------------------------------------------

# English plural -> German plural (capitalised noun)
NOUNS = {
    "books": "Bücher",
    "chairs": "Stühle",
    "tables": "Tische",
    "lamps": "Lampen",
    "apples": "Äpfel",
    "cars": "Autos",
    "houses": "Häuser",
    "bottles": "Flaschen",
    "keys": "Schlüssel",
    "windows": "Fenster",
    "doors": "Türen",
    "boxes": "Kisten",
    "cups": "Tassen",
    "pens": "Stifte",
    "shoes": "Schuhe",
    "flowers": "Blumen",
    "bicycles": "Fahrräder",
    "glasses": "Gläser",
    "stones": "Steine",
    "letters": "Briefe",
}

# English compound (two words) -> German compound (one word)
COMPOUNDS = {
    "kitchen tables": "Küchentische",
    "kitchen chairs": "Küchenstühle",
    "kitchen windows": "Küchenfenster",
    "kitchen lamps": "Küchenlampen",
    "garden chairs": "Gartenstühle",
    "garden tables": "Gartentische",
    "garden doors": "Gartentüren",
    "garden flowers": "Gartenblumen",
    "house doors": "Haustüren",
    "house keys": "Hausschlüssel",
    "car keys": "Autoschlüssel",
    "car doors": "Autotüren",
    "car windows": "Autofenster",
    "door keys": "Türschlüssel",
    "office chairs": "Bürostühle",
    "office lamps": "Bürolampen",
    "school books": "Schulbücher",
    "coffee cups": "Kaffeetassen",
    "tea cups": "Teetassen",
    "water bottles": "Wasserflaschen",
    "wine bottles": "Weinflaschen",
    "wine glasses": "Weingläser",
    "water glasses": "Wassergläser",
    "shoe boxes": "Schuhkisten",
    "tool boxes": "Werkzeugkisten",
    "apple boxes": "Apfelkisten",
}

# English -> German adjective stem (strong plural ending -e is added)
ADJECTIVES = {
    "red": "rot",
    "blue": "blau",
    "green": "grün",
    "old": "alt",
    "new": "neu",
    "small": "klein",
    "big": "groß",
    "cheap": "billig",
    "heavy": "schwer",
    "white": "weiß",
}

# Subjects: English, German, person key for conjugation, English third person singular?
SUBJECTS = [
    ("I", "ich", "1s", False),
    ("you", "du", "2s", False),
    ("he", "er", "3s", True),
    ("she", "sie", "3s", True),
    ("we", "wir", "1p", False),
    ("they", "sie", "3p", False),
    ("Anna", "Anna", "3s", True),
    ("Tom", "Tom", "3s", True),
    ("Lena", "Lena", "3s", True),
    ("Max", "Max", "3s", True),
]

# Regular German verbs: English base, English 3sg, English past, German stem, participle
VERBS = [
    ("buy", "buys", "bought", "kauf", "gekauft"),
    ("sell", "sells", "sold", "verkauf", "verkauft"),
    ("build", "builds", "built", "bau", "gebaut"),
    ("look for", "looks for", "looked for", "such", "gesucht"),
    ("order", "orders", "ordered", "bestell", "bestellt"),
    ("repair", "repairs", "repaired", "reparier", "repariert"),
    ("paint", "paints", "painted", "mal", "gemalt"),
    ("count", "counts", "counted", "zähl", "gezählt"),
    ("need", "needs", "needed", "brauch", "gebraucht"),
    ("carry", "carries", "carried", "trag", "getragen"),
]
# "tragen" is regular in every person we use except du/er ("trägst", "trägt").
IRREGULAR_PRESENT = {("trag", "2s"): "trägst", ("trag", "3s"): "trägt"}

REGULAR_ENDINGS = {"1s": "e", "2s": "st", "3s": "t", "1p": "en", "3p": "en"}
HABEN = {"1s": "habe", "2s": "hast", "3s": "hat", "1p": "haben", "3p": "haben"}
WOLLEN = {"1s": "will", "2s": "willst", "3s": "will", "1p": "wollen", "3p": "wollen"}
SAY_VERBS = [  # English base, English 3sg, German conjugation by person
    ("say", "says", {"1s": "sage", "2s": "sagst", "3s": "sagt", "1p": "sagen", "3p": "sagen"}),
    (
        "think",
        "thinks",
        {"1s": "denke", "2s": "denkst", "3s": "denkt", "1p": "denken", "3p": "denken"},
    ),
    ("know", "knows", {"1s": "weiß", "2s": "weißt", "3s": "weiß", "1p": "wissen", "3p": "wissen"}),
]
TIME_ADVERBS = {
    "today": "heute",
    "tomorrow": "morgen",
    "now": "jetzt",
    "every day": "jeden Tag",
    "on Monday": "am Montag",
    "on Friday": "am Freitag",
}


def present(stem: str, person: str) -> str:
    return IRREGULAR_PRESENT.get((stem, person), stem + REGULAR_ENDINGS[person])


def capitalize_first(text: str) -> str:
    return text[0].upper() + text[1:]


class Generator:
    """Draws sentence pairs from the templates with its own random stream."""

    def __init__(self, seed: int, max_number: int = 999) -> None:
        self.rng = random.Random(seed)
        # Counts before a noun: 1 and x01 would need "ein/eine/einen", which depends on gender
        # and case; leaving them out keeps the noun phrase free of agreement.
        self.counts = [n for n in range(2, max_number + 1) if n % 100 != 1]
        self.max_number = max_number

    def noun_phrase(self) -> tuple[str, str]:
        rng = self.rng
        n = rng.choice(self.counts)
        en, de = [english_number(n)], [german_number(n)]
        if rng.random() < 0.4:
            adj_en, adj_de = rng.choice(list(ADJECTIVES.items()))
            en.append(adj_en)
            de.append(adj_de + "e")
        noun_en, noun_de = rng.choice(list((NOUNS | COMPOUNDS).items()))
        return " ".join(en + [noun_en]), " ".join(de + [noun_de])

    def subject(self) -> tuple[str, str, str, bool]:
        return self.rng.choice(SUBJECTS)

    def clause_present(self) -> tuple[str, str, str, str]:
        """(English clause, German subject, German object, German finite verb), unordered."""
        subj_en, subj_de, person, third = self.subject()
        base, third_form, _, stem, _ = self.rng.choice(VERBS)
        np_en, np_de = self.noun_phrase()
        verb_en = third_form if third else base
        return f"{subj_en} {verb_en} {np_en}", subj_de, np_de, present(stem, person)

    def pair(self) -> tuple[str, str]:
        rng = self.rng
        kind = rng.choices(
            ["perfect", "modal", "that", "time", "present", "number"], weights=[4, 3, 3, 3, 2, 1]
        )[0]
        if kind == "perfect":  # participle goes last
            subj_en, subj_de, person, _ = self.subject()
            _, _, past, _, participle = rng.choice(VERBS)
            np_en, np_de = self.noun_phrase()
            en = f"{subj_en} {past} {np_en}"
            de = f"{subj_de} {HABEN[person]} {np_de} {participle}"
        elif kind == "modal":  # infinitive goes last
            subj_en, subj_de, person, third = self.subject()
            base, _, _, stem, _ = rng.choice(VERBS)
            np_en, np_de = self.noun_phrase()
            en = f"{subj_en} {'wants' if third else 'want'} to {base} {np_en}"
            de = f"{subj_de} {WOLLEN[person]} {np_de} {stem}en"
        elif kind == "that":  # subordinate clause: finite verb goes last
            subj_en, subj_de, person, third = self.subject()
            say_base, say_third, say_de = rng.choice(SAY_VERBS)
            clause_en, sub_de, obj_de, verb_de = self.clause_present()
            en = f"{subj_en} {say_third if third else say_base} that {clause_en}"
            de = f"{subj_de} {say_de[person]}, dass {sub_de} {obj_de} {verb_de}"
        elif kind == "time":  # verb second: the subject follows the verb
            adv_en, adv_de = rng.choice(list(TIME_ADVERBS.items()))
            clause_en, sub_de, obj_de, verb_de = self.clause_present()
            en = f"{adv_en} {clause_en}"
            de = f"{adv_de} {verb_de} {sub_de} {obj_de}"
        elif kind == "present":
            clause_en, sub_de, obj_de, verb_de = self.clause_present()
            en = clause_en
            de = f"{sub_de} {verb_de} {obj_de}"
        else:  # a bare number, so that "eins" and the x01 forms appear too
            n = rng.randint(1, self.max_number)
            en = f"the number {english_number(n)}"
            de = f"die Zahl {german_number(n)}"
        return capitalize_first(en) + ".", capitalize_first(de) + "."


def generate(train: int, valid: int, test: int, seed: int) -> dict[str, list[tuple[str, str]]]:
    """Disjoint splits: a source sentence is drawn at most once over all splits."""
    gen = Generator(seed)
    seen: set[str] = set()
    splits: dict[str, list[tuple[str, str]]] = {}
    for name, size in (("train", train), ("valid", valid), ("test", test)):
        pairs: list[tuple[str, str]] = []
        attempts = 0
        while len(pairs) < size:
            attempts += 1
            if attempts > 50 * size + 1000:
                raise SystemExit(f"could not draw {size} new sentences for {name}; ask for fewer")
            src, tgt = gen.pair()
            if src not in seen:
                seen.add(src)
                pairs.append((src, tgt))
        splits[name] = pairs
    return splits


def write_corpus(out: Path, splits: dict[str, list[tuple[str, str]]]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name, pairs in splits.items():
        for side, lang in ((0, "en"), (1, "de")):
            text = "".join(pair[side] + "\n" for pair in pairs)
            (out / f"{name}.{lang}").write_text(text, encoding="utf-8", newline="\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(__file__).resolve().parent.parent / "data" / "demo",
        help="output folder (default: data/demo)",
    )
    parser.add_argument(
        "--train",
        "--size",
        type=int,
        default=10000,
        dest="train",
        help="training pairs (default 10000)",
    )
    parser.add_argument("--valid", type=int, default=500, help="validation pairs (default 500)")
    parser.add_argument("--test", type=int, default=500, help="test pairs (default 500)")
    parser.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    args = parser.parse_args()
    splits = generate(args.train, args.valid, args.test, args.seed)
    write_corpus(args.out, splits)
    print(f"wrote {', '.join(f'{n}: {len(p)}' for n, p in splits.items())} pairs to {args.out}")


if __name__ == "__main__":
    main()
