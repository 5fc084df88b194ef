"""SentencePiece tokenizers whose ids are nmt's model ids, and the one text normalization.

Models are trained with the fixed special ids of `nmt.vocab` and with SentencePiece's
own normalization switched off ("identity"): `normalize_text` is the only normalization, used
by preprocess and by generate alike, so `decode(encode(normalize_text(x))) == normalize_text(x)`.
"""

from __future__ import annotations

import hashlib
import io
import re
import unicodedata
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import sentencepiece as spm

from nmt.data.segmentations import SEGMENTATIONS, WORD_START, PieceIndex, Spellings
from nmt.errors import NmtError
from nmt.fsutil import atomic_write_text
from nmt.vocab import BOS, EOS, PAD, SPECIAL_IDS, UNK

if TYPE_CHECKING:
    from nmt.data.meta import DataMeta


def normalize_text(text: str, nfkc: bool) -> str:
    """Optional NFKC, then whitespace runs (tabs, CR, NBSP, ...) become one space, trimmed."""
    if nfkc:
        text = unicodedata.normalize("NFKC", text)
    return " ".join(text.split())


class Tokenizer:
    """A loaded SentencePiece model; ids are model ids (bos=0, pad=1, eos=2, unk=3)."""

    def __init__(self, model_bytes: bytes, name: str = "<bytes>") -> None:
        self.name = name
        self.model_bytes = bytes(model_bytes)
        self._sp = spm.SentencePieceProcessor()
        try:
            self._sp.LoadFromSerializedProto(self.model_bytes)
        except Exception as exc:
            raise NmtError(f"{name}: not a SentencePiece model ({_first_line(exc)})") from exc
        self.vocab_size: int = self._sp.get_piece_size()
        self._piece_index: PieceIndex | None = None  # built when segmentations() needs it

    @classmethod
    def from_file(cls, path: str | Path) -> Tokenizer:
        path = Path(path)
        if not path.is_file():
            raise NmtError(f"{path}: SentencePiece model not found")
        return cls(path.read_bytes(), name=str(path))

    @classmethod
    def from_bytes(cls, model_bytes: bytes) -> Tokenizer:
        return cls(model_bytes)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.model_bytes).hexdigest()

    def special_ids(self) -> dict[str, int]:
        return {
            "bos": self._sp.bos_id(),
            "pad": self._sp.pad_id(),
            "eos": self._sp.eos_id(),
            "unk": self._sp.unk_id(),
        }

    def check_special_ids(self, what: str) -> None:
        """NmtError unless the model uses nmt's ids (a model from elsewhere usually does not)."""
        found = self.special_ids()
        if found != SPECIAL_IDS:
            shown = " ".join(f"{k}={v}" for k, v in found.items())
            raise NmtError(
                f"{what}: the model's special ids are {shown}, nmt needs bos=0 pad=1 "
                "eos=2 unk=3; let nmt-preprocess train the model instead"
            )

    def control_symbol_ids(self, pieces: Iterable[str]) -> dict[str, int]:
        """piece -> id of those of `pieces` that are control symbols of the model (the
        language tags of a multilingual model: text never encodes to them)."""
        found = {}
        for piece in pieces:
            i = self._sp.piece_to_id(piece)  # the unknown id when not a piece
            if self._sp.id_to_piece(i) == piece and self._sp.is_control(i):
                found[piece] = i
        return found

    def encode(self, text: str) -> list[int]:
        """Ids of already normalized text, without EOS."""
        return self._sp.encode(text)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return self._sp.encode(list(texts))

    def decode_batch(self, seqs: Sequence[np.ndarray]) -> list[str]:
        """decode() of each id array; special ids dropped."""
        kept = [seq[seq > UNK].tolist() for seq in map(np.asarray, seqs)]
        return self._sp.decode(kept, num_threads=1)

    def nbest_encode(self, text: str, nbest_size: int) -> list[list[int]]:
        """Ids of the `nbest_size` best segmentations of `text`, best first (unigram)."""
        return self._sp.nbest_encode_as_ids(text, nbest_size)

    def encode_as_pieces(self, text: str) -> list[str]:
        return self._sp.encode(text, out_type=str)

    def pieces(self) -> list[str]:
        """Every piece, in id order (piece i has id i)."""
        return self._sp.id_to_piece(list(range(self.vocab_size)))

    def normalized(self, text: str, word_start: bool = True) -> str:
        """`text` as SentencePiece's normalizer hands it to segmentation: whitespace as
        "▁", with the "▁" that marks a word start ("rote Mütze" -> "▁rote▁Mütze");
        word_start=False: without that first "▁" ("rote▁Mütze": the text glued to what
        precedes it, as after "(" or as a translation's first piece)."""
        normalized = self._sp.normalize(text)
        if not word_start and normalized.startswith(WORD_START):
            return normalized[len(WORD_START) :]
        return normalized

    def segmentations(
        self, text: str, limit: int = SEGMENTATIONS, *, word_start: bool = True
    ) -> list[tuple[int, ...]]:
        """The id sequences whose pieces spell exactly `normalized(text, word_start)`,
        at most `limit` of them: with word_start, the tokenizer's own (encode) first;
        then the others by number of pieces, fewest first (ties: longer pieces first).
        `segmentation_count` says how many there are; [] when the vocabulary cannot
        write the text. The pieces a spelling may use: nmt.data.segmentations.PieceIndex
        (normal and user-defined ones; byte pieces only for a character without a piece).
        """
        if limit < 1:
            raise ValueError(f"limit={limit}: give at least 1")
        spellings = self._spellings(self.normalized(text, word_start))
        found: dict[tuple[int, ...], None] = {}  # in order, each once
        if word_start and spellings.count():
            canonical = tuple(self.encode(text))
            if UNK not in canonical:
                found[canonical] = None
        for ids in spellings.fewest_first():
            if len(found) == limit:
                break
            found.setdefault(ids, None)
        return list(found)

    def segmentation_count(self, text: str, *, word_start: bool = True) -> int:
        """How many id sequences spell `normalized(text, word_start)` (segmentations)."""
        return self._spellings(self.normalized(text, word_start)).count()

    def byte_spellings(self, text: str) -> list[tuple[int, ...]]:
        """The byte-piece spelling of each character of `normalized(text)` that has a
        piece of its own, each once, in order: ids the tokenizer never writes (it falls
        back to bytes only for characters without a piece), that a model may still
        produce; [] without byte pieces."""
        index = self._index()
        chars = [c for c in dict.fromkeys(self.normalized(text)) if c in index.pieces]
        return [spelled for spelled in map(index.byte_spelling, chars) if spelled]

    def _spellings(self, normalized: str) -> Spellings:
        return self._index().spellings(normalized)

    def _index(self) -> PieceIndex:
        if self._piece_index is None:
            self._piece_index = PieceIndex(self._sp)
        return self._piece_index

    def decode(self, ids: Iterable[int]) -> str:
        """Text of `ids`; bos, pad, eos and unk are dropped. Accepts lists, arrays, tensors."""
        if hasattr(ids, "tolist"):
            ids = ids.tolist()
        return self._sp.decode([int(i) for i in ids if i > UNK])

    def write_vocab(self, path: str | Path) -> None:
        """SentencePiece's .vocab format: piece TAB score, one per id."""
        ids = list(range(self.vocab_size))
        pieces, scores = self._sp.id_to_piece(ids), self._sp.get_score(ids)
        text = "".join(f"{piece}\t{score:g}\n" for piece, score in zip(pieces, scores))
        atomic_write_text(path, text)


