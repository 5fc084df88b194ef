"""Configuration of `nmt-preprocess`: inputs and output, SentencePiece, cleaning.

Plain dataclasses (no Hydra here): `nmt/config.py` registers `PreprocessConfig` as the
schema of configs/preprocess.yaml, so a mistyped key or a wrong type is rejected when
the config is composed. The keys follow fairseq-preprocess where one exists
(`data.trainpref`, `data.validpref`, `data.testpref`, `workers`).

Each dataclass checks itself in `validate()` (the CLI calls it before running, and so does
`nmt.data.build_data_dir` for configs built in Python); every message reads
`option=value: what is wrong; what to do`. Checks that need the file system (input files,
the destination) run in `build_data_dir`, before any slow work.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Optional

from nmt.data.languages import check_lang_code, direction_name, parse_direction, tag_piece
from nmt.errors import choice_error, option_error, setting

# in a prefix of a multilingual build, replaced by each pair's stem (raw/{pair}/train ->
# raw/en-de/train): a pair corpus that is not multi-parallel
PAIR_PLACEHOLDER = "{pair}"


class ModelType(str, Enum):
    """SentencePiece segmentation algorithm."""

    unigram = "unigram"
    bpe = "bpe"


def _plain_value(value: object) -> object:
    """An enum option as the string a user writes (configs built in Python may hold either)."""
    return value.value if isinstance(value, Enum) else value


def testpref_split_name(prefix: str) -> str:
    """A test prefix's split name: its file name, without a {pair} placeholder and the
    separators around it (raw/{pair}/test -> test, raw/test.{pair} -> test)."""
    name = Path(prefix).name
    if PAIR_PLACEHOLDER in name:
        name = name.replace(PAIR_PLACEHOLDER, "").strip("._-")
    return name


class InvalidUtf8(str, Enum):
    """What to do with a line that is not valid UTF-8."""

    error = "error"  # stop with the file and line number
    replace = "replace"  # type: ignore[assignment]  # keep the line, bad bytes become U+FFFD
    skip = "skip"  # drop the pair (counted as removed: invalid_utf8), in every split


@dataclass
class DataConfig:
    """Where the parallel text is and where the data dir goes (paths relative to the cwd)."""

    src: str = "en"  # source language: files are <prefix>.<src>
    tgt: str = "de"  # target language: files are <prefix>.<tgt>
    trainpref: Optional[str] = None  # training text prefix (required)
    validpref: Optional[str] = None  # stored as split "valid"; null: no valid split
    # test prefixes, any number; each is stored under its file name (test_2016_flickr, ...)
    testpref: list[str] = field(default_factory=list)
    # more training corpora, split name: prefix (+data.extra_train.clean=corpus/clean); cleaned
    # like train, sampled for SentencePiece with it, mixed in nmt-train by
    # train_split={train:1,clean:2}
    extra_train: dict[str, str] = field(default_factory=dict)
    dest: Optional[str] = None  # the data dir to write (required)
    # A multilingual data dir (one joint SentencePiece model, a tag per language): the
    # languages of a multi-parallel corpus (files <prefix>.<lang> for each), and the
    # directions to build ([en-de,de-en,en-fr]); empty pairs: every direction among langs.
    # Either one set makes the build multilingual; data.src and data.tgt are then unused.
    langs: list[str] = field(default_factory=list)
    pairs: list[str] = field(default_factory=list)

    @property
    def multilingual(self) -> bool:
        return bool(self.langs or self.pairs)

    def directions(self) -> list[tuple[str, str]]:
        """The (source, target) directions to build: data.pairs, else every one among
        data.langs; a single-pair build's one, else."""
        if self.pairs:
            return [parse_direction(pair, "data.pairs") for pair in self.pairs]
        if self.langs:
            return [(a, b) for a in self.langs for b in self.langs if a != b]
        return [(self.src, self.tgt)]

    def languages(self) -> list[str]:
        """data.langs, else the languages of data.pairs in the order they appear."""
        if self.langs:
            return list(self.langs)
        return list(dict.fromkeys(lang for pair in self.directions() for lang in pair))

    def pair_stems(self) -> dict[str, str]:
        """Each direction -> the stem its pair is stored under: the pair's first-listed
        direction ({"en-de": "en-de", "de-en": "en-de"} when en-de comes first)."""
        stems: dict[frozenset[str], str] = {}
        return {
            direction_name(src, tgt): stems.setdefault(
                frozenset((src, tgt)), direction_name(src, tgt)
            )
            for src, tgt in self.directions()
        }

    def tag_pieces(self) -> dict[str, str]:
        """Each language's tag (a SentencePiece control symbol); empty for a single pair."""
        return {lang: tag_piece(lang) for lang in self.languages()} if self.multilingual else {}

    def train_prefixes(self) -> list[tuple[str, str]]:
        """(split name, prefix) of the training corpora: train, then extra_train's."""
        assert self.trainpref is not None, "validate() first: data.trainpref is required"
        return [("train", self.trainpref), *self.extra_train.items()]

    def split_prefixes(self) -> list[tuple[str, str]]:
        """(split name, prefix): the training corpora, valid, then each test prefix under
        its file name."""
        named = self.train_prefixes()
        if self.validpref:
            named.append(("valid", self.validpref))
        named += [(testpref_split_name(prefix), prefix) for prefix in self.testpref]
        return named

    def option_of(self, split: str) -> str:
        """The option that names the prefix of split `split` (a name split_prefixes gives)."""
        if split == "train":
            return "data.trainpref"
        if split == "valid":
            return "data.validpref"
        return f"data.extra_train.{split}" if split in self.extra_train else "data.testpref"

    def validate(self) -> None:
        if self.multilingual:
            self._validate_languages()
        else:
            self._validate_pair()
        self._validate_prefixes()

    def _validate_pair(self) -> None:
        for key, lang in (("data.src", self.src), ("data.tgt", self.tgt)):
            if not lang or "/" in lang or lang != lang.strip() or " " in lang:
                raise option_error(
                    key,
                    lang,
                    "not a language suffix",
                    "give one such as en or de (input files are <prefix>.<lang>)",
                )
        if self.src == self.tgt:
            raise option_error(
                "data.tgt", self.tgt, "the same language as data.src", "give two different ones"
            )
        for name, prefix in self._prefixes():
            if PAIR_PLACEHOLDER in prefix:
                raise option_error(
                    name,
                    prefix,
                    f"{PAIR_PLACEHOLDER} stands for a pair of a multilingual build",
                    "give data.pairs (or data.langs), or the prefix of this pair's files",
                )

    def _validate_languages(self) -> None:
        defaults = DataConfig()
        for key, value, default in (
            ("data.src", self.src, defaults.src),
            ("data.tgt", self.tgt, defaults.tgt),
        ):
            if value != default:  # a multilingual build takes its languages from elsewhere
                raise option_error(
                    key,
                    value,
                    "unused by a multilingual build (data.langs or data.pairs set)",
                    "remove it; data.pairs lists the directions",
                )
        for lang in self.langs:
            check_lang_code(lang, "data.langs")
        if len(set(self.langs)) != len(self.langs):
            raise option_error(
                "data.langs", list(self.langs), "names a language twice", "list each once"
            )
        if not self.pairs and len(self.langs) < 2:
            raise option_error(
                "data.langs",
                list(self.langs),
                "a multilingual build needs two languages or more",
                "list them all, e.g. data.langs=[en,de,fr]",
            )
        directions = self.directions()  # each checked by parse_direction
        if len(set(directions)) != len(directions):
            raise option_error(
                "data.pairs", list(self.pairs), "lists a direction twice", "list each once"
            )
        used = dict.fromkeys(lang for pair in directions for lang in pair)
        unknown = [lang for lang in used if self.langs and lang not in self.langs]
        if unknown:
            raise option_error(
                "data.pairs",
                list(self.pairs),
                f"uses {', '.join(unknown)}, not in {setting('data.langs', list(self.langs))}",
                "add it to data.langs, or leave data.langs empty",
            )

    def _prefixes(self) -> list[tuple[str, str]]:
        """(option, prefix) of every input prefix given."""
        given = [("data.trainpref", self.trainpref), ("data.validpref", self.validpref)]
        given += [(f"data.extra_train.{name}", p) for name, p in self.extra_train.items()]
        given += [("data.testpref", p) for p in self.testpref]
        return [(key, prefix) for key, prefix in given if prefix]

    def _files(self) -> str:
        """The input files of a prefix, for messages: <prefix>.en and <prefix>.de."""
        files = [f"<prefix>.{lang}" for lang in self.languages()]
        return ", ".join(files[:-1]) + " and " + files[-1]

    def _validate_prefixes(self) -> None:
        if not self.trainpref:
            raise option_error(
                "data.trainpref",
                self.trainpref,
                "required",
                f"give the prefix of the training files ({self._files()}), "
                "e.g. data.trainpref=data/demo/train",
            )
        if not self.dest:
            raise option_error(
                "data.dest", self.dest, "required", "give the data dir to write, e.g. data-bin/demo"
            )
        for name, prefix in self.extra_train.items():
            if not name or name in ("train", "valid") or "/" in name or name.startswith("."):
                raise option_error(
                    f"data.extra_train.{name}",
                    prefix,
                    f"{name!r} cannot name a split",
                    "choose another name (not train or valid, no '/')",
                )
            if not prefix:
                raise option_error(
                    f"data.extra_train.{name}",
                    prefix,
                    "empty",
                    f"give the prefix of the corpus files ({self._files()})",
                )
        if not all(self.testpref):
            raise option_error(
                "data.testpref", list(self.testpref), "holds an empty prefix", "remove it"
            )
        taken: set[str] = set()
        for name, prefix in self.split_prefixes():
            if not name or name in taken:
                raise option_error(
                    "data.testpref",
                    prefix,
                    f"would be stored as split {name!r}, which is taken",
                    "give the test files distinct names other than train, valid and the "
                    "data.extra_train names",
                )
            taken.add(name)


