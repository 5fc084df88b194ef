"""Read a pickled checkpoint from elsewhere (fairseq) without letting it run code.

A pickle names the callables that rebuild it; an ordinary `torch.load(weights_only=False)`
imports and calls whatever it names (`os.system`, ...). Here `find_class` resolves only
an explicit allowlist of data types: containers, `argparse.Namespace` (fairseq < 0.10
`args`), OmegaConf's containers (fairseq 0.10 pickled `cfg` as a DictConfig; later
versions store plain dicts), torch's tensor rebuild functions and dtypes, and numpy
scalars/arrays (fairseq's meters). Anything else is an NmtError naming the type, raised
before that type is imported.

fairseq itself is never imported: its checkpoints hold only these data types.
"""

from __future__ import annotations

import _compat_pickle
import argparse
import collections
import io
import os
import pickle
import types
from pathlib import Path
from typing import Any, BinaryIO

import torch

from nmt.errors import NmtError


def _numpy_globals() -> dict[tuple[str, str], Any]:
    import numpy as np

    try:  # numpy >= 2 moved numpy.core to numpy._core; pickles name either
        from numpy._core import multiarray
    except ImportError:  # pragma: no cover - numpy 1.x
        from numpy.core import multiarray  # type: ignore[no-redef]
    out: dict[tuple[str, str], Any] = {}
    for module in ("numpy.core.multiarray", "numpy._core.multiarray"):
        out[(module, "scalar")] = multiarray.scalar
        out[(module, "_reconstruct")] = multiarray._reconstruct
    out[("numpy", "dtype")] = np.dtype
    out[("numpy", "ndarray")] = np.ndarray
    # numpy >= 1.25 pickles dtypes as numpy.dtypes.Float64DType etc.
    dtypes = getattr(np, "dtypes", None)
    if dtypes is not None:
        for name in dir(dtypes):
            if name.endswith("DType"):
                out[("numpy.dtypes", name)] = getattr(dtypes, name)
    return out


def _omegaconf_globals() -> dict[tuple[str, str], Any]:
    """OmegaConf's containers and nodes: their state is data, set via __setstate__."""
    import typing

    from omegaconf import base, dictconfig, listconfig, nodes

    out: dict[tuple[str, str], Any] = {
        ("omegaconf.dictconfig", "DictConfig"): dictconfig.DictConfig,
        ("omegaconf.listconfig", "ListConfig"): listconfig.ListConfig,
        ("omegaconf.base", "ContainerMetadata"): base.ContainerMetadata,
        ("omegaconf.base", "Metadata"): base.Metadata,
        ("typing", "Any"): typing.Any,  # a node's declared type, stored as data
    }
    for name in (
        "AnyNode",
        "StringNode",
        "IntegerNode",
        "FloatNode",
        "BooleanNode",
        "EnumNode",
        "BytesNode",
        "PathNode",
        "ValueNode",
    ):
        if hasattr(nodes, name):
            out[("omegaconf.nodes", name)] = getattr(nodes, name)
    return out


def _torch_globals() -> dict[tuple[str, str], Any]:
    out: dict[tuple[str, str], Any] = {
        ("torch", "Size"): torch.Size,
        ("torch", "Tensor"): torch.Tensor,
        ("torch", "device"): torch.device,
        ("torch.nn.parameter", "Parameter"): torch.nn.Parameter,
        ("torch._tensor", "_rebuild_from_type_v2"): torch._tensor._rebuild_from_type_v2,
    }
    for name in (
        "_rebuild_tensor",
        "_rebuild_tensor_v2",
        "_rebuild_parameter",
        "_rebuild_parameter_with_state",
        "_rebuild_device_tensor_from_numpy",
    ):
        if hasattr(torch._utils, name):
            out[("torch._utils", name)] = getattr(torch._utils, name)
    for attr in dir(torch):  # dtypes are pickled by name: torch.float32, torch.int64, ...
        value = getattr(torch, attr, None)
        if isinstance(value, torch.dtype):
            out[("torch", attr)] = value
    return out


