"""The ``localization`` protocol (a runner plugin): explanation maps scored as weakly supervised localisation."""

from .protocol import PROTOCOL, Localization, method_statistics, variant_statistics

__all__ = ["PROTOCOL", "Localization", "method_statistics", "variant_statistics"]
