"""The ``mlrc`` protocol (Metric Learning Reality Check): :class:`MLRC` (its settings and checks, no torch) and
:class:`MLRCRunner` (the run, imported when first used)."""

from .protocol import MLRC

__all__ = ["MLRC", "MLRCRunner", "ensemble_metrics", "mlrc_class_splits"]


def __getattr__(name):  # the run's modules import torch: loaded on first use, not when a config is read
    if name == "MLRCRunner":
        from .runner import MLRCRunner

        return MLRCRunner
    if name in ("ensemble_metrics", "mlrc_class_splits"):
        from . import splits

        return getattr(splits, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
