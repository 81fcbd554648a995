"""The ``xml_vs_gap`` protocol (the main job)."""

from .protocol import CONFIG_KEYS, run

__all__ = ["CONFIG_KEYS", "run"]