def _builtin_globals() -> dict[tuple[str, str], Any]:
    out: dict[tuple[str, str], Any] = {
        ("collections", "OrderedDict"): collections.OrderedDict,
        ("collections", "defaultdict"): collections.defaultdict,
        ("collections", "Counter"): collections.Counter,
        ("argparse", "Namespace"): argparse.Namespace,
        ("_codecs", "encode"): __import__("codecs").encode,  # bytes under pickle protocol 2
    }
    for t in (
        dict,
        list,
        tuple,
        set,
        frozenset,
        int,
        float,
        complex,
        bool,
        str,
        bytes,
        bytearray,
        slice,
    ):
        out[("builtins", t.__name__)] = t
    return out


_ALLOWED: dict[tuple[str, str], Any] | None = None


def allowed_globals() -> dict[tuple[str, str], Any]:
    """(module, name) -> object: everything a fairseq checkpoint may name."""
    global _ALLOWED
    if _ALLOWED is None:
        table: dict[tuple[str, str], Any] = {}
        for part in (_builtin_globals, _torch_globals, _numpy_globals, _omegaconf_globals):
            table.update(part())
        _ALLOWED = table
    return _ALLOWED


class RefusedType(NmtError):
    """The pickle names a type outside the allowlist."""


class RestrictedUnpickler(pickle.Unpickler):
    """A pickle.Unpickler whose find_class resolves allowlisted data types only."""

    source = "checkpoint"  # the file name used in error messages (set per load)

    def find_class(self, module: str, name: str) -> Any:
        # protocol-2 pickles (torch.save's default) spell builtins the Python 2 way
        if (module, name) in _compat_pickle.NAME_MAPPING:
            module, name = _compat_pickle.NAME_MAPPING[(module, name)]
        module = _compat_pickle.IMPORT_MAPPING.get(module, module)
        try:
            return allowed_globals()[(module, name)]
        except KeyError:
            raise RefusedType(
                f"{self.source}: refusing to unpickle {module}.{name}: only plain data "
                "(tensors, containers, argparse/OmegaConf configs, numpy scalars) is "
                "accepted from a fairseq checkpoint; if you trust this file, load it "
                "with fairseq and save only its 'model' and 'args'/'cfg'"
            ) from None


def _restricted_pickle_module(source: str) -> types.ModuleType:
    """A module-like object torch.load can use as `pickle_module` (Unpickler + load)."""

    class _Unpickler(RestrictedUnpickler):
        pass

    _Unpickler.source = source

    def load(file: BinaryIO, **kwargs: Any) -> Any:
        return _Unpickler(file, **kwargs).load()

    def loads(data: bytes, **kwargs: Any) -> Any:
        return _Unpickler(io.BytesIO(data), **kwargs).load()

    module = types.ModuleType("nmt_restricted_pickle")
    module.Unpickler = _Unpickler  # type: ignore[attr-defined]
    module.load = load  # type: ignore[attr-defined]
    module.loads = loads  # type: ignore[attr-defined]
    module.__name__ = "nmt_restricted_pickle"
    return module


def load_untrusted(path: str | os.PathLike) -> Any:
    """torch.load a checkpoint written by another program, refusing non-data types.

    torch handles the container format (zip or legacy) and tensor storages; every
    global the pickle names goes through RestrictedUnpickler.find_class.
    """
    path = Path(path)
    if not path.is_file():
        raise NmtError(f"{path}: file not found")
    module = _restricted_pickle_module(str(path))
    try:
        return torch.load(path, map_location="cpu", pickle_module=module, weights_only=False)
    except NmtError:
        raise
    except Exception as exc:  # truncated zip, not a pickle, ...: one line naming the file
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise NmtError(
            f"{path}: not a readable PyTorch checkpoint (truncated or corrupted?): {first[:200]}"
        ) from exc
