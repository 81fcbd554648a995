"""Moved: the main job is the ``xml_vs_gap`` protocol (:mod:`pml_extensions.runner.protocols.xml_vs_gap`).

Kept only so that imports of the old module keep working until the MLRC runner stops using
``attach_histogram_layer`` (use :meth:`pml_extensions.losses.XMLWrapper.attach_all`).
"""

from .factory import ConfigError
from .protocols.xml_vs_gap import main  # noqa: F401


def attach_histogram_layer(loss_funcs: dict, trunk):
    """:meth:`XMLWrapper.attach_all` with the config error the runner reports."""
    from ..losses import XMLWrapper

    try:
        XMLWrapper.attach_all(loss_funcs, trunk)
    except ValueError as e:
        raise ConfigError(f"config_loss_and_miners: {e}") from e
