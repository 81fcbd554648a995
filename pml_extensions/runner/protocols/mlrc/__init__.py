"""The ``mlrc`` protocol (Metric Learning Reality Check)."""

from .protocol import MLRCRunner, run
from .splits import ensemble_metrics, mlrc_class_splits

__all__ = ["MLRCRunner", "ensemble_metrics", "mlrc_class_splits", "run"]
