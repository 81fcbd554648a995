"""Moved: the MLRC protocol lives in :mod:`pml_extensions.runner.protocols.mlrc` (this name stays importable
until the command line is switched to :func:`pml_extensions.runner.protocols.run_protocol`)."""

from .protocols.mlrc import MLRCRunner, ensemble_metrics, mlrc_class_splits  # noqa: F401