@dataclass
class SpmConfig:
    """Train a SentencePiece model on the training split, or reuse existing model file(s)."""

    model: Optional[str] = None  # reuse this joint model file instead of training
    src_model: Optional[str] = None  # reuse separate models: source side (needs tgt_model)
    tgt_model: Optional[str] = None  # reuse separate models: target side (needs src_model)
    joint: bool = True  # when training: one model for both languages, else one per language
    model_type: ModelType = ModelType.bpe  # bpe or unigram
    vocab_size: int = 1000  # pieces per model, special ids and byte pieces included (demo size)
    character_coverage: float = 1.0  # share of characters covered; the rest: <unk> or bytes
    byte_fallback: bool = True  # spell unseen characters as UTF-8 bytes, so decoding is lossless
    # train on a random sample of at most this many sentences (drawn in one pass while the
    # files are scanned, seeded by `seed`): memory independent of the corpus; 0: every one
    input_sentence_size: int = 2_000_000
    user_defined_symbols: list[str] = field(default_factory=list)  # always kept as one piece
    num_threads: int = 2  # training threads; part of the recipe (another count, another model)
    seed: int = 1  # SentencePiece's random seed (sentence sampling)

    def validate(self, tags: int = 0) -> None:
        """`tags`: the language tags of a multilingual build, reserved pieces as well."""
        reserved = ["4 special pieces (<s> <pad> </s> <unk>)"]
        if self.byte_fallback:
            reserved.append("256 byte pieces (spm.byte_fallback=true)")
        if self.user_defined_symbols:
            reserved.append(f"{len(self.user_defined_symbols)} spm.user_defined_symbols")
        if tags:
            reserved.append(f"{tags} language tags")
        least = 4 + 256 * self.byte_fallback + len(self.user_defined_symbols) + tags
        if self.vocab_size <= least and self.model is None and self.src_model is None:
            raise option_error(
                "spm.vocab_size",
                self.vocab_size,
                f"too small: SentencePiece needs more than {least}, as the "
                f"{' and the '.join(reserved)} come first",
                "use about 1000 for the demo corpus, 8000 for Multi30k",
            )
        if self.num_threads < 1:
            raise option_error(
                "spm.num_threads",
                self.num_threads,
                "must be 1 or more",
                "use at most the number of CPU cores",
            )
        if self.input_sentence_size < 0:
            raise option_error(
                "spm.input_sentence_size",
                self.input_sentence_size,
                "must not be negative",
                "use 0 to train on every sentence, or e.g. 2000000",
            )
        if not 0 < self.character_coverage <= 1:
            raise option_error(
                "spm.character_coverage",
                self.character_coverage,
                "must be in (0, 1]",
                "use 1.0, or 0.9995 for large alphabets",
            )
        if self.seed < 0:
            raise option_error("spm.seed", self.seed, "must not be negative", "use 0 or more")
        if _plain_value(self.model_type) not in ModelType.__members__:
            raise choice_error("spm.model_type", self.model_type, list(ModelType.__members__))
        if any(not symbol for symbol in self.user_defined_symbols):
            raise option_error(
                "spm.user_defined_symbols",
                list(self.user_defined_symbols),
                "holds an empty string",
                "remove it",
            )
        if self.model is not None and (self.src_model or self.tgt_model):
            raise option_error(
                "spm.model",
                self.model,
                "set together with spm.src_model/spm.tgt_model",
                "give one joint model or two separate ones",
            )
        if (self.src_model is None) != (self.tgt_model is None):
            key, value = (
                ("spm.src_model", self.src_model)
                if self.src_model is not None
                else ("spm.tgt_model", self.tgt_model)
            )
            raise option_error(
                key,
                value,
                "the other side's model is missing",
                "give both spm.src_model and spm.tgt_model (separate models), or neither",
            )
        if self.model is not None and not self.joint:
            raise option_error(
                "spm.joint",
                self.joint,
                f"spm.model={self.model} is one joint model",
                "give spm.src_model and spm.tgt_model instead, or set spm.joint=true",
            )


