"""The exact k-NN engine and the accuracy calculators built on it.

- :class:`~pml_extensions.knn.engine.BlockedKNN`: exact, tie-exact k nearest neighbours, block by block (bfloat16 or
  float32 tiles that only propose candidates, float64 scores that decide);
- :class:`ChunkedAccuracyCalculator` / :class:`AsymmetricAccuracyCalculator`: drop-in replacements of PML's
  ``AccuracyCalculator`` (self-retrieval; queries against a separate reference set) on that engine;
- :func:`trapezoidal_average_precision`: the AP of a ranked relevance list by the trapezoidal rule;
- :func:`ensemble_metrics`: the MLRC test numbers of k models, separate and concatenated.

Example::

    >>> import torch
    >>> from pml_extensions.knn import ChunkedAccuracyCalculator
    >>> x = torch.tensor([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9]])
    >>> calc = ChunkedAccuracyCalculator(include=("precision_at_1",), k=1)
    >>> calc.get_accuracy(x, torch.tensor([0, 0, 1, 1]))["precision_at_1"]
    1.0
"""

from .asymmetric_accuracy_calculator import AsymmetricAccuracyCalculator
from .chunked_accuracy_calculator import ChunkedAccuracyCalculator
from .engine import BlockedKNN
from .metrics import ensemble_metrics, trapezoidal_average_precision

__all__ = [
    "AsymmetricAccuracyCalculator",
    "BlockedKNN",
    "ChunkedAccuracyCalculator",
    "ensemble_metrics",
    "trapezoidal_average_precision",
]
