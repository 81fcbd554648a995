"""The ``mlrc`` protocol (Metric Learning Reality Check)."""

from .protocol import MLRC, MLRCRunner
from .splits import ensemble_metrics, mlrc_class_splits

__all__ = ["MLRC", "MLRCRunner", "ensemble_metrics", "mlrc_class_splits"]
