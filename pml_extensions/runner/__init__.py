"""The powerful-benchmarker-style runner: configs in, experiment folders out, one protocol per experiment kind.
Its floors (``errors``, ``config/``, ``experiment/``, ``objects/``, ``outputs/``, ``protocols/``) are described in
docs/runner.md, "Where each part lives".

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

#: the module of each public name, imported on first use (PEP 562), so that ``--help``, ``--list``, ``--dry-run`` and
#: config errors answer without importing torch
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
