"""Helpers shared by the pml_extensions methods."""

from .asymmetric_accuracy_calculator import AsymmetricAccuracyCalculator
from .chunked_accuracy_calculator import ChunkedAccuracyCalculator
from .class_split import class_disjoint_split
from .distributed_loss_wrapper import DistributedLossWrapper
from .knn_metrics import trapezoidal_average_precision
from .ridge import ridge_prototypes

__all__ = [
    "AsymmetricAccuracyCalculator",
    "ChunkedAccuracyCalculator",
    "DistributedLossWrapper",
    "class_disjoint_split",
    "ridge_prototypes",
    "trapezoidal_average_precision",
]
