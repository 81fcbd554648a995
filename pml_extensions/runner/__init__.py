"""The powerful-benchmarker-style runner: configs in, experiment folders out, one protocol per experiment kind.

The floor plan (each folder one concept; a folder imports only the ones listed before it, and none imports the
command line, :mod:`pml_extensions.cli`, which sits above the runner):

- ``errors.py`` — :class:`ConfigError`, the one exception: a one-line message naming the file and the key
  (:class:`MissingDataError` when the data a config names is not on the machine).
- ``config/`` — where a config key is parsed: ``loader`` (PB's folders and the flat form, variants, the command
  line), ``syntax`` (PB's merge and markers ``~OVERRIDE~ ~APPLY~ ~SWAP~ ~DELETE~ ~BAYESIAN~``), ``pb_keys`` and
  ``eval_keys`` (PB's values, honoured or refused), ``arguments`` (every class's keyword arguments), ``specs``
  (the one ``{ClassName: kwargs}`` parser) and ``registry`` (the names a config may use; :func:`register` adds
  yours).
- ``experiment/`` — where a run's files are written: ``folder`` (``config.yaml``, ``command.txt``, stages,
  ``results.json``, seeds, device), ``checkpoint`` (atomic checkpoints + record-keeper logs that survive SIGKILL),
  ``epoch_loop`` (resumable training and selection), ``distributed`` (torchrun ranks).
- ``objects/`` — where an object is built: ``builder`` (the one :class:`Builder`: datasets, transforms,
  trunk/embedder, losses with nested wrappers, miners, samplers, optimizers, schedulers, testers, trainers for
  every protocol), ``data`` (dataset views: subsets, class-disjoint validation parts), ``mlp`` (MLRC's embedder),
  ``saved_models`` (a finished run's models rebuilt from its ``config.yaml``, for ``explain``).
- ``outputs/`` — what a run reports: ``results`` (``results.json`` / ``results.md``, paired statistics and
  verdicts), ``tables`` (one table model, rendered to Markdown and HTML), ``report`` (``report.html``).
- ``protocols/`` — what a run does: protocols as plugins (``base``: :class:`Protocol`, its settings and
  ``--data_folder`` rule; ``paired_protocol``: :class:`PairedProtocol`, the seeds × variants engine), the lookup,
  the one loader and :func:`~.protocols.run_protocol` (the one entry point), ``search`` (an Optuna study of runs),
  ``reproduce`` (rerun a finished run), and the package's protocols ``mlrc/`` and ``paired/``. The paper
  reproductions are plugins outside the package (``benchmarks/protocols/``).

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


__all__ = [
    "Builder",
    "CONFIG_FOLDERS",
    "Checkpointer",
    "ConfigError",
    "DistributedBatchSliceSampler",
    "MLP",
    "MLRCRunner",
    "MissingDataError",
    "PROTOCOLS",
    "ROLES",
    "build",
    "classes_for_role",
    "ensemble_metrics",
    "find",
    "find_config",
    "load_config",
    "merge",
    "mlrc_class_splits",
    "parse_command_line",
    "register",
    "resolve",
    "run_protocol",
    "write_report",
]
