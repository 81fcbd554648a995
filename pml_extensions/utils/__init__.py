"""Helpers shared by the pml_extensions methods."""

from .class_split import class_disjoint_split
from .distributed_loss_wrapper import DistributedLossWrapper
from .ridge import ridge_prototypes

__all__ = ["DistributedLossWrapper", "class_disjoint_split", "ridge_prototypes"]
