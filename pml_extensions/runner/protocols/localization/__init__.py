"""The ``localization`` protocol: explanation maps of metric-learning models scored as weakly supervised localisation,
paired over seeds."""

from .protocol import CONFIG_KEYS, method_statistics, run, run_units, variant_statistics

__all__ = ["CONFIG_KEYS", "method_statistics", "run", "run_units", "variant_statistics"]
