"""What a multilingual run trains: its directions, their language tags, and each
direction's share of an epoch.

A multilingual data dir (nmt.data.meta: `langs`, `directions`, `lang_tags`) stores each
pair of languages once, read in either direction. A run trains the directions named by
`directions` (all of the data dir's when empty) with the tags `lang_tag` places
(nmt.data.languages.LanguageTags, whose ids are looked up in the joint tokenizer by piece).

Temperature sampling (`sampling_temperature` T; Arivazhagan et al. 2019, fairseq's
`--sampling-temperature`): an epoch takes p_d x N pairs of direction d, where n_d is d's
pairs (times the weights of train_split), N = sum of n_d, and p_d is proportional to
n_d^(1/T). T = 1 takes every pair once; a large T is close to uniform over directions. The
factor p_d x N / n_d joins the corpus weights of nmt.training.data's mix, so that the
pairs come from the mix's one path (a whole factor repeats every pair, a fraction draws a
part anew every epoch from the seed and the epoch).

A single-pair data dir takes none of this: its options must keep their defaults.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nmt.data.languages import LanguageTags
from nmt.data.meta import DataMeta
from nmt.data.tokenizer import Tokenizer
from nmt.errors import NmtError, option_error, setting
from nmt.training.config import TrainConfig

# The options of a multilingual run and their defaults, which a single pair keeps.
LANGUAGE_OPTIONS: dict[str, Any] = {
    "lang_tag": "tgt",
    "directions": [],
    "sampling_temperature": 1.0,
    "validation.direction": None,
}


def _value(cfg: TrainConfig, key: str) -> Any:
    if key == "validation.direction":
        return cfg.validation.direction
    value = getattr(cfg, key)
    return list(value) if key == "directions" else value


def trained_directions(cfg: TrainConfig, meta: DataMeta) -> list[str]:
    """The directions a run of `cfg` trains on `meta`'s data dir ([] for a single pair)."""
    if not meta.multilingual:
        return []
    return list(cfg.directions) or list(meta.directions)


def check_language_options(cfg: TrainConfig, meta: DataMeta) -> None:
    """The language options against the data dir: defaults for a single pair; for several
    languages, directions the data dir has and a validation.direction the run trains."""
    if not meta.multilingual:
        for key, default in LANGUAGE_OPTIONS.items():
            value = _value(cfg, key)
            if value != default:
                raise option_error(
                    key,
                    value,
                    f"{cfg.data} holds one pair ({meta.src_lang}-{meta.tgt_lang}), not "
                    "several languages",
                    f"leave {setting(key, default)}, or preprocess several languages into "
                    "one data dir (nmt-preprocess data.langs=[...])",
                )
        return
    known = ", ".join(meta.directions)
    for direction in cfg.directions:
        if direction not in meta.directions:
            raise option_error(
                "directions",
                list(cfg.directions),
                f"{cfg.data} has no direction {direction} (it has {known})",
                "choose among them, or directions=[] for all",
            )
    wanted = cfg.validation.direction
    if wanted is not None:
        trained = trained_directions(cfg, meta)
        if wanted not in trained:
            raise option_error(
                "validation.direction",
                wanted,
                f"not a direction this run trains ({', '.join(trained)})",
                "choose one of them, or null for the mean over directions",
            )
        if not cfg.validation.split:
            raise option_error(
                "validation.direction",
                wanted,
                "validation is off (validation.split is null)",
                "set validation.split, or validation.direction=null",
            )


def language_tags(cfg: TrainConfig, meta: DataMeta, tokenizer: Tokenizer) -> LanguageTags:
    """The run's LanguageTags: every language of the data dir, its tag's id in the joint
    `tokenizer` (looked up by piece), the style of lang_tag and the directions trained."""
    meta_json = Path(cfg.data_dir()) / "meta.json"
    index = {piece: i for i, piece in enumerate(tokenizer.pieces())}
    ids, pieces = {}, {}
    for lang in meta.langs:
        piece = meta.lang_tags.get(lang)
        if piece is None:
            raise NmtError(
                f"{meta_json}: lang_tags has no tag for {lang}; rebuild the data dir with "
                "nmt-preprocess"
            )
        if piece not in index:
            raise NmtError(
                f"{tokenizer.name}: has no piece {piece} (the tag of {lang} in {meta_json}); "
                "rebuild the data dir with nmt-preprocess"
            )
        ids[lang], pieces[lang] = index[piece], piece
    return LanguageTags(cfg.lang_tag, ids, tuple(trained_directions(cfg, meta)), pieces)


def temperature_factors(pairs: Mapping[str, int | float], temperature: float) -> dict[str, float]:
    """direction -> p_d x N / n_d: how many times an epoch takes each of its pairs, where
    n_d = pairs[d], N = sum of n_d, and p_d is proportional to n_d^(1/temperature). An
    epoch then takes p_d x N pairs of d (N in all); temperature 1: each pair once."""
    if temperature == 1.0:
        return {d: 1.0 for d in pairs}
    total = sum(pairs.values())
    powered = {d: n ** (1.0 / temperature) if n > 0 else 0.0 for d, n in pairs.items()}
    norm = sum(powered.values())
    return {d: powered[d] / norm * total / n if n > 0 else 0.0 for d, n in pairs.items()}


def check_resumed_languages(
    ckpt: dict[str, Any], path: Path, cfg: TrainConfig, meta: DataMeta
) -> None:
    """A resumed run trains what its checkpoint trained: the same tags, directions and
    temperature (else its batches and inputs would not be the ones it continues)."""
    saved_config = ckpt.get("config") or {}
    saved_languages = (ckpt.get("data") or {}).get("languages") or {}
    before = {
        "lang_tag": saved_languages.get("style", saved_config.get("lang_tag", "tgt")),
        "directions": list(saved_languages.get("directions", [])),
        "sampling_temperature": saved_config.get("sampling_temperature", 1.0),
    }
    now = {
        "lang_tag": cfg.lang_tag,
        "directions": trained_directions(cfg, meta),
        "sampling_temperature": cfg.sampling_temperature,
    }
    for key, value in now.items():
        if value != before[key]:
            raise option_error(
                key,
                value,
                f"{path} was trained with {setting(key, before[key])}",
                f"resume with {setting(key, before[key])}, or start another save_dir "
                f"(resume.finetune_from={path} starts from its weights)",
            )