# clean.langid_candidates' default: languages common in web-crawled corpora
LANGID_CANDIDATES = (
    "en",
    "de",
    "fr",
    "es",
    "it",
    "pt",
    "nl",
    "pl",
    "cs",
    "ru",
    "tr",
    "ar",
    "zh",
    "ja",
)


@dataclass
class CleanConfig:
    """Filters for the training split only; valid and test keep every line."""

    remove_empty: bool = True  # drop pairs with an empty side (after normalization)
    # drop pairs with a side over this many SentencePiece pieces (EOS not counted); null: off
    max_pieces: Optional[int] = 250
    # drop pairs whose longer side has over max_ratio times the pieces of the shorter; null: off
    max_ratio: Optional[float] = 3.0
    # drop a pair equal to an earlier one, compared after whitespace normalization (case
    # kept); the first is kept
    dedup: bool = False
    drop_copies: bool = False  # drop pairs whose target equals the source (same comparison)
    # keep pairs whose source py3langid identifies as data.src and target as data.tgt
    # (pip install 'nmt[langid]'); runs in the encoding workers
    langid: bool = False
    # languages the identifier chooses among, besides data.src and data.tgt: a line in one
    # of them is "another language"; []: the two alone; null: all the model knows (140,
    # which misjudges more short lines)
    langid_candidates: Optional[list[str]] = field(default_factory=lambda: list(LANGID_CANDIDATES))

    def validate(self) -> None:
        if self.max_pieces is not None and self.max_pieces < 1:
            raise option_error(
                "clean.max_pieces",
                self.max_pieces,
                "must be 1 or more",
                "use null for no limit",
                unit="SentencePiece pieces",
            )
        if self.max_ratio is not None and self.max_ratio < 1:
            raise option_error(
                "clean.max_ratio", self.max_ratio, "must be 1 or more", "use null for no limit"
            )
        if self.langid_candidates is not None and not all(self.langid_candidates):
            raise option_error(
                "clean.langid_candidates",
                list(self.langid_candidates),
                "names an empty language",
                "list language codes such as [en,de,fr]",
            )