def train_tokenizer(
    sentences: Iterable[str],
    *,
    vocab_size: int,
    model_type: str,
    character_coverage: float,
    byte_fallback: bool,
    input_sentence_size: int,
    user_defined_symbols: Sequence[str],
    num_threads: int,
    seed: int,
    what: str,
    control_symbols: Sequence[str] = (),
) -> Tokenizer:
    """Train a model on normalized sentences; `what` names the training text in errors.

    `control_symbols` (language tags) get ids of their own that no text encodes to and
    that decode to ""; `user_defined_symbols` are pieces text does encode to."""
    spm.set_random_generator_seed(seed)
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences),
            model_writer=model,
            vocab_size=vocab_size,
            model_type=model_type,
            character_coverage=character_coverage,
            byte_fallback=byte_fallback,
            input_sentence_size=input_sentence_size,
            shuffle_input_sentence=True,
            user_defined_symbols=list(user_defined_symbols),
            control_symbols=list(control_symbols),
            bos_id=BOS,
            pad_id=PAD,
            eos_id=EOS,
            unk_id=UNK,
            normalization_rule_name="identity",
            num_threads=num_threads,
            minloglevel=2,
        )
    except RuntimeError as exc:
        raise NmtError(_training_error(str(exc), vocab_size, what)) from exc
    return Tokenizer(model.getvalue(), name=f"SentencePiece model of {what}")


