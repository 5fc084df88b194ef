"""Transformer invariants: incremental decoding, padding, batching, causality, gradients.

The invariants that concern the layers hold for the plain layers (layers.Kernels) and the
fast ones (kernels.FastKernels, the default) alike; tests/unit/test_model_kernels.py
checks that the two compute the same function."""

from __future__ import annotations

import pytest
import torch
from rounding import assert_same_function, float64_twin, probability_sum_tolerance

from nmt.model.config import ModelConfig
from nmt.model.kernels import FastKernels
from nmt.model.layers import Kernels
from nmt.model.transformer import Transformer
from nmt.vocab import EOS, PAD

SRC_V, TGT_V = 41, 37


KERNELS = {"fast": FastKernels, "plain": Kernels}


def make_model(seed: int = 0, kernels: str = "fast", **overrides) -> Transformer:
    torch.manual_seed(seed)
    fields = dict(
        embed_dim=32, ffn_dim=64, attention_heads=4, encoder_layers=2, decoder_layers=2, dropout=0.0
    )
    fields.update(overrides)
    model = Transformer(ModelConfig(**fields), SRC_V, TGT_V, kernels=KERNELS[kernels]())
    return model.eval()


def tokens(lengths: list[int], vocab: int, first: int | None = None) -> torch.Tensor:
    """A right-padded batch [B, max(lengths)] of random real tokens."""
    batch = torch.full((len(lengths), max(lengths)), PAD)
    for i, n in enumerate(lengths):
        batch[i, :n] = torch.randint(4, vocab, (n,))
        if first is not None:
            batch[i, 0] = first
    return batch


VARIANTS = {
    "post-norm": {},
    "pre-norm": {"normalize_before": True},
    "pre-norm-learned-pos-ln-emb-gelu": {
        "normalize_before": True,
        "learned_pos": True,
        "layernorm_embedding": True,
        "activation_fn": "gelu",
    },
}


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("kernels", KERNELS)
def test_cached_steps_equal_full_decoding(variant, kernels):
    model = make_model(kernels=kernels, **VARIANTS[variant])
    src = tokens([7, 4, 6], SRC_V)
    prev = tokens([9, 9, 9], TGT_V, first=EOS)
    with torch.no_grad():
        enc = model.encode(src)
        full, full_attn = model.decode(prev, enc, attn_layer=-1)
        cache = model.new_cache()
        steps, attns = [], []
        for t in range(prev.size(1)):
            logits, attn = model.decode(prev[:, t : t + 1], enc, cache, attn_layer=-1)
            steps.append(logits)
            attns.append(attn)
        twin = float64_twin(model)
        exact, exact_attn = twin.decode(prev, twin.encode(src), attn_layer=-1)
    assert cache.length == prev.size(1)
    assert_same_function(torch.cat(steps, 1), full, exact)
    assert_same_function(torch.cat(attns, 1), full_attn, exact_attn)


@pytest.mark.parametrize("kernels", KERNELS)
def test_cached_multi_token_steps_equal_full_decoding(kernels):
    """A forced prefix fed at once, then single tokens (positions continue from the cache)."""
    model = make_model(kernels=kernels, normalize_before=True)
    src = tokens([5, 8], SRC_V)
    prev = tokens([8, 8], TGT_V, first=EOS)
    with torch.no_grad():
        enc = model.encode(src)
        full, _ = model.decode(prev, enc)
        cache = model.new_cache()
        parts = [
            model.decode(prev[:, :3], enc, cache)[0],
            model.decode(prev[:, 3:5], enc, cache)[0],
        ]
        parts += [model.decode(prev[:, t : t + 1], enc, cache)[0] for t in range(5, 8)]
        twin = float64_twin(model)
        exact, _ = twin.decode(prev, twin.encode(src))
    assert_same_function(torch.cat(parts, 1), full, exact)


