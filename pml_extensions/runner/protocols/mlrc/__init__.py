"""The ``mlrc`` protocol (Metric Learning Reality Check): :class:`MLRC` (its settings and checks, no torch) and
:class:`MLRCRunner` (the run, imported when first used)."""

import importlib

from .protocol import MLRC

__all__ = ["MLRC", "MLRCRunner", "ensemble_metrics", "mlrc_class_splits"]


def __getattr__(name):  # the run's modules import torch: loaded on first use, not when a config is read
    if name not in __all__[1:]:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(".runner", __name__), name)