def _training_error(message: str, vocab_size: int, what: str) -> str:
    """SentencePiece's check failures, reworded as what the user should set."""
    too_high = re.search(r"value <= (\d+)", message)
    if too_high:
        return (
            f"spm.vocab_size={vocab_size}: {what} supports at most {too_high.group(1)} "
            f"pieces; set spm.vocab_size={too_high.group(1)} or less, or add training text"
        )
    too_low = re.search(r"smaller than required_chars\. (\d+) vs (\d+)", message)
    if too_low:
        return (
            f"spm.vocab_size={vocab_size}: {what} needs at least {too_low.group(2)} pieces "
            f"for its characters; set spm.vocab_size={too_low.group(2)} or more "
            "(or lower spm.character_coverage)"
        )
    if (
        "insert_id(" in message
    ):  # fewer pieces than the special ids (a config's validate() says so first)
        return (
            f"spm.vocab_size={vocab_size}: too small for the special pieces (<s> <pad> </s> "
            "<unk>) and byte pieces; use about 1000 for the demo corpus, 8000 for Multi30k"
        )
    if "sentences_.empty()" in message:
        return f"{what}: no text to train SentencePiece on (every line is empty); check the files"
    return f"SentencePiece training on {what} failed: {_first_line(message)}"


def _first_line(exc: object) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def load_tokenizers(
    data_dir: str | Path,
    meta: DataMeta | None = None,
    *,
    changed: Callable[[str], None] | None = None,
) -> tuple[Tokenizer, Tokenizer]:
    """The (source, target) tokenizers of a data dir, checked against its meta.json.

    A model file whose sha256 is not the one recorded (swapped or edited after
    preprocessing: the stored ids would meet other pieces) is an NmtError, or, when the
    caller accepts it, a line handed to `changed`. Vocabulary sizes that are not the
    models' piece counts are always an error (see check_vocab_sizes).
    """
    from nmt.data.meta import META_FILE, load_meta

    meta = meta if meta is not None else load_meta(data_dir)
    loaded: list[Tokenizer] = []
    for side in ("src", "tgt"):
        path = meta.tokenizer_file(data_dir, side)
        if not path.is_file():
            raise NmtError(
                f"{path}: SentencePiece model missing from the data dir; "
                "rebuild it with nmt-preprocess"
            )
        model_bytes = path.read_bytes()
        found, recorded = hashlib.sha256(model_bytes).hexdigest(), meta.tokenizers[side]["sha256"]
        if found != recorded and (side == "src" or not meta.joint_vocab):
            what = (
                f"{path}: differs from the model {Path(data_dir) / META_FILE} records (sha256 "
                f"{found[:12]} instead of {recorded[:12]}); it was changed after preprocessing"
            )
            if changed is None:
                raise NmtError(f"{what}: rebuild the data dir with nmt-preprocess")
            changed(what)
        loaded.append(Tokenizer(model_bytes, name=str(path)))
    check_vocab_sizes(data_dir, meta, loaded[0], loaded[1])
    return loaded[0], loaded[1]


def check_vocab_sizes(data_dir: str | Path, meta: DataMeta, src: Tokenizer, tgt: Tokenizer) -> None:
    """meta.json's vocabulary sizes must be the models' piece counts: an edited size would
    make the embeddings smaller than the stored ids (an IndexError deep in the model) or
    larger than any id."""
    from nmt.data.meta import META_FILE

    for side, tokenizer in (("src", src), ("tgt", tgt)):
        key = f"{side}_vocab_size"
        recorded = getattr(meta, key)
        if recorded != tokenizer.vocab_size:
            raise NmtError(
                f"{Path(data_dir) / META_FILE}: {key} is {recorded}, but "
                f"{meta.tokenizers[side]['file']} has {tokenizer.vocab_size} pieces; "
                "meta.json was edited: rebuild the data dir with nmt-preprocess"
            )