def test_cache_grows_past_its_first_chunk():
    model = make_model()
    src = tokens([3, 5], SRC_V)
    prev = tokens([40, 40], TGT_V, first=EOS)  # > 2 chunks of 16
    with torch.no_grad():
        enc = model.encode(src)
        full, _ = model.decode(prev, enc)
        cache = model.new_cache()
        steps = [model.decode(prev[:, t : t + 1], enc, cache)[0] for t in range(prev.size(1))]
        twin = float64_twin(model)
        exact, _ = twin.decode(prev, twin.encode(src))
    assert_same_function(torch.cat(steps, 1), full, exact)


def test_cache_reorder_equals_recomputing_reordered_prefixes():
    model = make_model(seed=1)
    src = tokens([6, 3, 5], SRC_V)
    prev = tokens([6, 6, 6], TGT_V, first=EOS)
    index = torch.tensor([2, 0, 0, 1])  # a different batch size, duplicated and dropped rows
    with torch.no_grad():
        enc = model.encode(src)
        cache = model.new_cache()
        for t in range(4):
            model.decode(prev[:, t : t + 1], enc, cache)
        cache.reorder(index, encoder_rows=index)
        # Continue the reordered rows with new tokens, and recompute them from scratch.
        tail = torch.randint(4, TGT_V, (len(index), 2))
        cached = torch.cat([model.decode(tail[:, t : t + 1], enc, cache)[0] for t in range(2)], 1)
        prefixes = torch.cat([prev[index, :4], tail], 1)
        full, _ = model.decode(prefixes, enc.reorder(index))
        twin = float64_twin(model)
        exact, _ = twin.decode(prefixes, twin.encode(src).reorder(index))
    assert_same_function(cached, full[:, 4:], exact[:, 4:])


def test_reorder_every_step_with_shrinking_batch_equals_recomputing():
    """Beam-search-like use: a reorder after every step, rows dropped on the way."""
    model = make_model(seed=5, normalize_before=True)
    src = tokens([6, 3, 5, 7], SRC_V)
    gen = torch.Generator().manual_seed(0)
    twin = float64_twin(model)
    with torch.no_grad():
        enc, enc64 = model.encode(src), twin.encode(src)
        cache = model.new_cache()
        history = torch.full((4, 1), EOS)  # every row's decoder input so far
        for rows_after in (4, 4, 3, 3, 2, 2):
            cached, _ = model.decode(history[:, -1:], enc, cache)
            full, _ = model.decode(history, enc)
            assert_same_function(cached[:, 0], full[:, -1], twin.decode(history, enc64)[0][:, -1])
            index = torch.randint(0, history.size(0), (rows_after,), generator=gen)
            cache.reorder(index, encoder_rows=index)
            enc, enc64 = enc.reorder(index), enc64.reorder(index)
            step = torch.randint(4, TGT_V, (rows_after, 1), generator=gen)
            history = torch.cat([history[index], step], 1)


def test_reorder_within_sentence_beams_keeps_encoder_rows():
    """Beam search's reorder: rows stay within their sentence, encoder states need not move."""
    model = make_model(seed=2)
    src = tokens([6, 3], SRC_V)
    beams = 3
    expand = torch.arange(2).repeat_interleave(beams)  # [0,0,0,1,1,1]
    prev = tokens([5] * 6, TGT_V, first=EOS)
    index = torch.tensor([1, 1, 0, 5, 3, 3])
    with torch.no_grad():
        enc = model.encode(src).reorder(expand)
        cache = model.new_cache()
        for t in range(3):
            model.decode(prev[:, t : t + 1], enc, cache)
        cache.reorder(index)
        step = torch.randint(4, TGT_V, (6, 1))
        cached, _ = model.decode(step, enc, cache)
        full, _ = model.decode(torch.cat([prev[index, :3], step], 1), enc.reorder(index))
        twin = float64_twin(model)
        enc64 = twin.encode(src).reorder(expand).reorder(index)
        exact, _ = twin.decode(torch.cat([prev[index, :3], step], 1), enc64)
    assert_same_function(cached[:, 0], full[:, -1], exact[:, -1])


