"""Swapping a model's linear layers for inference-only ones (int8: quantize.py; fp32 on
oneDNN: packed.py), in place, the fused projections of FastKernels included. A kind swapped
in implements `rows` (nmt.model.linear.SelectsRows), so that a shortlist can use it."""

from __future__ import annotations

import os
from collections.abc import Callable

from torch import Tensor, nn

from nmt.errors import NmtError

# (weight [N,K], bias [N] or None, whether it is the decoder's output projection) -> layer
MakeLayer = Callable[[Tensor, Tensor | None, bool], nn.Module]


def swap_linear_layers(model: nn.Module, make: MakeLayer) -> None:
    """Every nn.Linear of `model` with more than one input feature (int8's anchor row
    needs a second column) becomes `make(weight, bias, output_layer)`; attention modules
    with fused projections compute them with `make` from now on."""
    output_layer = getattr(getattr(model, "decoder", None), "output_projection", None)
    for module in list(model.modules()):
        replace_fused = getattr(module, "replace_fused_projections", None)
        if replace_fused is not None:  # before its linear layers are replaced below
            replace_fused(lambda weight, bias: make(weight, bias, False))
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear) and child.in_features > 1:
                setattr(module, name, make(child.weight, child.bias, child is output_layer))


def gemm_named_by(
    env: str, gemms: tuple[str, str], kind: str, onednn_missing: Callable[[], str]
) -> str:
    """The GEMM the environment variable `env` names, "" when it is unset: one of `gemms`
    (the other is a one-line error). "onednn" is refused when `onednn_missing()` says why
    it cannot run here ("" when it can)."""
    chosen = os.environ.get(env, "")
    if not chosen:
        return ""
    if chosen not in gemms:
        raise NmtError(f"{env}={chosen}: unknown {kind} GEMM; use {' or '.join(gemms)}")
    why = onednn_missing() if chosen == "onednn" else ""
    if why:
        other = next(g for g in gemms if g != "onednn")
        raise NmtError(
            f"{env}=onednn: {why}; use {other}, or leave it unset to choose automatically"
        )
    return chosen
