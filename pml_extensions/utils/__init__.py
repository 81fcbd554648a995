"""Helpers shared by the pml_extensions methods (the k-NN engine and the accuracy calculators live in
:mod:`pml_extensions.knn`)."""

from .class_split import class_disjoint_split
from .distributed_loss_wrapper import DistributedLossWrapper
from .ridge import ridge_prototypes

__all__ = ["DistributedLossWrapper", "class_disjoint_split", "ridge_prototypes"]