@pytest.mark.parametrize("group", [1, 2], ids=["rows", "beam-groups"])
@pytest.mark.parametrize("kernels", KERNELS)
def test_beams_sharing_their_sentences_encoder_rows_equal_expanded_rows(group, kernels):
    """The generator's layout: the cache holds one encoder row per sentence and K decoder
    rows per sentence attend to it; outputs equal decoding against K expanded copies, also
    with attention weights, after beam reorders and after a sentence leaves the batch.
    With groups, the cache keeps each sentence's beams in place (DecoderCache)."""
    model = make_model(seed=3, kernels=kernels)
    src = tokens([6, 3, 5], SRC_V)
    beams = 2
    expand = torch.arange(3).repeat_interleave(beams)  # [0,0,1,1,2,2]
    history = tokens([1] * 6, TGT_V, first=EOS)
    gen = torch.Generator().manual_seed(1)
    twin = float64_twin(model)
    with torch.no_grad():
        enc = model.encode(src)  # [3 sentences]
        enc_rows = enc.reorder(expand)  # [6 rows]
        enc64_rows = twin.encode(src).reorder(expand)
        cache = model.new_cache(group=group)
        sentences = torch.arange(3)
        for step in range(4):
            cached, cached_attn = model.decode(history[:, -1:], enc, cache, attn_layer=-1)
            full, full_attn = model.decode(history, enc_rows, attn_layer=-1)
            exact, exact_attn = twin.decode(history, enc64_rows, attn_layer=-1)
            assert_same_function(cached[:, 0], full[:, -1], exact[:, -1])
            assert_same_function(cached_attn[:, 0], full_attn[:, -1], exact_attn[:, -1])
            n = sentences.numel()
            keep = torch.arange(n) if step != 1 else torch.tensor([0, 2])  # sentence 1 leaves
            origin = torch.randint(0, beams, (keep.numel(), beams), generator=gen)
            index = (keep[:, None] * beams + origin).view(-1)  # beams stay within their sentence
            cache.reorder(index, encoder_rows=None if step != 1 else keep)
            sentences = sentences[keep]
            enc_rows, enc64_rows = enc_rows.reorder(index), enc64_rows.reorder(index)
            step_tokens = torch.randint(4, TGT_V, (index.numel(), 1), generator=gen)
            history = torch.cat([history[index], step_tokens], 1)


def test_grouped_cache_over_prefixes_growth_and_reused_memory_equals_full_decoding():
    """Beam groups of 3 rows: a 3-token prefix at once, then single steps past the first
    16-position chunk with reorders within groups, a group leaving and the others
    swapping places; then a second batch in the same CacheMemory (stale contents, a
    different shape) decodes as if alone."""
    from nmt.model.cache import CacheMemory

    model = make_model(seed=6, normalize_before=True)
    twin = float64_twin(model)
    beams = 3
    memory = CacheMemory()
    gen = torch.Generator().manual_seed(2)
    for lengths in ([5, 7], [4, 6, 3]):
        n = len(lengths)
        tokens_of_lengths = tokens(lengths, SRC_V)
        enc = model.encode(tokens_of_lengths)
        history = torch.cat(
            [
                torch.full((n * beams, 1), EOS),
                torch.randint(4, TGT_V, (n * beams, 2), generator=gen),
            ],
            1,
        )
        enc_rows = enc.reorder(torch.arange(n).repeat_interleave(beams))
        enc64_rows = twin.encode(tokens_of_lengths).reorder(
            torch.arange(n).repeat_interleave(beams)
        )
        with torch.no_grad():
            cache = model.new_cache(group=beams, memory=memory)
            cached, _ = model.decode(history, enc, cache)  # the prefix, T = 3
            full, _ = model.decode(history, enc_rows)
            assert_same_function(cached, full, twin.decode(history, enc64_rows)[0])
            groups = torch.arange(n)
            for step in range(18):
                if step == 5 and n == 2:
                    groups = torch.tensor([1, 0])  # the sentences swap places
                elif step == 9 and n == 3:
                    groups = torch.tensor([0, 2])  # sentence 1 leaves
                else:
                    groups = torch.arange(groups.numel())
                origin = torch.randint(0, beams, (groups.numel(), beams), generator=gen)
                index = (groups[:, None] * beams + origin).view(-1)
                moved = not torch.equal(groups, torch.arange(cache._self_kv.size(2)))
                cache.reorder(index, encoder_rows=groups if moved else None)
                enc, enc_rows = enc.reorder(groups), enc_rows.reorder(index)
                enc64_rows = enc64_rows.reorder(index)
                history = torch.cat(
                    [history[index], torch.randint(4, TGT_V, (index.numel(), 1), generator=gen)], 1
                )
                cached, _ = model.decode(history[:, -1:], enc, cache)
                full, _ = model.decode(history, enc_rows)
                exact, _ = twin.decode(history, enc64_rows)
                assert_same_function(cached[:, 0], full[:, -1], exact[:, -1])
        assert cache.length == 21


