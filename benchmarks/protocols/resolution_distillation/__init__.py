"""The ``resolution_distillation`` protocol (RAML; a runner plugin)."""

from .protocol import PROTOCOL, ResolutionDistillation, run

__all__ = ["PROTOCOL", "ResolutionDistillation", "run"]
