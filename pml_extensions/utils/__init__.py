"""Helpers shared by the pml_extensions methods (the k-NN engine and the accuracy calculators live in
:mod:`pml_extensions.knn`). The names below are imported on first use, so that the config layer's light helpers
(:mod:`~pml_extensions.utils.checks`) import no torch."""

import importlib

_NAMES = {
    "DistributedLossWrapper": "distributed_loss_wrapper",
    "class_disjoint_split": "class_split",
    "ridge_prototypes": "ridge",
}
__all__ = ["DistributedLossWrapper", "class_disjoint_split", "ridge_prototypes"]


def __getattr__(name):
    if name in _NAMES:
        return getattr(importlib.import_module(f".{_NAMES[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_NAMES))