@dataclass
class PreprocessConfig:
    """`nmt-preprocess`: raw parallel text -> data dir (see docs/ARCHITECTURE.md)."""

    data: DataConfig = field(default_factory=DataConfig)
    spm: SpmConfig = field(default_factory=SpmConfig)
    clean: CleanConfig = field(default_factory=CleanConfig)
    nfkc: bool = False  # Unicode NFKC first (whitespace is normalized either way)
    on_invalid_utf8: InvalidUtf8 = InvalidUtf8.error  # error, replace or skip
    workers: int = 2  # encoding processes; the output is the same for any number
    chunk_lines: int = 5000  # lines per unit of work handed to a worker
    overwrite: bool = False  # replace a data dir nmt-preprocess wrote at data.dest (only that)
    # join these data dirs (built with one SentencePiece model) into data.dest instead of
    # reading text: a split found in several becomes one split in shards (nmt.data.join)
    join: list[str] = field(default_factory=list)
    debug: bool = False  # show tracebacks instead of one-line errors

    def _validate_joint_model(self) -> None:
        """A multilingual data dir has one SentencePiece model, holding the tags."""
        s = self.spm
        if s.src_model is not None:
            raise option_error(
                "spm.src_model",
                s.src_model,
                "a multilingual build (data.langs or data.pairs) has one joint model",
                "give spm.model instead, or let nmt-preprocess train one",
            )
        if not s.joint:
            raise option_error(
                "spm.joint",
                s.joint,
                "a multilingual build (data.langs or data.pairs) needs one joint model, "
                "which holds the language tags",
                "set spm.joint=true",
            )

    def validate(self) -> None:
        """Raise NmtError naming the first option that cannot work."""
        if self.join:
            if not self.data.dest:
                raise option_error(
                    "data.dest", self.data.dest, "required", "give the data dir to write"
                )
            if len(set(self.join)) != len(self.join) or not all(self.join):
                raise option_error(
                    "join",
                    list(self.join),
                    "names a data dir twice or an empty one",
                    "list each shard's data dir once",
                )
            return
        self.data.validate()
        self.spm.validate(tags=len(self.data.tag_pieces()))
        self.clean.validate()
        if self.data.multilingual:
            self._validate_joint_model()
        if self.workers < 1:
            raise option_error(
                "workers", self.workers, "must be 1 or more", "use 1 to encode in this process"
            )
        if self.chunk_lines < 1:
            raise option_error(
                "chunk_lines",
                self.chunk_lines,
                "must be 1 or more",
                "use the default, 5000",
            )
        if _plain_value(self.on_invalid_utf8) not in InvalidUtf8.__members__:
            raise choice_error(
                "on_invalid_utf8", self.on_invalid_utf8, list(InvalidUtf8.__members__)
            )


