"""The powerful-benchmarker-style runner: configs in, experiment folders out, one protocol per experiment kind.

The floor plan (each folder one concept; a folder imports only the ones listed before it, and none imports the
command line, :mod:`pml_extensions.cli`, which sits above the runner):

- ``errors.py`` — :class:`ConfigError`, the one exception: a one-line message naming the file and the key
  (:class:`MissingDataError` when the data a config names is not on the machine).
- ``config/`` — where a config key is parsed: ``loader`` (PB's folders and the flat form, variants, the command
  line), ``syntax`` (PB's merge and markers ``~OVERRIDE~ ~APPLY~ ~SWAP~ ~DELETE~ ~BAYESIAN~``), ``keys`` (which
  top-level keys each protocol reads), ``old_keys`` (older spellings mapped with a note), ``pb_keys`` and
  ``eval_keys`` (PB's values, honoured or refused), ``specs`` (the one ``{ClassName: kwargs}`` parser) and
  ``registry`` (the names a config may use; :func:`register` adds yours).
- ``experiment/`` — where a run's files are written: ``folder`` (``config.yaml``, ``command.txt``, stages,
  ``results.json``, seeds, device), ``checkpoint`` (atomic checkpoints + record-keeper logs that survive SIGKILL),
  ``epoch_loop`` (resumable training and selection), ``distributed`` (torchrun ranks).
- ``objects/`` — where an object is built: ``builder`` (the one :class:`Builder`: datasets, transforms,
  trunk/embedder, losses with nested wrappers, miners, samplers, optimizers, schedulers, testers, trainers for
  every protocol), ``data`` (dataset views: subsets, class-disjoint validation parts), ``mlp`` (MLRC's embedder),
  ``saved_models`` (a finished run's models rebuilt from its ``config.yaml``, for ``explain``).
- ``outputs/`` — what a run reports: ``results`` (``results.json`` / ``results.md``, paired statistics and
  verdicts), ``report`` (``report.html``).
- ``protocols/`` — what a run does: the table of protocols and :func:`~.protocols.run_protocol` (the one entry
  point), ``search`` (an Optuna study of runs), ``reproduce`` (rerun a finished run), and one sub-package per
  protocol: ``mlrc/``, ``xml_vs_gap/``, ``resolution_distillation/``, ``template_block/``, ``localization/``.

Example::

    >>> from pml_extensions.runner import PROTOCOLS, find_config, load_config
    >>> sorted(PROTOCOLS)
    ['localization', 'mlrc', 'resolution_distillation', 'template_block', 'xml_vs_gap']
    >>> config, sources = load_config(find_config("xml_glyphs"))
    >>> config["protocol"], sources["models"]
    ('xml_vs_gap', 'configs/xml_glyphs/config_models.yaml')
"""

from .config.loader import CONFIG_FOLDERS, find_config, load_config, merge, parse_command_line
from .config.registry import ROLES, classes_for_role, find, register, resolve
from .errors import ConfigError, MissingDataError
from .experiment.checkpoint import Checkpointer
from .experiment.distributed import DistributedBatchSliceSampler
from .objects.builder import Builder, build
from .objects.mlp import MLP
from .outputs.report import write_report
from .protocols import PROTOCOLS, run_protocol
from .protocols.mlrc import MLRCRunner, ensemble_metrics, mlrc_class_splits

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