def test_grouped_cache_refuses_a_reorder_across_groups():
    model = make_model()
    enc = model.encode(tokens([4, 5], SRC_V))
    with torch.no_grad():
        cache = model.new_cache(group=2)
        model.decode(torch.full((4, 1), EOS), enc, cache)
        with pytest.raises(ValueError, match="one old group"):
            cache.reorder(torch.tensor([0, 2, 1, 3]))


@pytest.mark.parametrize("kernels", KERNELS)
def test_padding_and_batch_composition_do_not_change_outputs(kernels):
    model = make_model(kernels=kernels, normalize_before=True)
    src = tokens([5, 9, 2], SRC_V)
    prev = tokens([4, 7, 8], TGT_V, first=EOS)
    twin = float64_twin(model)
    with torch.no_grad():
        batch_enc = model.encode(src)
        batch_logits, batch_attn = model.decode(prev, batch_enc, attn_layer=0)
        for i, (s_len, t_len) in enumerate([(5, 4), (9, 7), (2, 8)]):
            alone_src, alone_prev = src[i : i + 1, :s_len], prev[i : i + 1, :t_len]
            alone_enc = model.encode(alone_src)
            alone_logits, alone_attn = model.decode(alone_prev, alone_enc, attn_layer=0)
            exact_enc = twin.encode(alone_src)
            exact_logits, exact_attn = twin.decode(alone_prev, exact_enc, attn_layer=0)
            assert_same_function(batch_enc.out[i, :s_len], alone_enc.out[0], exact_enc.out[0])
            assert_same_function(batch_logits[i, :t_len], alone_logits[0], exact_logits[0])
            assert_same_function(batch_attn[i, :t_len, :s_len], alone_attn[0], exact_attn[0])
            assert batch_attn[i, :, s_len:].abs().sum() == 0  # no attention to padding


@pytest.mark.parametrize("kernels", KERNELS)
def test_extra_padding_columns_do_not_change_outputs(kernels):
    model = make_model(kernels=kernels)
    src = tokens([5, 3], SRC_V)
    prev = tokens([4, 6], TGT_V, first=EOS)
    pad = lambda x, n: torch.cat([x, torch.full((x.size(0), n), PAD)], 1)  # noqa: E731
    with torch.no_grad():
        logits = model(src, prev)
        padded = model(pad(src, 4), pad(prev, 3))
        exact = float64_twin(model)(src, prev)
    assert_same_function(padded[:, :6], logits, exact)


@pytest.mark.parametrize("kernels", KERNELS)
def test_decoder_is_causal(kernels):
    model = make_model(seed=3, kernels=kernels)
    src = tokens([6, 6], SRC_V)
    prev = tokens([8, 8], TGT_V, first=EOS)
    changed = prev.clone()
    changed[:, 5] = (prev[:, 5] - 4 + 1) % (TGT_V - 4) + 4  # a different real token
    with torch.no_grad():
        before, after = model(src, prev), model(src, changed)
        exact = float64_twin(model)(src, prev)
    assert_same_function(after[:, :5], before[:, :5], exact[:, :5])
    # a changed input token moves the logits by O(1), 1e-3 being far above fp32 rounding
    # (~1e-6 here) and far below the change (~0.1 or more)
    assert (before[:, 5:] - after[:, 5:]).abs().max() > 1e-3


