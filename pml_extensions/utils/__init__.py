"""Helpers shared by the pml_extensions methods."""

from .class_split import class_disjoint_split
from .ridge import ridge_prototypes

__all__ = ["class_disjoint_split", "ridge_prototypes"]