@dataclass
class ShortlistConfig:
    """`nmt-shortlist`: a data dir's parallel training data -> a target-vocabulary
    shortlist file (a CTranslate2 vocabulary map) for nmt-generate shortlist=."""

    data: Optional[str] = None  # data dir written by nmt-preprocess (required)
    split: str = "train"  # the parallel split the lexical table is learned from
    output: Optional[str] = None  # the shortlist file; null = <data>/shortlist.txt
    topk: int = 50  # target candidates kept per source piece (by p(target | source))
    frequent: int = 100  # most frequent target pieces, candidates for every sentence
    iterations: int = 5  # EM iterations of IBM Model 1 (the lexical table)
    max_pairs: int = 1000000  # sentence pairs read (a seeded sample of bigger splits); 0 = all
    seed: int = 1  # the sample's seed
    check_split: Optional[str] = "valid"  # report candidates and coverage on it (null: skip)
    overwrite: bool = False  # replace an existing output file
    progress: bool = True  # tqdm bar on stderr
    debug: bool = False  # show tracebacks instead of one-line errors

    def validate(self) -> None:
        """Raise NmtError naming the first option that cannot work (the data dir itself
        is checked when building)."""
        if not self.data:
            raise option_error(
                "data", self.data, "required", "give the data dir the model was trained on"
            )
        if not self.split:
            raise option_error("split", self.split, "empty", "name a split of the data dir (train)")
        if self.topk < 1:
            raise option_error(
                "topk", self.topk, "must be 1 or more", "use e.g. 50 candidates per piece"
            )
        if self.frequent < 0:
            raise option_error("frequent", self.frequent, "must not be negative", "use 0 for none")
        if self.iterations < 1:
            raise option_error("iterations", self.iterations, "must be 1 or more", "use e.g. 5")
        if self.max_pairs < 0:
            raise option_error("max_pairs", self.max_pairs, "must not be negative", "use 0 for all")

    @property
    def output_path(self) -> Path:
        """output=, or shortlist.txt in the data dir."""
        return Path(self.output) if self.output else Path(str(self.data)) / "shortlist.txt"