@pytest.mark.parametrize("kernels", KERNELS)
def test_weights_path_matches_fast_path(kernels):
    """Asking for attention weights takes another code path; it must compute the same."""
    model = make_model(seed=4, kernels=kernels)
    src = tokens([7, 4], SRC_V)
    prev = tokens([5, 5], TGT_V, first=EOS)
    with torch.no_grad():
        enc = model.encode(src)
        plain, none = model.decode(prev, enc)
        weighted, attn = model.decode(prev, enc, attn_layer=1)
        twin = float64_twin(model)
        exact, _ = twin.decode(prev, twin.encode(src))
    assert none is None
    assert attn.shape == (2, 5, 7)
    assert_same_function(weighted, plain, exact)
    ones = torch.ones(2, 5)
    assert torch.allclose(attn.sum(-1), ones, rtol=0, atol=probability_sum_tolerance(7, heads=4))


def test_attn_layer_out_of_range_is_a_user_error():
    from nmt.errors import NmtError

    model = make_model()
    src = tokens([3], SRC_V)
    with pytest.raises(NmtError, match="decoder has 2 layers"):
        model.decode(tokens([2], TGT_V, first=EOS), model.encode(src), attn_layer=2)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("kernels", KERNELS)
def test_every_parameter_gets_a_gradient(variant, kernels):
    model = make_model(
        kernels=kernels,
        dropout=0.1,
        attention_dropout=0.1,
        activation_dropout=0.1,
        **VARIANTS[variant],
    ).train()
    src = tokens([6, 4], SRC_V)
    prev = tokens([5, 3], TGT_V, first=EOS)
    logits = model(src, prev)
    target = torch.randint(4, TGT_V, prev.shape)
    torch.nn.functional.cross_entropy(logits.transpose(1, 2), target).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name


@pytest.mark.parametrize("kernels", KERNELS)
def test_dropout_is_off_in_eval_and_on_in_train(kernels):
    model = make_model(kernels=kernels, dropout=0.3, attention_dropout=0.3)
    src, prev = tokens([5], SRC_V), tokens([4], TGT_V, first=EOS)
    with torch.no_grad():
        assert torch.equal(model(src, prev), model(src, prev))
        model.train()
        assert not torch.equal(model(src, prev), model(src, prev))


def test_shared_embeddings_are_one_tensor():
    model = Transformer(
        ModelConfig(
            embed_dim=16,
            ffn_dim=32,
            attention_heads=2,
            encoder_layers=1,
            decoder_layers=1,
            share_all_embeddings=True,
        ),
        30,
        30,
    )
    enc_w = model.encoder.embed_tokens.weight
    assert enc_w is model.decoder.embed_tokens.weight is model.decoder.output_projection.weight
    tied = Transformer(
        ModelConfig(
            embed_dim=16,
            ffn_dim=32,
            attention_heads=2,
            encoder_layers=1,
            decoder_layers=1,
            share_decoder_input_output_embed=True,
        ),
        30,
        20,
    )
    assert tied.decoder.output_projection.weight is tied.decoder.embed_tokens.weight
    assert tied.encoder.embed_tokens.weight is not tied.decoder.embed_tokens.weight
    # A state dict round trip keeps the tie (load_state_dict copies into the shared tensor).
    fresh = Transformer(model.cfg, 30, 30)
    fresh.load_state_dict(model.state_dict())
    assert fresh.decoder.output_projection.weight is fresh.encoder.embed_tokens.weight
    assert torch.equal(fresh.encoder.embed_tokens.weight, enc_w)


def test_fairseq_initialisation():
    model = make_model(embed_dim=64, ffn_dim=128)
    for emb in (model.encoder.embed_tokens, model.decoder.embed_tokens):
        assert emb.weight[PAD].abs().max() == 0
        real = torch.cat([emb.weight[:PAD], emb.weight[PAD + 1 :]])
        assert abs(real.std().item() - 64**-0.5) < 0.2 * 64**-0.5
    attn = model.encoder.layers[0].self_attn
    assert attn.out_proj.bias.abs().max() == 0
    # Xavier-uniform with gain 1/sqrt(2): bound = sqrt(6 / (fan_in + fan_out)) / sqrt(2).
    bound = (6 / 128) ** 0.5 / 2**0.5
    assert attn.q_proj.weight.abs().max() <= bound
    assert model.encoder.layers[0].fc1.bias.abs().max() == 0
