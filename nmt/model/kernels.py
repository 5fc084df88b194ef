"""Faster versions of the operations the layers compute through (see layers.Kernels).

`Transformer` is built with `FastKernels` unless given other kernels, so training and
generation use these paths; `Transformer(..., kernels=Kernels())` builds the plain model,
which computes the same function (to within fp32 rounding; tests/unit/test_model.py
compares the two, outputs and gradients).

What is faster here, and where:
- q/k/v (and the encoder's k/v) projected by one matmul with the weights stacked
  (`FusedProjectionAttention`; every device);
- a cheaper dropout mask on CPU (`FastKernels.dropout`);
- attention for CPU training: two matmuls around a softmax up to
  MATMUL_ATTENTION_MAX_KEYS keys, and bf16 flash attention run in fp32 beyond
  (`FastKernels.attention`);
- no attention mask at all for a batch without padding (`FastKernels.attention_mask`), so
  that SDPA may pick its flash kernels (on a GPU when the caller says so from the host).
CUDA and torch.compile keep torch's own kernels for all but the projections and masks.

Shape legend as in layers.py: B batch, T queries, K keys, D embed_dim, H heads, Dh head width.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nmt.model.layers import Kernels, MultiheadAttention

# Key lengths up to which CPU training spells attention out (two matmuls around a softmax):
# it beat SDPA's CPU flash kernels forward and backward up to ~150 keys, in fp32 and bf16.
MATMUL_ATTENTION_MAX_KEYS = 128


class FastKernels(Kernels):
    """layers.Kernels' operations, faster where the device and the mode allow it.

    `rows_alone`: CPU inference attends each run of rows with the same number of keys on
    its own (attention_by_length), so that a row is bit for bit what it is alone. int8
    needs that (nmt.model.quantize.quantize_int8 sets it); fp32 does not, and keeps one
    SDPA call per batch. Its other state remembers the runs of the last attention mask it
    read: a weak reference, so a freed mask is never taken for a new one.
    """

    def __init__(self, rows_alone: bool = False) -> None:
        self.rows_alone = rows_alone
        self._runs_memo: tuple[weakref.ref, list[tuple[int, int, int]] | None] | None = None

    def dropout(self, x: Tensor, p: float, training: bool) -> Tensor:
        """F.dropout with a cheaper mask on CPU (same distribution to within 2**-16 in p).

        torch's CPU dropout draws one double per element from its serial RNG (a fifth of a
        training step). Here each 64-bit draw gives the keep/drop decisions of four
        elements (16 bits each; 64-bit draws cost a third of 32-bit ones per bit), which is
        several times cheaper forward and backward. The mask keeps an element with
        probability 1 - round(p * 2**16) / 2**16 and scales by its inverse, so the
        expectation is exact. CUDA keeps F.dropout (its RNG is parallel), and so does
        torch.compile, which fuses dropout with its own generator.
        """
        if not training or p == 0.0:
            return x
        if x.device.type != "cpu" or p >= 1.0 or torch.compiler.is_compiling():
            return F.dropout(x, p, training)
        drop = round(p * 65536)  # dropped values out of 2**16
        n = x.numel()
        bits = torch.empty((n + 3) // 4, dtype=torch.int64).random_(-(2**63), None)  # 64 bits
        keep = bits.view(torch.int16)[:n].view(x.shape) >= drop - 32768  # P = 1 - drop / 2**16
        return x * (keep.to(x.dtype) * (65536 / (65536 - drop)))

    def attention(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None = None,
        is_causal: bool = False,
        dropout_p: float = 0.0,
    ) -> Tensor:
        """SDPA [B,H,T,Dh] -> [B,H,T,Dh], with CPU training's own paths.

        When gradients are needed on a CPU, torch's flash attention is slow for NMT's short
        sequences: 10-30% slower than two matmuls around a softmax in fp32 (forward plus
        backward), 2-4x slower in bf16, whose flash backward is ~3x slower than fp32's. So
        up to MATMUL_ATTENTION_MAX_KEYS keys, attention is spelled out
        (`attention_with_weights`: its [B,H,T,K] scores are small there); beyond, bf16
        runs the flash kernels in fp32. CUDA and inference use SDPA as is; with
        `rows_alone`, CPU inference over each run of rows with the same number of keys
        (`attention_by_length`).
        """
        if q.device.type != "cpu" or not torch.is_grad_enabled():
            by_length = self.rows_alone and q.device.type == "cpu"
            if by_length and mask is not None and not is_causal and not dropout_p:
                return self.attention_by_length(q, k, v, mask)
            return F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal
            )
        if k.size(-2) <= MATMUL_ATTENTION_MAX_KEYS:
            return self.attention_with_weights(q, k, v, mask, is_causal, dropout_p)[0]
        if q.dtype != torch.bfloat16:
            return F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal
            )
        with torch.autocast("cpu", enabled=False):
            out = F.scaled_dot_product_attention(
                q.float(),
                k.float(),
                v.float(),
                attn_mask=mask,
                dropout_p=dropout_p,
                is_causal=is_causal,
            )
        return out.to(torch.bfloat16)

    def attention_by_length(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
        """SDPA over right-padded keys (mask [B,1,1,K], True = a real key): each run of
        consecutive rows with the same number n of real keys attends over keys [:n]
        without a mask, so that a row computes bit for bit what it computes in a batch
        of its own. With a mask over padded keys SDPA's kernels and GEMMs take other
        shapes, and results move by ~1e-7 with the batch's longest source: harmless in
        fp32, but enough for int8 to round an activation to the next level and flip a
        near-tie (nmt.model.quantize). Batches are sorted by length, so runs are few.
        Any other mask goes to SDPA as it is."""
        runs = self._key_runs(mask, q.size(0), k.size(-2))
        if runs is None:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        if len(runs) == 1 and runs[0][2] == k.size(-2):
            return F.scaled_dot_product_attention(q, k, v)
        out = q.new_empty(*q.shape[:-1], v.size(-1))  # [B,H,T,Dh]
        for start, end, keys in runs:
            rows = slice(start, end)
            out[rows] = F.scaled_dot_product_attention(
                q[rows], k[rows, :, :keys], v[rows, :, :keys]
            )
        return out

    def _key_runs(self, mask: Tensor, rows: int, keys: int) -> list[tuple[int, int, int]] | None:
        """(start, end, real keys) of each run of rows of `mask` with the same number of
        keys, or None when it is not a right-padding mask of `rows` rows. Read from the
        tensor once: the same mask comes back at every step of a batch, every layer."""
        memo = self._runs_memo
        if memo is not None and memo[0]() is mask:  # (masks are never edited in place)
            return memo[1]
        runs: list[tuple[int, int, int]] | None = None
        if mask.dim() == 4 and mask.shape[1:3] == (1, 1) and mask.shape[0] == rows:
            flat = mask.reshape(rows, -1)
            if flat.size(1) == keys and not torch.compiler.is_compiling():
                lengths = flat.sum(1)
                prefix = torch.arange(keys, device=mask.device) < lengths[:, None]
                if torch.equal(prefix, flat):
                    runs = []
                    for row, n in enumerate(lengths.tolist()):
                        if runs and runs[-1][2] == n:
                            runs[-1] = (runs[-1][0], row + 1, n)
                        else:
                            runs.append((row, row + 1, n))
                    if any(n == 0 for _, _, n in runs):  # a row without keys: SDPA's NaNs
                        runs = None
        self._runs_memo = (weakref.ref(mask), runs)
        return runs

    def attention_mask(self, padding_mask: Tensor, padded: bool | None = None) -> Tensor | None:
        """As Kernels', but None for a batch without padding, so that SDPA may pick its
        fastest kernel (flash attention takes no mask). `padded` comes from the caller,
        who knows the lengths on the host; when it is None the data are read, but only
        on CPU tensors in eager mode: on a GPU that would wait for the device, and under
        torch.compile a branch on data would break the graph."""
        if (
            padded is None
            and padding_mask.device.type == "cpu"
            and not torch.compiler.is_compiling()
        ):
            padded = bool(padding_mask.any())
        if padded is False:
            return None
        return super().attention_mask(padding_mask)

    def multihead_attention(
        self, embed_dim: int, num_heads: int, dropout: float
    ) -> MultiheadAttention:
        return FusedProjectionAttention(embed_dim, num_heads, dropout, self)


class FusedProjectionAttention(MultiheadAttention):
    """MultiheadAttention whose projections of the same input run as one matmul.

    One bigger matmul is faster than three small ones, and under autocast the input is
    cast to bf16 once instead of three times. The parameters stay fairseq's separate
    q_proj/k_proj/v_proj; their concatenation is built per call in training (its gradient
    splits back for free) and kept between calls in inference.
    """

    def __init__(self, embed_dim: int, num_heads: int, dropout: float, kernels: Kernels):
        super().__init__(embed_dim, num_heads, dropout, kernels)
        self._joint_cache: dict[str, tuple[tuple, Tensor, Tensor]] = {}
        # inference's own layers (nmt.model.swap): the stacked projections as int8 layers
        # (quantize.py) or packed fp32 ones (packed.py); submodules, so that .to() and
        # .double() reach them
        self._replaced = nn.ModuleDict()

    def replace_fused_projections(self, make: Callable[[Tensor, Tensor], nn.Module]) -> None:
        """Compute the stacked projections with `make(weight, bias)` from now on (for
        inference: nmt.model.swap.swap_linear_layers)."""
        projs = {"qkv": (self.q_proj, self.k_proj, self.v_proj), "kv": (self.k_proj, self.v_proj)}
        with torch.no_grad():
            for name, layers in projs.items():
                weight = torch.cat([p.weight for p in layers])  # [n*D,D]
                bias = torch.cat([p.bias for p in layers])  # [n*D]
                self._replaced[name] = make(weight, bias)

    def _project(self, name: str, projs: tuple[nn.Linear, ...], x: Tensor) -> Tensor:
        """x [B,L,D] through the projections `projs` stacked: [B,L,n*D]."""
        if name in self._replaced:
            return self._replaced[name](x)
        return F.linear(x, *self._joint(name, projs))

    def _joint(self, name: str, projs: tuple[nn.Linear, ...]) -> tuple[Tensor, Tensor]:
        """The projections stacked into one: (weight [n*D,D], bias [n*D])."""
        if torch.is_grad_enabled():  # training: rebuilt each time so the gradient flows
            return (torch.cat([p.weight for p in projs]), torch.cat([p.bias for p in projs]))
        # Inference: reuse until a parameter changes. A load or an in-place edit bumps its
        # version, a move to another device or dtype changes its storage; a fused
        # optimizer step does neither, so `train()` (called for every training step, and
        # by `eval()`) empties the cache as well.
        params = [t for p in projs for t in (p.weight, p.bias)]
        key = tuple((t._version, t.data_ptr(), t.dtype, t.device) for t in params)
        cached = self._joint_cache.get(name)
        if cached is None or cached[0] != key:
            weight = torch.cat([p.weight for p in projs]).detach()
            bias = torch.cat([p.bias for p in projs]).detach()
            cached = self._joint_cache[name] = (key, weight, bias)
        return cached[1], cached[2]

    def train(self, mode: bool = True) -> FusedProjectionAttention:
        self._joint_cache.clear()
        return super().train(mode)

    def project_kv(self, x: Tensor) -> tuple[Tensor, Tensor]:
        kv = self._project("kv", (self.k_proj, self.v_proj), x)  # [B,K,2D]
        k, v = kv.chunk(2, dim=-1)
        return self.split_heads(k), self.split_heads(v)

    def project_qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        qkv = self._project("qkv", (self.q_proj, self.k_proj, self.v_proj), x)  # [B,T,3D]
        q, k, v = qkv.chunk(3, dim=-1)
        return self.split_heads(q), self.split_heads(k), self.split_heads(v)
