"""SequenceGenerator: batched beam search (or sampling) driving the incremental decoder.

Shape legend: B sentences in the batch, N sentences still being decoded, K beam,
R = N*K decoder rows, S source length, V target vocabulary, t tokens generated so far.

The source is encoded once and expanded to K rows per sentence; each step feeds only the
newest token through the decoder (its KV cache holds the rest), scores the candidates with
search.py, files the ones ending in EOS as finished hypotheses, and reorders the cache by
the beams that survive. A sentence is finished when it has K finished hypotheses (or
reached its length limit); finished sentences leave the batch, so the remaining steps
cost less.
Semantics are fairseq's: score = sum of log-probs / length**lenpen, length counting EOS.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from nmt.data.vocab import BOS, EOS, PAD, UNK
from nmt.generation.config import SearchConfig
from nmt.generation.search import (
    NEG_INF,
    beam_candidates,
    block_repeated_ngrams,
    length_penalty,
    sample_candidates,
    select_active,
)
from nmt.model.cache import CacheMemory


@dataclass
class Hypothesis:
    """One finished translation of one source sentence."""

    tokens: Tensor  # [T] long: generated target ids, forced prefix included, ending in EOS
    score: float  # sum(positional_scores) / T**lenpen
    positional_scores: Tensor  # [T] float: log-probability of each token
    attention: Tensor | None  # [T,S] float: the chosen layer's attention, when requested


class _Member:
    """One model of the ensemble with its encoder output and decoder cache."""

    def __init__(
        self, model: torch.nn.Module, src_tokens: Tensor, expand: Tensor, cache_args: dict | None
    ):
        self.model = model
        self.enc = model.encode(src_tokens)  # one row per sentence
        self.cache = model.new_cache(**cache_args) if cache_args is not None else None
        if self.cache is None:  # the uncached decoder needs a source row per decoder row
            self.enc = self.enc.reorder(expand)  # rows: sentence b -> K rows
        # (the cache keeps one row of encoder keys/values per sentence, which its K beams
        # share: K times less to project, store, read and move)

    def step(self, tokens: Tensor, attn_layer: int | None) -> tuple[Tensor, Tensor | None]:
        """tokens [R,1+t] decoder input so far -> (logits [R,V], attn [R,S] | None)."""
        if self.cache is not None:
            logits, attn = self.model.decode(tokens[:, -1:], self.enc, self.cache, attn_layer)
        else:  # the uncached baseline: the whole prefix again
            logits, attn = self.model.decode(tokens, self.enc, None, attn_layer)
        return logits[:, -1], None if attn is None else attn[:, -1]

    def reorder(self, order: Tensor, kept: Tensor | None) -> None:
        """Rows become old rows `order` [R']; kept [N']: the sentences that stay, or None
        when no sentence left the batch."""
        if self.cache is not None:
            # The cache holds the encoder keys/values; `enc` is not read after step 0.
            self.cache.reorder(order, encoder_rows=kept)
        elif kept is not None:
            self.enc = self.enc.reorder(order)


class _Finished:
    """Finished hypotheses of a batch: K slots per sentence, filled in the order they end."""

    def __init__(
        self, bsz: int, k: int, longest: int, src_len: int, want_attn: bool, device: torch.device
    ):
        self.k = k
        self.tokens = torch.full((bsz, k, longest + 1), PAD, dtype=torch.long, device=device)
        self.pos = torch.zeros(bsz, k, longest + 1, device=device)
        self.scores = torch.full((bsz, k), NEG_INF, device=device)  # length-normalized
        self.lengths = torch.zeros(bsz, k, dtype=torch.long, device=device)
        self.count = torch.zeros(bsz, dtype=torch.long, device=device)  # [B] slots used
        self.attn = torch.zeros(bsz, k, longest + 1, src_len, device=device) if want_attn else None

    def add(
        self,
        sid: Tensor,
        slot: Tensor,
        prefix: Tensor,
        prefix_pos: Tensor,
        last_lp: Tensor,
        score: Tensor,
        attn: Tensor | None,
    ) -> None:
        """F hypotheses ending in EOS now: sentence sid [F], slot [F], tokens before EOS
        prefix [F,t] with their log-probs prefix_pos [F,t], EOS's log-prob last_lp [F],
        normalized score [F], attention [F,t+1,S] | None."""
        t = prefix.size(1)
        self.tokens[sid, slot, :t] = prefix
        self.tokens[sid, slot, t] = EOS
        self.pos[sid, slot, :t] = prefix_pos
        self.pos[sid, slot, t] = last_lp
        self.scores[sid, slot] = score
        self.lengths[sid, slot] = t + 1
        self.count.index_add_(0, sid, torch.ones_like(sid))
        if self.attn is not None and attn is not None:
            self.attn[sid, slot, : t + 1] = attn

    def collect(self, nbest: int) -> list[list[Hypothesis]]:
        """Per sentence, its nbest hypotheses, best first (on the CPU)."""
        order = self.scores.argsort(dim=1, descending=True, stable=True)[:, :nbest]
        scores = self.scores.gather(1, order).tolist()
        lengths = self.lengths.gather(1, order).tolist()
        counts = self.count.tolist()
        tokens, pos = self.tokens.cpu(), self.pos.cpu()
        attn = None if self.attn is None else self.attn.cpu()
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
                    )
                    for j, score, length in zip(picks[: counts[b]], scores[b], lengths[b])
                ]
            )
        return out


class SequenceGenerator:
    """Translate batches of source token ids with one model or an ensemble.

    Ensemble members must share the target vocabulary; their log-probabilities are
    averaged. Models must be in eval mode; autocast (bf16/fp16) is the caller's context.
    """

    def __init__(
        self, models: Sequence[torch.nn.Module], search: SearchConfig, attn_layer: int | None = None
    ):
        search.validate()
        self.models = list(models)
        self.search = search
        self.attn_layer = attn_layer
        self.beam = search.beam
        # Longest output: the decoder input at the last step (max_len + 1 tokens) must fit.
        self.max_positions = min(m.cfg.max_target_positions for m in self.models) - 1
        self._cache_memory = [CacheMemory() for _ in self.models]
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
            memory=self._cache_memory[member],
        )

    def max_lengths(self, src_lengths: Tensor) -> Tensor:
        """Per-sentence output limit (tokens before EOS): a*src_len + b, capped."""
        s = self.search
        limit = (s.max_len_a * src_lengths.double() + s.max_len_b).floor().long()
        return limit.clamp(min=1, max=self.max_positions)

    def _lprobs(self, members: list[_Member], tokens: Tensor) -> tuple[Tensor, Tensor | None]:
        """Next-token log-probs [R,V] (ensemble mean) and attention [R,S] | None."""
        lprobs, attn = [], []
        for m in members:
            logits, a = m.step(tokens, self.attn_layer)
            logits = logits.float().contiguous()  # [R,V]
            if self.search.temperature != 1.0:
                logits = logits / self.search.temperature
            # In place: the logits are this step's own, and writing a fresh [R,V] tensor
            # every step costs twice the log-softmax (page faults on a CPU)
            lprobs.append(torch.log_softmax(logits, dim=-1, out=logits))
            if a is not None:
                attn.append(a)
        lp = lprobs[0] if len(lprobs) == 1 else torch.stack(lprobs).mean(0)
        at = None if not attn else attn[0] if len(attn) == 1 else torch.stack(attn).mean(0)
        return lp, at

    @torch.inference_mode()
    def generate(
        self, src_tokens: Tensor, prefix_tokens: Tensor | None = None
    ) -> list[list[Hypothesis]]:
        """src_tokens [B,S] (right-padded, each ending in EOS); prefix_tokens [B,P]
        (right-padded with PAD) to force at the start of each output. Returns, per
        sentence, up to nbest hypotheses, best first."""
        s, k = self.search, self.beam
        device = src_tokens.device
        bsz, src_len = src_tokens.shape
        max_lens = self.max_lengths(src_tokens.ne(PAD).sum(1))  # [B]
        longest = int(max_lens.max())
        expand = torch.arange(bsz, device=device).repeat_interleave(k)  # [B*K]
        members = [
            _Member(m, src_tokens, expand, self._cache_args(i, longest + 1))
            for i, m in enumerate(self.models)
        ]
        want_attn = self.attn_layer is not None

        finished = _Finished(bsz, k, longest, src_len, want_attn, device)

        # Active state: rows are sentence-major (row = n*K + beam).
        sent = torch.arange(bsz, device=device)  # [N] original index of each active sentence
        tokens = torch.full((bsz * k, 1), EOS, dtype=torch.long, device=device)  # [R,1+t]
        pos_scores = torch.zeros(bsz * k, 0, device=device)  # [R,t]
        attn_hist = torch.zeros(bsz * k, 0, src_len, device=device) if want_attn else None
        scores = torch.zeros(bsz, k, device=device)  # [N,K] cumulative log-probs
        if not s.sampling:
            # All K start states are the same; extending only the first avoids K copies.
            scores[:, 1:] = NEG_INF
        prefix = prefix_tokens
        if prefix is not None and (prefix.eq(EOS) | prefix.eq(BOS)).any():
            raise ValueError("prefix_tokens must not contain EOS or BOS")
        row_max = max_lens.repeat_interleave(k)  # [R]
        min_row_max = int(max_lens.min())

        for step in range(longest + 1):
            n = sent.numel()
            lp, step_attn = self._lprobs(members, tokens)  # [R,V], [R,S] | None
            forced = self._forced_tokens(step, prefix, row_max, min_row_max)  # ([F], [F]) | None
            if forced is not None:
                f_rows, f_tokens = forced
                f_lp = lp[f_rows, f_tokens]  # the model's own log-prob, before any penalty
            lp[:, (PAD, BOS)] = NEG_INF  # never generated
            if s.unkpen:
                lp[:, UNK] -= s.unkpen
            if step < s.min_len:
                lp[:, EOS] = NEG_INF
            if s.no_repeat_ngram_size:
                block_repeated_ngrams(tokens[:, 1:], lp, s.no_repeat_ngram_size)
            if forced is not None:  # forced rows may only produce their token
                lp[f_rows] = NEG_INF
                lp[f_rows, f_tokens] = f_lp

            lp3 = lp.view(n, k, -1)  # [N,K,V]
            if s.sampling:
                cand = sample_candidates(lp3, scores, s.sampling_topk, s.sampling_topp, self.rng)
            else:
                cand = beam_candidates(lp3, scores)
            cand_scores, cand_tokens, cand_origins = cand  # [N,C]
            cand_lp = lp.view(n, -1).gather(1, cand_origins * lp3.size(2) + cand_tokens)  # [N,C]
            is_eos = cand_tokens.eq(EOS)
            # Only EOS candidates among the top K finish a hypothesis (fairseq).
            finishing = is_eos[:, :k] & cand_scores[:, :k].gt(NEG_INF)  # [N,K]
            if bool(finishing.any()):
                slot = finished.count[sent].unsqueeze(1) + finishing.cumsum(1) - 1  # [N,K]
                ni, ci = (finishing & slot.lt(k)).nonzero(as_tuple=True)  # at most K each
                rows = ni * k + cand_origins[ni, ci]  # the hypotheses they extend
                attn = (
                    None
                    if not want_attn
                    else torch.cat([attn_hist[rows], step_attn[rows].unsqueeze(1)], dim=1)
                )
                finished.add(
                    sent[ni],
                    slot[ni, ci],
                    tokens[rows, 1:],
                    pos_scores[rows],
                    cand_lp[ni, ci],
                    cand_scores[ni, ci] / length_penalty(step + 1, s.lenpen),
                    attn,
                )

            if s.sampling:  # each row keeps its own sample; one that ended is dead (-inf)
                pick = torch.arange(k, device=device).expand(n, k)
                scores = cand_scores.masked_fill(is_eos, NEG_INF)
            else:
                pick, scores = select_active(cand_scores, is_eos, k)  # [N,K]
            act_tokens, act_origins = cand_tokens.gather(1, pick), cand_origins.gather(1, pick)
            act_lp = cand_lp.gather(1, pick)
            done = finished.count[sent].ge(k) | max_lens.le(step)  # [N]
            n_done = int(done.sum())
            if n_done == n:
                break
            # Finished sentences leave the batch once they are a quarter of it: moving the
            # others' cache rows costs more than decoding a few idle rows for some steps.
            # Until then their scores are -inf, so they never finish another hypothesis.
            same_sentences = n_done * 4 < n
            if same_sentences:
                kept = torch.arange(n, device=device)
                if n_done:
                    scores = scores.masked_fill(done.unsqueeze(1), NEG_INF)
            else:
                kept = (~done).nonzero().squeeze(1)  # [N']
                sent, max_lens = sent[kept], max_lens[kept]
                row_max = row_max.view(n, k)[kept].view(-1)
                scores, act_tokens, act_origins, act_lp = (
                    t[kept] for t in (scores, act_tokens, act_origins, act_lp)
                )
                prefix = None if prefix is None else prefix[kept]
                min_row_max = int(max_lens.min())
            order = (kept.unsqueeze(1) * k + act_origins).view(-1)  # [R'] rows they extend
            # Greedy and sampling extend every row from itself: nothing moves unless the
            # batch shrank, so the cache copy is skipped.
            unmoved = same_sentences and (k == 1 or s.sampling)
            if not unmoved:
                for m in members:
                    m.reorder(order, None if same_sentences else kept)
                tokens, pos_scores = tokens[order], pos_scores[order]
            tokens = torch.cat([tokens, act_tokens.view(-1, 1)], dim=1)
            pos_scores = torch.cat([pos_scores, act_lp.view(-1, 1)], dim=1)
            if want_attn:
                attn_hist = torch.cat([attn_hist, step_attn.unsqueeze(1)], dim=1)
                attn_hist = attn_hist if unmoved else attn_hist[order]

        return finished.collect(s.nbest)

    def _forced_tokens(
        self, step: int, prefix: Tensor | None, row_max: Tensor, min_row_max: int
    ) -> tuple[Tensor, Tensor] | None:
        """(rows [F], tokens [F]) that must be produced at this step, or None.

        A prefix token is forced while the prefix lasts; EOS once a row reaches its length
        limit (that wins over the prefix)."""
        in_prefix = prefix is not None and step < prefix.size(1)
        if not in_prefix and step < min_row_max:
            return None
        forced = torch.full_like(row_max, -1)  # [R], -1 = free
        if in_prefix:
            col = prefix[:, step].repeat_interleave(self.beam)  # [R]
            forced = torch.where(col.eq(PAD), forced, col)
        if step >= min_row_max:
            forced = torch.where(row_max.le(step), EOS, forced)
        rows = forced.ge(0).nonzero().squeeze(1)
        return (rows, forced[rows]) if rows.numel() else None
