"""The ``paired`` protocol: any two or more variants of one config, trained with paired seeds on your data and
compared (:mod:`.protocol`; the unit: :mod:`.unit`)."""

from .protocol import Paired

__all__ = ["Paired"]
