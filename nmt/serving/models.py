"""The models a server holds, by name and by language pair, each with its batching queue.

`ModelRegistry.load(cfg)` loads every model of a ServeConfig once (Translator.from_checkpoint),
with its glossary (read_glossaries: read and checked before any checkpoint loads), and
starts one BatchQueue (worker thread) per model. LibreTranslate routes find a model by
its languages (the checkpoint's data: src_lang, tgt_lang), native routes by name.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from nmt.errors import NmtError
from nmt.generation.config import SearchConfig
from nmt.generation.terminology import Glossary
from nmt.generation.translator import Translator, checkpoint_paths
from nmt.serving.batching import BatchQueue
from nmt.serving.config import ServeConfig
from nmt.serving.errors import ApiError, bad_request
from nmt.serving.languages import language_name

log = logging.getLogger("nmt.serving")

AUTO = "auto"  # LibreTranslate's "detect the source language"


@dataclass(eq=False)
class ServedModel:
    """One loaded model: its Translator (with its default search), its queue, and its
    glossary (the serve config's, which every request's own glossary goes over)."""

    name: str
    translator: Translator
    queue: BatchQueue
    checkpoints: list[str]
    glossary: Glossary | None = None

    @property
    def source(self) -> str:
        return self.translator.src_lang or "?"

    @property
    def target(self) -> str:
        return self.translator.tgt_lang or "?"

    @property
    def search(self) -> SearchConfig:
        return self.translator.search

    def describe(self) -> dict:
        return {
            "name": self.name,
            "source": self.source,
            "target": self.target,
            "search": dataclasses.asdict(self.search),
        }


class ModelRegistry:
    """The server's models, in the order the config lists them."""

    def __init__(self, models: Sequence[ServedModel]):
        if not models:
            raise ValueError("a server needs at least one model")
        self.models = list(models)
        self.by_name = {m.name: m for m in self.models}

    @classmethod
    def load(cls, cfg: ServeConfig) -> ModelRegistry:
        """Load every model of `cfg` once and start its queue."""
        cfg.validate()
        glossaries = read_glossaries(cfg)
        loaded: list[tuple[str | None, Translator, list[str]]] = []
        for spec, glossary in zip(cfg.model_specs(), glossaries):
            translator = Translator.from_checkpoint(
                spec.checkpoint,
                search=cfg.search_for(spec),
                device=cfg.device,
                precision=cfg.precision,
                threads=cfg.threads,
                max_tokens=cfg.max_tokens,
                max_sentences=cfg.max_sentences,
                overlong=cfg.overlong,
                alignment_layer=cfg.alignment_layer,
            )
            if translator.runtime.note:
                log.info("%s", translator.runtime.note)
            if glossary is not None:
                check_glossary(translator, glossary)
            loaded.append((spec.name, translator, checkpoint_paths(spec.checkpoint)))
        names = _names(loaded)
        models = []
        for name, (_, translator, paths), glossary in zip(names, loaded, glossaries):
            queue = BatchQueue(
                name,
                max_sentences=cfg.max_sentences,
                max_tokens=cfg.max_tokens,
                max_wait=cfg.max_wait_ms / 1000,
                wait_gap=cfg.wait_gap_ms / 1000,
                max_queue=cfg.max_queue,
                device=translator.device,
            )
            models.append(ServedModel(name, translator, queue, paths, glossary))
        return cls(models)

    def report_batches(
        self,
        on_batch: Callable[[str, int, float], None],
        on_drop: Callable[[str, int], None] | None = None,
    ) -> None:
        """`on_batch(model, sentences, seconds)` hears of every batch decoded, and
        `on_drop(model, sentences)` of sentences given up (metrics)."""
        for model in self.models:
            model.queue.on_batch = _reporter(on_batch, model.name)
            if on_drop is not None:
                model.queue.on_drop = functools.partial(on_drop, model.name)

    def close(self, timeout: float | None = None, cancel: bool = False) -> bool:
        """Stop every worker (BatchQueue.close), each waited for up to `timeout`; True
        once all have stopped."""
        return all([model.queue.close(timeout, cancel) for model in self.models])

    # -- finding a model ------------------------------------------------------------------

    def named(self, name: str | None) -> ServedModel:
        """The model called `name`; None: the only model (an error when there are more)."""
        if name is None:
            if len(self.models) == 1:
                return self.models[0]
            raise bad_request(
                f"model=null: this server has {len(self.models)} models; "
                f"name one of {', '.join(self.by_name)}"
            )
        found = self.by_name.get(name)
        if found is None:
            raise ApiError(
                404,
                f"model={name}: no such model; use one of {', '.join(self.by_name)}",
                kind="not_found",
            )
        return found

    def for_pair(self, source: str, target: str) -> ServedModel:
        """The first model translating source -> target; source "auto": the only source
        language that translates into target."""
        if source == AUTO:
            sources = list(dict.fromkeys(m.source for m in self.models if m.target == target))
            if len(sources) == 1:
                source = sources[0]
            elif sources:
                raise bad_request(
                    f"source=auto: {', '.join(sources)} all translate into {target} and this "
                    "server does not detect languages; give source="
                )
        for model in self.models:
            if model.source == source and model.target == target:
                return model
        raise bad_request(
            f"source={source}, target={target}: this pair is not served; use one of {self.pairs()}"
        )

    def only_source(self) -> str:
        """LibreTranslate's /detect without a detector: the one language this server
        translates from; with several, a 400 that asks for source= instead."""
        sources = list(dict.fromkeys(m.source for m in self.models))
        if len(sources) > 1:
            raise bad_request(
                f"q: this server translates from {', '.join(sources)} and does not detect "
                "languages; give source= to /translate"
            )
        return sources[0]

    def pairs(self) -> str:
        return ", ".join(dict.fromkeys(f"{m.source}->{m.target}" for m in self.models))

    def languages(self) -> list[dict]:
        """LibreTranslate's /languages: every language, with the targets it translates to."""
        targets: dict[str, list[str]] = {}
        for m in self.models:
            targets.setdefault(m.source, [])
            if m.target not in targets[m.source]:
                targets[m.source].append(m.target)
        for m in self.models:
            targets.setdefault(m.target, [])
        return [
            {"code": code, "name": language_name(code), "targets": sorted(to)}
            for code, to in targets.items()
        ]


