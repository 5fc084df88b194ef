"""The models a server holds, by name and by language pair, each with its batching queue.

`ModelRegistry.load(cfg)` loads every model of a ServeConfig once (Translator.from_checkpoint),
with its glossary (read_glossaries: read and checked before any checkpoint loads), and
starts one BatchQueue (worker thread) per model. Routes find a model by name, or by the
direction asked for: a single-pair model translates its checkpoint's src_lang into its
tgt_lang, a multilingual one (Translator.languages) each direction it was trained on, the
target language picked per request (its tag, per sentence: batching.py).
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

    def sources(self) -> list[str]:
        """The languages it translates from."""
        tags = self.translator.languages
        return [self.source] if tags is None else tags.sources()

    def targets(self, source: str | None = None) -> list[str]:
        """The languages it translates into (from `source`, when given)."""
        tags = self.translator.languages
        if tags is None:
            return [self.target] if source in (None, self.source) else []
        return tags.targets(source)

    def directions(self) -> dict[str, list[str]]:
        """Each source language -> the targets it translates into."""
        return {source: self.targets(source) for source in self.sources()}

    def request_languages(
        self,
        source: str | None,
        target: str | Sequence[str] | None,
        keys: tuple[str, str] = ("source", "target"),
    ) -> tuple[str | None, str | list[str] | None]:
        """A request's source language and target language (one, or one per text) checked
        against this model: (src_lang, tgt_lang) as the Translator takes them, tgt_lang
        None for a single-pair model (which needs no tag). `source` None or "auto": not
        given. A language it does not know is a 400 naming the ones it knows (`keys`: the
        request's names of source and target); languages are checked one by one, as the
        Translator checks them, so a direction it was not trained on goes (zero-shot)."""
        given = None if source in (None, AUTO) else source
        targets = [] if target is None else [target] if isinstance(target, str) else target
        tags = self.translator.languages
        if tags is None:
            asked = [(keys[0], given, self.source)] + [(keys[1], t, self.target) for t in targets]
            for key, value, own in asked:
                if value is not None and value != own:
                    raise bad_request(
                        f"{key}={value}: model {self.name} translates {own}; drop {key}="
                    )
            return given, None
        try:
            src_lang = tags.check_source(given, keys[0])
            if not targets:
                tags.check_target(None, keys[1])  # a 400: required
            for wanted in dict.fromkeys(targets):
                tags.check_target(wanted, keys[1])
        except NmtError as exc:
            raise bad_request(f"model {self.name}: {exc}") from None
        return src_lang, target if isinstance(target, str) else list(targets)

    @property
    def search(self) -> SearchConfig:
        return self.translator.search

    def describe(self) -> dict:
        """/v1/models' entry: `source` and `target` (null for a multilingual model) and
        `languages` (each source language -> its targets)."""
        multilingual = self.translator.languages is not None
        return {
            "name": self.name,
            "source": None if multilingual else self.source,
            "target": None if multilingual else self.target,
            "languages": self.directions(),
            "search": dataclasses.asdict(self.search),
        }

    def label(self) -> str:
        """The languages it translates, for a log line: en->de, or en, de, fr."""
        tags = self.translator.languages
        return f"{self.source}->{self.target}" if tags is None else ", ".join(tags.langs)


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

    def for_pair(
        self,
        source: str | None,
        target: str | Sequence[str],
        keys: tuple[str, str] = ("source", "target"),
    ) -> tuple[ServedModel, str | None]:
        """The first model trained to translate source -> target (every target, given
        several), else the first multilingual one that knows those languages (zero-shot),
        and the source language: "auto" is the only source language that translates into
        the target, None any source (a multilingual model needs none: the tag names the
        target). None found: a 400 naming what is served (`keys`: the request's names of
        source and target)."""
        targets = [target] if isinstance(target, str) else list(dict.fromkeys(target))
        if source == AUTO:
            sources = list(
                dict.fromkeys(s for m in self.models for s in m.sources() if _into(m, s, targets))
            )
            if len(sources) == 1:
                source = sources[0]
            elif sources:
                raise bad_request(
                    f"source=auto: {', '.join(sources)} all translate into {', '.join(targets)} "
                    "and this server does not detect languages; give source="
                )
        for accepts in (_into, _knows):
            for model in self.models:
                if accepts(model, source, targets):
                    return model, source
        known = list(dict.fromkeys(t for m in self.models for t in _reachable(m, source)))
        missing = next((t for t in targets if t not in known), targets[0])
        if known and source is None:
            raise bad_request(
                f"{keys[1]}={missing}: no model here translates into it; they translate "
                f"into {', '.join(known)}"
            )
        if known and source != AUTO:
            raise bad_request(
                f"{keys[0]}={source}, {keys[1]}={missing}: this pair is not served; from "
                f"{source} this server translates into {', '.join(known)}"
            )
        raise bad_request(
            f"{keys[0]}={source}, {keys[1]}={', '.join(targets)}: this pair is not served; "
            f"use one of {self.pairs()}"
        )

    def only_source(self) -> str:
        """LibreTranslate's /detect without a detector: the one language this server
        translates from; with several, a 400 that asks for source= instead."""
        sources = list(dict.fromkeys(s for m in self.models for s in m.sources()))
        if len(sources) > 1:
            raise bad_request(
                f"q: this server translates from {', '.join(sources)} and does not detect "
                "languages; give source= to /translate"
            )
        return sources[0]

    def pairs(self) -> str:
        return ", ".join(
            dict.fromkeys(
                f"{source}->{target}"
                for m in self.models
                for source, targets in m.directions().items()
                for target in targets
            )
        )

    def languages(self) -> list[dict]:
        """LibreTranslate's /languages: every language, with the targets it translates
        to (over all models; a multilingual model's each source with its directions)."""
        targets: dict[str, list[str]] = {}
        for m in self.models:
            for source, into in m.directions().items():
                known = targets.setdefault(source, [])
                known += [t for t in into if t not in known]
        for m in self.models:
            for target in m.targets():
                targets.setdefault(target, [])
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


def _into(model: ServedModel, source: str | None, targets: Sequence[str]) -> bool:
    """`model` translates `source` (None: any) into every one of `targets`."""
    known = model.targets(source)
    return bool(known) and all(t in known for t in targets)


def _knows(model: ServedModel, source: str | None, targets: Sequence[str]) -> bool:
    """`model` is multilingual and translates `source` (None: any) into every one of
    `targets`, though perhaps not trained on these directions (zero-shot)."""
    reachable = _reachable(model, source)
    return model.translator.languages is not None and all(t in reachable for t in targets)


def _reachable(model: ServedModel, source: str | None) -> list[str]:
    """The targets `model` translates `source` (None: any) into, zero-shot included."""
    tags = model.translator.languages
    if tags is None or (source is not None and source not in tags.sources()):
        return model.targets(source)
    return [t for t in tags.targets() if t != source]


def _names(loaded: list[tuple[str | None, Translator, list[str]]]) -> list[str]:
    """Each model's name: its own, or from its checkpoint's languages: "<src>-<tgt>",
    or a multilingual model's joined by "+" ("en+de+fr"); all distinct."""
    names: list[str] = []
    for i, (name, translator, paths) in enumerate(loaded):
        if name is None and translator.languages is not None:
            name = "+".join(translator.languages.langs)
        elif name is None:
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
