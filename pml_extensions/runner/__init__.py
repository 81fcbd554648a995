"""The powerful-benchmarker-style runner: configs in, experiment folders out, one protocol per experiment kind.

Its floor plan (each floor imports only the floors listed before it, none imports :mod:`pml_extensions.cli`; see
docs/runner.md, "Where each part lives"): ``errors`` (:class:`ConfigError`, the one exception), ``config/`` (where a
key is parsed), ``experiment/`` (where a run's files are written), ``objects/`` (where an object is built),
``outputs/`` (what a run reports) and ``protocols/`` (what a run does: the protocols as plugins and
:func:`~.protocols.run_protocol`, the one entry point).

Example::

    >>> from pml_extensions.runner import PROTOCOLS, find_config, load_config
    >>> sorted(PROTOCOLS)
    ['mlrc', 'paired']
    >>> config, sources = load_config(find_config("xml_glyphs"))
    >>> config["protocol"], sources["models"]
    ('paired', 'configs/xml_glyphs/config_models.yaml')
"""

import importlib
from typing import Any

#: the module that defines each public name, imported on first use (PEP 562): ``import pml_extensions.runner`` and its
#: light modules (``errors``, ``config``) load no torch, so the command line answers ``--help``, ``--list``,
#: ``--dry-run`` and config errors at once
_MODULES = {
    ".config.loader": ("CONFIG_FOLDERS", "find_config", "merge", "parse_command_line"),
    ".config.registry": ("ROLES", "classes_for_role", "find", "register", "resolve"),
    ".errors": ("ConfigError", "MissingDataError"),
    ".experiment.checkpoint": ("Checkpointer",),
    ".experiment.distributed": ("DistributedBatchSliceSampler",),
    ".objects.builder": ("Builder", "build"),
    ".objects.mlp": ("MLP",),
    ".outputs.report": ("write_report",),
    ".protocols": ("PROTOCOLS", "load_config", "register_protocol", "run_protocol"),
    ".protocols.base": ("Protocol",),
    ".protocols.paired_protocol": ("PairedProtocol",),
    ".protocols.mlrc": ("MLRCRunner", "ensemble_metrics", "mlrc_class_splits"),
}
_LAZY = {name: module for module, names in _MODULES.items() for name in names}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name], __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


__all__ = sorted(_LAZY)