def read_glossaries(cfg: ServeConfig) -> list[Glossary | None]:
    """Each model's glossary (None: it has none), in model_specs' order; a bad file is an
    NmtError naming the file and line."""
    return [None if s.glossary is None else Glossary.read(s.glossary) for s in cfg.model_specs()]


def check_glossary(translator: Translator, glossary: Glossary) -> None:
    """The model's target vocabulary can write every target term of its glossary (an
    NmtError naming the file and line), so no request finds one it cannot."""
    for term in glossary.terms:  # its own source contains it: checked as a request uses it
        translator.constraint_ids(None, term.source, Glossary([term]))


def _names(loaded: list[tuple[str | None, Translator, list[str]]]) -> list[str]:
    """Each model's name: its own, or "<src>-<tgt>" from its checkpoint; all distinct."""
    names: list[str] = []
    for i, (name, translator, paths) in enumerate(loaded):
        if name is None:
            name = f"{translator.src_lang or 'src'}-{translator.tgt_lang or 'tgt'}"
            if name in names:
                raise NmtError(
                    f"models[{i}].name=null: {paths[0]} would be called {name} (its languages), "
                    f"as models[{names.index(name)}] is; give each model a name"
                )
        names.append(name)
    return names


def _reporter(on_batch: Callable[[str, int, float], None], name: str):
    return lambda sentences, seconds: on_batch(name, sentences, seconds)
