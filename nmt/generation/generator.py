"""SequenceGenerator: batched beam search (or sampling) driving the incremental decoder.

Shape legend: B sentences in the batch, N sentences still being decoded, K beam,
R = N*K decoder rows, S source length, V target vocabulary, t tokens generated so far.

The source is encoded once and expanded to K rows per sentence; each step feeds only the
newest token through the decoder (its KV cache holds the rest), scores the candidates with
search.py, files the ones ending in EOS as finished hypotheses, and reorders the cache by
the beams that survive. The search's rules (penalties, length limits, forced prefixes)
are logit processors (processors.py), applied in one call per step. A sentence is
finished when it has K finished hypotheses (or reached its length limit); finished
sentences leave the batch, so the remaining steps cost less. `SequenceGenerator.generate`
runs these as named phases: prepare, then per step: step, select, finish, reorder.
Semantics are fairseq's: score = sum of log-probs / length**lenpen, length counting EOS.
Lexical constraints (constraints.py) add the batch's own rules to the step and their
beam allocation to the selection; without them those phases are the plain search's.

On a GPU the host reads the device once per batch before decoding (the length limits and
whether sources are padded) and once per step (how many sentences are done, the shortest
remaining limit, how many hypotheses finished, and with required phrases how many
fallbacks), in one small transfer each: every other decision is made with tensors, so the
GPU's queue never runs dry waiting for the host in between. (A sentence's hypotheses and the rows that stay are found with a
stable sort, whose output size the host knows, where nonzero() would read the device.)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from nmt.data.lexical import Shortlist
from nmt.errors import NmtError
from nmt.generation.config import SearchConfig
from nmt.generation.constraints import (
    BannedPhrases,
    Endings,
    PhraseState,
    RequiredPhrases,
    TokenConstraints,
    active,
    check_constraints,
    required_ids,
)
from nmt.generation.processors import (
    NEG_INF,
    ForcedTokens,
    LogitProcessors,
    NeverGenerate,
    Rule,
)
from nmt.generation.search import beam_candidates, length_penalty, sample_candidates, select_active
from nmt.generation.shortlist import BatchVocab, batch_vocab
from nmt.model.cache import CacheMemory
from nmt.model.transformer import Transformer
from nmt.runtime import inference_mode
from nmt.vocab import EOS, PAD


@dataclass
class Hypothesis:
    """One finished translation of one source sentence."""

    tokens: Tensor  # [T] long: generated target ids, forced prefix included, ending in EOS
    score: float  # sum(positional_scores) / T**lenpen
    positional_scores: Tensor  # [T] float: log-probability of each token
    attention: Tensor | None  # [T,S] float: the chosen layer's attention, when requested
    # False: a required phrase is missing (it did not fit the length limit); the hypothesis
    # ended by the model's choice (a fallback) or at the length limit
    constraints_met: bool = True


def true_positions(mask: Tensor, count: int) -> Tensor:
    """[count] flat indices of mask's True elements, ascending; `count` (their number) is
    known on the host. On a GPU this is a stable sort of the flags rather than nonzero(),
    whose output size would have to be read from the device."""
    flat = mask.reshape(-1)
    if flat.device.type == "cpu":
        return flat.nonzero().squeeze(1)
    return (~flat).to(torch.uint8).argsort(stable=True)[:count]


class _Member:
    """One model of the ensemble with its encoder output and decoder cache."""

    def __init__(
        self,
        model: Transformer,
        src_tokens: Tensor,
        expand: Tensor,
        cache_args: dict | None,
        padded: bool,
        vocab: BatchVocab | None = None,
    ):
        self.model = model
        # the output layer over the batch's shortlist (its rows of the weights), or None
        self.output = None if vocab is None else model.output_layer(vocab.ids)
        self.enc = model.encode(src_tokens, padded)  # one row per sentence
        self.cache = model.new_cache(**cache_args) if cache_args is not None else None
        if self.cache is None:  # the uncached decoder needs a source row per decoder row
            self.enc = self.enc.reorder(expand)  # rows: sentence b -> K rows
        # (the cache keeps one row of encoder keys/values per sentence, which its K beams
        # share: K times less to project, store, read and move)
        self._float_logits: Tensor | None = None  # see float_logits

    def float_logits(self, logits: Tensor) -> Tensor:
        """The step's logits [R,V] as a contiguous float32 tensor the caller may change in
        place. Under bf16/fp16 they are cast into one buffer reused at every step instead
        of a fresh [R,V] float32 tensor a step (10 MB at beam 5 x 64 sentences x 8k): 5-9%
        less CPU time at bf16 beam 5 (docs/results.md). The buffer holds only the current
        step's values; nothing reads a step's log-probs after the step."""
        if logits.dtype == torch.float32:
            return logits.contiguous()  # the step's own tensor
        need = logits.numel()
        if self._float_logits is None or self._float_logits.numel() < need:
            self._float_logits = torch.empty(need, dtype=torch.float32, device=logits.device)
        out = self._float_logits[:need].view(logits.shape)  # rows shrink as sentences finish
        return out.copy_(logits)

    def step(self, tokens: Tensor, attn_layer: int | None) -> tuple[Tensor, Tensor | None]:
        """tokens [R,1+t] decoder input so far -> (logits [R,V] (V' with a shortlist),
        attn [R,S] | None)."""
        # (the output layer is passed only with a shortlist: any decode() works without)
        extra = {} if self.output is None else {"output": self.output}
        if self.cache is not None:
            logits, attn = self.model.decode(
                tokens[:, -1:], self.enc, self.cache, attn_layer, **extra
            )
        else:  # the uncached baseline: the whole prefix again
            logits, attn = self.model.decode(tokens, self.enc, None, attn_layer, **extra)
        return logits[:, -1], None if attn is None else attn[:, -1]

    def reorder(self, order: Tensor, kept: Tensor | None) -> None:
        """Rows become old rows `order` [R']; kept [N']: the sentences that stay, or None
        when no sentence left the batch."""
        if self.cache is not None:
            # The cache holds the encoder keys/values; `enc` is not read after step 0.
            self.cache.reorder(order, encoder_rows=kept, groups_kept=kept is None)
        elif kept is not None:
            self.enc = self.enc.reorder(order)


class _Finished:
    """Finished hypotheses of a batch: K slots per sentence, filled in the order they end.

    With required phrases, `fallbacks` holds apart the endings a missing phrase forbade,
    filed as the plain search files its own (EOS among a sentence's top K, K slots): a
    sentence none of whose hypotheses meets its phrases lists them, as the plain search
    would, with those the length limit ended in the slots they left free."""

    def __init__(
        self,
        bsz: int,
        k: int,
        longest: int,
        src_len: int,
        want_attn: bool,
        device: torch.device,
        required: list[bool] | None = None,
    ):
        """`required`: per sentence, whether it has a phrase that must appear (None: no
        sentence has one)."""
        self.k = k
        self.tokens = torch.full((bsz, k, longest + 1), PAD, dtype=torch.long, device=device)
        self.pos = torch.zeros(bsz, k, longest + 1, device=device)
        self.scores = torch.full((bsz, k), NEG_INF, device=device)  # length-normalized
        self.lengths = torch.zeros(bsz, k, dtype=torch.long, device=device)
        self.count = torch.zeros(bsz, dtype=torch.long, device=device)  # [B] slots used
        self.attn = torch.zeros(bsz, k, longest + 1, src_len, device=device) if want_attn else None
        self.required = required
        # [B,K] bool: the hypothesis has every required phrase (with constraints only)
        self.met = (
            None if required is None else torch.zeros(bsz, k, dtype=torch.bool, device=device)
        )
        self.fallbacks = (
            None if required is None else _Finished(bsz, k, longest, src_len, want_attn, device)
        )

    def slots(self, sent: Tensor, finishing: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Where the candidates `finishing` [N,K] (EOS among a sentence's top K) would go,
        in rank order: (accepted [N,K], those with a free slot; slots [N,K]; the
        sentences' finished counts after filing them [N]). sent [N]: the batch index of
        each active sentence."""
        count = self.count[sent]  # [N]
        slots = count.unsqueeze(1) + finishing.cumsum(1) - 1  # [N,K]
        accepted = finishing & slots.lt(self.k)
        return accepted, slots, count + accepted.sum(1)

    def add(
        self,
        step: int,
        sent: Tensor,
        accepted: tuple[Tensor, Tensor, int],
        cand: tuple[Tensor, Tensor, Tensor],
        history: tuple[Tensor, Tensor, Tensor | None],
        step_attn: Tensor | None,
        lenpen: float,
        complete: Tensor | None = None,
    ) -> None:
        """File the accepted candidates into their slots: accepted = (mask [N,K], slots
        [N,K], how many, known on the host) from `slots`. sent [N]: the batch index of
        each active sentence; cand = (lprobs, scores, origins) [N,C] of the step's
        candidates; history = (tokens [R,1+t], their log-probs [R,t], attention [R,t,S] |
        None) of the active rows; complete [N,C] bool: the candidate has every required
        phrase (with constraints)."""
        k, t = self.k, step  # t tokens precede the EOS
        cand_lp, cand_scores, cand_origins = cand
        tokens, pos_scores, attn_hist = history
        mask, slots, count = accepted
        flat = true_positions(mask, count)  # [F], at most K per sentence
        ni, ci = torch.div(flat, k, rounding_mode="floor"), flat % k
        rows = ni * k + cand_origins[ni, ci]  # [F] the hypotheses they extend
        sid, slot = sent[ni], slots[ni, ci]  # [F] where they go
        self.tokens[sid, slot, :t] = tokens[rows, 1:]
        self.tokens[sid, slot, t] = EOS
        self.pos[sid, slot, :t] = pos_scores[rows]
        self.pos[sid, slot, t] = cand_lp[ni, ci]
        self.scores[sid, slot] = cand_scores[ni, ci] / length_penalty(t + 1, lenpen)
        self.lengths[sid, slot] = t + 1
        self.count.index_add_(0, sid, torch.ones_like(sid))
        if self.met is not None and complete is not None:
            self.met[sid, slot] = complete[ni, ci]
        if self.attn is not None and attn_hist is not None and step_attn is not None:
            self.attn[sid, slot, : t + 1] = torch.cat(
                [attn_hist[rows], step_attn[rows].unsqueeze(1)], dim=1
            )  # [F,t+1,S]

    def collect(self, nbest: int) -> list[list[Hypothesis]]:
        """Per sentence, its nbest hypotheses, best first (on the CPU); with
        constraints, those that have every required phrase come first (`_met_first`)."""
        parts = [self] if self.fallbacks is None else [self, self.fallbacks]
        scores = torch.cat([p.scores for p in parts], dim=1)  # [B,K'] K' = K or 2K
        lengths = torch.cat([p.lengths for p in parts], dim=1)  # [B,K'] (0: an empty slot)
        order = scores.argsort(dim=1, descending=True, stable=True)
        met = None
        if self.met is None or self.fallbacks is None:
            counts = lengths.gt(0).sum(dim=1).tolist()
        else:
            order, met_first, listed = self._met_first(order, self.met, self.fallbacks)
            met, counts = met_first[:, :nbest].tolist(), listed.tolist()
        order = order[:, :nbest]
        picked_scores = scores.gather(1, order).tolist()
        picked_lengths = lengths.gather(1, order).tolist()
        tokens = torch.cat([p.tokens for p in parts], dim=1).cpu()
        pos = torch.cat([p.pos for p in parts], dim=1).cpu()
        attn = None
        if self.attn is not None:
            attn = torch.cat([p.attn for p in parts if p.attn is not None], dim=1).cpu()
        out = []
        for b, picks in enumerate(order.tolist()):
            if counts[b] == 0:  # every path was forbidden (e.g. n-gram blocking): say nothing
                out.append(
                    [
                        Hypothesis(
                            torch.tensor([EOS]),
                            NEG_INF,
                            torch.full((1,), NEG_INF),
                            None if attn is None else attn[b, 0, :1],
                            constraints_met=self.required is None or not self.required[b],
                        )
                    ]
                )
                continue
            out.append(
                [
                    Hypothesis(
                        tokens=tokens[b, j, :length],
                        score=score,
                        positional_scores=pos[b, j, :length],
                        attention=None if attn is None else attn[b, j, :length],
                        constraints_met=True if met is None else met[b][i],
                    )
                    for i, (j, score, length) in enumerate(
                        zip(picks[: counts[b]], picked_scores[b], picked_lengths[b])
                    )
                ]
            )
        return out

    def _met_first(
        self, order: Tensor, met: Tensor, fallbacks: _Finished
    ) -> tuple[Tensor, Tensor, Tensor]:
        """order [B,2K]: this one's slots and then the fallbacks', by score; met [B,K]
        this one's flags. Returns the order with the met hypotheses first, then those
        the plain search would have listed: the fallbacks, and those the length limit
        ended (this one's unmet hypotheses) in the slots the fallbacks left free, best
        first (the others last); the met flags [B,2K] in that order; how many are
        listed [B]."""
        filled = torch.cat([self.lengths, fallbacks.lengths], dim=1).gt(0).gather(1, order)
        met = torch.cat([met, torch.zeros_like(met)], dim=1).gather(1, order)  # [B,2K]
        cut = filled & ~met & order.lt(self.k)  # [B,2K] ended by the length limit
        free = (self.k - fallbacks.count).unsqueeze(1)  # [B,1]
        listed = filled & ~(cut & cut.cumsum(dim=1).gt(free))  # [B,2K]
        again = torch.where(met, 0, torch.where(listed, 1, 2)).argsort(dim=1, stable=True)
        return order.gather(1, again), met.gather(1, again), listed.sum(dim=1)


@dataclass(eq=False)
class _BatchSearch:
    """One batch's search while it runs: what the phases read and update. Rows are
    sentence-major (row = n*K + beam); N shrinks as finished sentences leave the batch."""

    members: list[_Member]  # each model with its encoder output and decoder cache
    finished: _Finished  # the hypotheses that ended, K slots per sentence of the batch
    forced: ForcedTokens  # target prefixes, and EOS at the length limits
    vocab: BatchVocab | None  # the batch's shortlist candidates, or None (every token)
    required: RequiredPhrases | None  # phrases that must appear, and each row's progress
    banned: BannedPhrases | None  # phrases that must not appear
    rules: tuple[Rule, ...]  # the batch's own rules on the log-probs (constraints)
    sent: Tensor  # [N] batch index of each active sentence
    max_lens: Tensor  # [N] each active sentence's longest output (tokens before EOS)
    tokens: Tensor  # [R,1+t] decoder input so far: EOS, then the generated tokens
    pos_scores: Tensor  # [R,t] log-prob of each generated token
    attn_hist: Tensor | None  # [R,t,S] the chosen layer's attention, when requested
    scores: Tensor  # [N,K] cumulative log-probs of the hypotheses (-inf: not extended)
    longest: int  # the batch's longest limit: at most longest + 1 steps
    on_cpu: bool  # reading a tensor costs nothing (no device queue to drain)


class _Selection(NamedTuple):
    """One step's candidates per sentence, best first ([N,C]: C = 2K for beam search, K
    for sampling), and the K of them that continue ([N,K])."""

    scores: Tensor  # [N,C] cumulative log-probs
    tokens: Tensor  # [N,C] token ids
    origins: Tensor  # [N,C] the beam (0..K-1) each extends
    lprobs: Tensor  # [N,C] the token's own log-prob
    is_eos: Tensor  # [N,C] bool: the candidate ends its hypothesis
    next_scores: Tensor  # [N,K] the continuing hypotheses' scores (-inf: a placeholder)
    next_tokens: Tensor  # [N,K]
    next_origins: Tensor  # [N,K]
    next_lprobs: Tensor  # [N,K]
    complete: Tensor | None = None  # [N,C] bool: has every required phrase (constraints)
    next_phrases: PhraseState | None = None  # [N,K,P] the continuing rows' phrase states
    endings: Endings | None = None  # [N,K] the endings a missing phrase forbade


class _Progress(NamedTuple):
    """What the finish phase read from the device at one step."""

    done: Tensor  # [N] bool: sentences with K finished hypotheses or at their limit
    n_done: int  # done.sum(), on the host
    min_left: int  # the shortest limit among the sentences not done
    dropped: bool = False  # some sentences are no longer wanted: they leave the batch now


class SequenceGenerator:
    """Translate batches of source token ids with one model or an ensemble.

    Ensemble members must share the target vocabulary; their log-probabilities are
    averaged. Models must be in eval mode; autocast (bf16/fp16) is the caller's context.
    One generator decodes one batch at a time (its cache memory is shared by its calls,
    and by other generators given the same `cache_memory`, one per model). With a
    `shortlist`, each batch is decoded over its sentences' candidate target tokens only
    (see nmt.generation.shortlist).

    `generate` runs the search in five phases over the batch's state (`_BatchSearch`):
    prepare once, then per step `_step` (decoder, log-softmax, processors), `_select`
    (candidates, search.py), `_finish` (file ended hypotheses, stop rules) and `_reorder`
    (caches and histories follow the continuing hypotheses). A new rule on the
    log-probabilities is a processor (processors.py, added in LogitProcessors.from_search);
    a new per-sentence state (as ForcedTokens or BatchVocab) is made in `_prepare`, read in
    `_step`, and follows the sentences that stay with its `keep` in `_reorder`. The
    constraints of a batch (constraints.py) are such state: their rules run in `_step`
    (`_BatchSearch.rules`), their candidates and beam allocation in `_select`, and each
    row's phrase progress follows the continuing rows in `_reorder`.
    """

    def __init__(
        self,
        models: Sequence[Transformer],
        search: SearchConfig,
        attn_layer: int | None = None,
        shortlist: Shortlist | None = None,
        cache_memory: Sequence[CacheMemory] | None = None,
        never: Sequence[int] = (),
    ):
        """`never`: target ids no hypothesis may choose (a multilingual model's language
        tags); a forced prefix may still hold them."""
        search.validate()
        self.never = tuple(never)
        self.models = list(models)
        self.search = search
        self.shortlist = shortlist
        self.attn_layer = attn_layer
        self.beam = search.beam
        self.processors = LogitProcessors.from_search(search)
        # Longest output: the decoder input at the last step (max_len + 1 tokens) must fit.
        self.max_positions = min(m.cfg.max_target_positions for m in self.models) - 1
        if cache_memory is None:
            cache_memory = [CacheMemory() for _ in self.models]
        self.cache_memory = list(cache_memory)
        self.rng: torch.Generator | None = None
        if search.sampling:
            device = next(self.models[0].parameters()).device
            self.rng = torch.Generator(device=device)
            self.rng.manual_seed(search.seed)

    def _cache_args(self, member: int, positions: int) -> dict | None:
        """model.new_cache's arguments for a batch that decodes at most `positions`."""
        if not self.search.use_cache:
            return None
        # Beams reorder only within their sentence, so the cache keeps a sentence's rows
        # in place (DecoderCache's groups); sampled rows never move. The memory is reused
        # from batch to batch (CacheMemory).
        return dict(
            group=1 if self.search.sampling else self.beam,
            capacity=positions,
            memory=self.cache_memory[member],
        )

    def max_lengths(self, src_lengths: Tensor) -> Tensor:
        """Per-sentence output limit (tokens before EOS): a*src_len + b, capped."""
        s = self.search
        # capped in float64 before the cast: a huge a or b must give the cap, not overflow
        limit = s.max_len_a * src_lengths.double() + float(min(s.max_len_b, self.max_positions))
        return limit.clamp(max=self.max_positions).floor().long().clamp(min=1)

    @inference_mode
    def generate(
        self,
        src_tokens: Tensor,
        prefix_tokens: Tensor | None = None,
        *,
        nbest: int | None = None,
        attn_layer: int | None = None,
        stopped: Callable[[], Tensor | None] | None = None,
        constraints: Sequence[TokenConstraints | None] | None = None,
    ) -> list[list[Hypothesis]]:
        """src_tokens [B,S] (right-padded, each ending in EOS); prefix_tokens [B,P]
        (right-padded with PAD) to force at the start of each output. Returns, per
        sentence, up to `nbest` (default: the search's) hypotheses, best first, with the
        attention of decoder layer `attn_layer` (default: the generator's) when set.

        `stopped`, when given, is called once per step, before the decoder runs; it
        returns None, or a [B] bool tensor (on the batch's device) marking the sentences
        no longer wanted (a request given up). Those leave the batch at that step as
        finished sentences do, with the hypotheses they finished so far (possibly none).
        With beam search the other sentences' hypotheses are what they would be without
        it; a sampling batch's rows share one random stream, so the others' draws change.

        `constraints`: one entry per sentence (None or an empty TokenConstraints: none),
        target-id phrases that must appear in its hypotheses and phrases that must not
        (beam search only; constraints.py). n-best lists put the hypotheses that have
        every required phrase first. A sentence without one (none fit the length limit)
        lists what the plain search would have of what was found: the hypotheses that
        ended by the model's choice, filed as the plain search files them, and in the
        slots they left free those the length limit ended, by score, each with
        `constraints_met` False."""
        nbest = self.search.nbest if nbest is None else nbest
        attn_layer = self.attn_layer if attn_layer is None else attn_layer
        wanted = active(constraints, src_tokens.size(0))
        if wanted is not None:
            if self.search.sampling:
                raise NmtError(
                    "constraints need beam search (sampling=false); decode the "
                    "constrained sentences with sampling=false"
                )
            check_constraints(wanted, self.models[0].decoder.embed_tokens.num_embeddings)
        state = self._prepare(
            src_tokens, prefix_tokens, want_attn=attn_layer is not None, constraints=wanted
        )
        for step in range(state.longest + 1):
            gone = None if stopped is None else stopped()
            if gone is not None:
                gone = gone[state.sent]  # [N] (a read from the device, only when some stop)
                n_gone = int(gone.sum())
                if n_gone == state.sent.numel():
                    break
                gone = gone if n_gone else None
            lprobs, step_attn = self._step(state, step, attn_layer)  # [R,V], [R,S] | None
            chosen = self._select(state, lprobs)
            progress = self._finish(state, step, chosen, step_attn, gone)
            if progress.n_done == state.sent.numel():
                break
            self._reorder(state, chosen, progress, step_attn)
        return state.finished.collect(nbest)

    # -- the phases ---------------------------------------------------------------------

    def _prepare(
        self,
        src_tokens: Tensor,
        prefix_tokens: Tensor | None,
        want_attn: bool,
        constraints: list[TokenConstraints] | None = None,
    ) -> _BatchSearch:
        """Encode the batch once, make each model's cache, and start K rows per sentence
        from EOS, with its prefix and length limit to force, and its constraints."""
        k, device = self.beam, src_tokens.device
        bsz, src_len = src_tokens.shape
        src_lengths = src_tokens.ne(PAD).sum(1)  # [B]
        max_lens = self.max_lengths(src_lengths)  # [B]
        # The batch's one read before decoding.
        longest, shortest, min_src = torch.stack(
            [max_lens.max(), max_lens.min(), src_lengths.min()]
        ).tolist()
        expand = torch.arange(bsz, device=device).repeat_interleave(k)  # [B*K]
        # With a shortlist the search runs over the batch's candidates: token columns
        # [V'] instead of ids, mapped back to ids as they are chosen. The specials' columns
        # are their ids, so the rules (no PAD/BOS, EOS at the limit, ...) read the same.
        vocab = None
        if self.shortlist is not None:  # (holding each sentence's required phrases)
            must = None if constraints is None else required_ids(constraints)
            vocab = batch_vocab(self.shortlist, src_tokens, prefix_tokens, must)
        padded = min_src < src_len
        members = [
            _Member(m, src_tokens, expand, self._cache_args(i, longest + 1), padded, vocab)
            for i, m in enumerate(self.models)
        ]
        if vocab is not None and prefix_tokens is not None:
            prefix_tokens = vocab.to_columns(prefix_tokens)
        required, banned, rules = self._constraints(constraints, vocab, device)
        if self.never:
            rules = (*rules, self._never_rule(vocab))
        scores = torch.zeros(bsz, k, device=device)  # [B,K]
        if not self.search.sampling:
            # All K start states are the same; extending only the first avoids K copies.
            scores[:, 1:] = NEG_INF
        return _BatchSearch(
            members=members,
            finished=_Finished(
                bsz,
                k,
                longest,
                src_len,
                want_attn,
                device,
                None if required is None else required.sentences,
            ),
            forced=ForcedTokens(prefix_tokens, max_lens, k, min_max=shortest),
            vocab=vocab,
            required=required,
            banned=banned,
            rules=rules,
            sent=torch.arange(bsz, device=device),
            max_lens=max_lens,
            tokens=torch.full((bsz * k, 1), EOS, dtype=torch.long, device=device),
            pos_scores=torch.zeros(bsz * k, 0, device=device),
            attn_hist=torch.zeros(bsz * k, 0, src_len, device=device) if want_attn else None,
            scores=scores,
            longest=longest,
            on_cpu=device.type == "cpu",
        )

    def _never_rule(self, vocab: BatchVocab | None) -> Rule:
        """The rule that keeps `never`'s ids out of the batch's hypotheses (their columns
        over a shortlist: those of them that are candidates)."""
        if vocab is None:
            return NeverGenerate(self.never)
        known = vocab.columns.size(0)
        ids = [i for i in self.never if i < known]
        columns = vocab.columns[ids].tolist() if ids else []
        return NeverGenerate([c for c in columns if c >= 0])

    def _constraints(
        self,
        constraints: list[TokenConstraints] | None,
        vocab: BatchVocab | None,
        device: torch.device,
    ) -> tuple[RequiredPhrases | None, BannedPhrases | None, tuple[Rule, ...]]:
        """A batch's constraints (constraints.py): its required phrases, its banned
        ones, and the rules they add to each step (EOS only once the phrases are met,
        never a banned phrase)."""
        if constraints is None:
            return None, None, ()
        required = RequiredPhrases.of(constraints, self.beam, vocab, device)
        banned = BannedPhrases.of(constraints, self.beam, vocab, device)
        rules: list[Rule] = []
        if required is not None:
            rules.append(required.block_eos)
        if banned is not None:
            rules.append(banned)
        return required, banned, tuple(rules)

    def _step(
        self, state: _BatchSearch, step: int, attn_layer: int | None
    ) -> tuple[Tensor, Tensor | None]:
        """One decoder step of every row: the next-token log-probs [R,V] ([R,V'] over a
        shortlist) with the search's rules applied (processors.py), and the attention
        [R,S] | None."""
        lprobs, attn = self._lprobs(state.members, state.tokens, attn_layer, state.vocab)
        tokens = state.tokens if state.vocab is None else state.vocab.to_columns(state.tokens)
        self.processors(lprobs, step, tokens, state.forced, state.rules)
        return lprobs, attn

    def _lprobs(
        self,
        members: list[_Member],
        tokens: Tensor,
        attn_layer: int | None,
        vocab: BatchVocab | None,
    ) -> tuple[Tensor, Tensor | None]:
        """Next-token log-probs [R,V] (ensemble mean; [R,V'] over a shortlist, each
        sentence's non-candidates -inf) and attention [R,S] | None."""
        lprobs, attn = [], []
        for m in members:
            logits, a = m.step(tokens, attn_layer)
            logits = m.float_logits(logits)  # [R,V] (or [R,V']) float32, changed in place below
            if vocab is not None:
                vocab.restrict(logits, self.beam)
            lprobs.append(self.processors.log_probs(logits))
            if a is not None:
                attn.append(a)
        lp = lprobs[0] if len(lprobs) == 1 else torch.stack(lprobs).mean(0)
        at = None if not attn else attn[0] if len(attn) == 1 else torch.stack(attn).mean(0)
        return lp, at

    def _select(self, state: _BatchSearch, lprobs: Tensor) -> _Selection:
        """The step's candidates of each sentence (beam search or sampling, search.py)
        from lprobs [R,V], and the K that continue: the best that do not end."""
        s, k = self.search, self.beam
        n = state.sent.numel()
        lp3 = lprobs.view(n, k, -1)  # [N,K,V]
        if s.sampling:
            cand = sample_candidates(lp3, state.scores, s.sampling_topk, s.sampling_topp, self.rng)
        else:
            cand = beam_candidates(lp3, state.scores)
        phrases = endings = None
        if state.required is not None:  # with the required phrases' beam allocation
            endings = state.required.endings(state.scores, cand[0])
            cand, phrases = state.required.candidates(lp3, state.scores, cand)
        scores, tokens, origins = cand  # [N,C]
        cand_lp = lprobs.view(n, -1).gather(1, origins * lp3.size(2) + tokens)  # [N,C]
        if state.vocab is not None:  # columns -> token ids
            tokens = state.vocab.to_ids(tokens)
        is_eos = tokens.eq(EOS)
        if s.sampling:  # each row keeps its own sample; one that ended is dead (-inf)
            pick = torch.arange(k, device=tokens.device).expand(n, k)
            next_scores = scores.masked_fill(is_eos, NEG_INF)
        else:
            pick, next_scores = select_active(scores, is_eos, k)  # [N,K]
        return _Selection(
            scores,
            tokens,
            origins,
            cand_lp,
            is_eos,
            next_scores,
            tokens.gather(1, pick),
            origins.gather(1, pick),
            cand_lp.gather(1, pick),
            None if phrases is None else phrases.complete(),
            None if phrases is None else phrases.take(pick),
            endings,
        )

    def _finish(
        self,
        state: _BatchSearch,
        step: int,
        chosen: _Selection,
        step_attn: Tensor | None,
        gone: Tensor | None = None,
    ) -> _Progress:
        """File the candidates that end (EOS among a sentence's top K, fairseq) as
        finished hypotheses, and find the sentences done: K finished, at their limit, or
        `gone` [N] (no longer wanted: nothing more is filed for them)."""
        k, finished, sent = self.beam, state.finished, state.sent
        finishing = chosen.is_eos[:, :k] & chosen.scores[:, :k].gt(NEG_INF)  # [N,K]
        if gone is not None:
            finishing &= ~gone.unsqueeze(1)
        if state.on_cpu and not bool(finishing.any()):  # most steps; reading is free on a CPU
            accepted, counts = None, finished.count[sent]
        else:
            accepted, slots, counts = finished.slots(sent, finishing)  # [N,K], [N,K], [N]
        done = counts.ge(k) | state.max_lens.le(step)  # [N]
        if gone is not None:
            done |= gone
        reads = [done.sum(), state.max_lens.masked_fill(done, self.max_positions).min()]
        if accepted is not None:
            reads.append(accepted.sum())
        fallback = self._fallback_slots(state, step, chosen.endings, gone)
        if fallback is not None:
            reads.append(fallback[2].sum())
        # The step's one read: sentences done, the others' shortest limit, hypotheses
        # finishing (and fallbacks); what the host needs to steer the batch.
        n_done, min_left, *n_filed = torch.stack(reads).tolist()
        n_accepted = n_filed.pop(0) if accepted is not None else 0
        n_fallbacks = n_filed.pop(0) if fallback is not None else 0
        history = (state.tokens, state.pos_scores, state.attn_hist)
        if accepted is not None and n_accepted:
            finished.add(
                step,
                sent,
                (accepted, slots, n_accepted),
                (chosen.lprobs, chosen.scores, chosen.origins),
                history,
                step_attn,
                self.search.lenpen,
                chosen.complete,
            )
        if fallback is not None and n_fallbacks:
            pool, ends, fallback_mask, fallback_slots = fallback
            pool.add(
                step,
                sent,
                (fallback_mask, fallback_slots, n_fallbacks),
                (ends.lprobs, ends.scores, ends.origins),
                history,
                step_attn,
                self.search.lenpen,
            )
        return _Progress(done, n_done, min_left, gone is not None)

    def _fallback_slots(
        self, state: _BatchSearch, step: int, endings: Endings | None, gone: Tensor | None
    ) -> tuple[_Finished, Endings, Tensor, Tensor] | None:
        """The endings a missing phrase forbade to file as fallbacks, as the plain search
        files its own (the eligible ones, while a slot is free): (the fallbacks, the
        endings, accepted [N,K], slots [N,K]); None when there are none (surely so: on a
        CPU, where reading is free, or without required phrases). A row pinned to a
        prefix token or to EOS (the length limit) did not choose: it is no fallback."""
        fallbacks = state.finished.fallbacks
        if endings is None or fallbacks is None:
            return None
        free = state.max_lens.gt(step)  # [N] the rows choose their token
        prefix = state.forced.prefix
        if prefix is not None and step < prefix.size(1):
            free &= prefix[:, step].eq(PAD)
        if gone is not None:
            free &= ~gone
        eligible = endings.eligible & free.unsqueeze(1)  # [N,K]
        if state.on_cpu and not bool(eligible.any()):
            return None
        accepted, slots, _ = fallbacks.slots(state.sent, eligible)
        return fallbacks, endings, accepted, slots

    def _reorder(
        self,
        state: _BatchSearch,
        chosen: _Selection,
        progress: _Progress,
        step_attn: Tensor | None,
    ) -> None:
        """Continue the chosen hypotheses: finished sentences leave the batch (or idle in
        it), each model's cache and the histories follow the rows the chosen extend, and
        the chosen tokens are appended."""
        k, n = self.beam, state.sent.numel()
        done, n_done = progress.done, progress.n_done
        scores, tokens = chosen.next_scores, chosen.next_tokens  # [N,K]
        origins, lprobs = chosen.next_origins, chosen.next_lprobs  # [N,K]
        # Finished sentences leave the batch once they are a quarter of it: moving the
        # others' cache rows costs more than decoding a few idle rows for some steps.
        # Until then their scores are -inf, so they never finish another hypothesis.
        # Sentences no longer wanted leave at once: they may have many steps left.
        same_sentences = n_done * 4 < n and not progress.dropped
        if same_sentences:
            kept = torch.arange(n, device=done.device)
            if n_done:
                scores = scores.masked_fill(done.unsqueeze(1), NEG_INF)
        else:
            kept = true_positions(~done, n - n_done)  # [N']
            state.sent, state.max_lens = state.sent[kept], state.max_lens[kept]
            state.forced.keep(kept, state.max_lens, progress.min_left)
            if state.vocab is not None:
                state.vocab.keep(kept)
            if state.banned is not None:
                state.banned.keep(kept)
            scores, tokens, origins, lprobs = (t[kept] for t in (scores, tokens, origins, lprobs))
        state.scores = scores  # [N',K]
        if state.required is not None and chosen.next_phrases is not None:
            state.required.follow(chosen.next_phrases, None if same_sentences else kept)
        order = (kept.unsqueeze(1) * k + origins).view(-1)  # [R'] rows they extend
        # Greedy and sampling extend every row from itself: nothing moves unless the
        # batch shrank, so the cache copy is skipped.
        unmoved = same_sentences and (k == 1 or self.search.sampling)
        if not unmoved:
            for m in state.members:
                m.reorder(order, None if same_sentences else kept)
            state.tokens, state.pos_scores = state.tokens[order], state.pos_scores[order]
        state.tokens = torch.cat([state.tokens, tokens.view(-1, 1)], dim=1)  # [R',2+t]
        state.pos_scores = torch.cat([state.pos_scores, lprobs.view(-1, 1)], dim=1)  # [R',1+t]
        if state.attn_hist is not None and step_attn is not None:
            attn_hist = torch.cat([state.attn_hist, step_attn.unsqueeze(1)], dim=1)
            state.attn_hist = attn_hist if unmoved else attn_hist[order]  # [R',1+t,S]
