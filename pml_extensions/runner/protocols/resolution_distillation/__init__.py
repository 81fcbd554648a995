"""The ``resolution_distillation`` protocol (RAML)."""

from .protocol import CONFIG_KEYS, run

__all__ = ["CONFIG_KEYS", "run"]
