"""Experiment protocols of the one runner, behind one lookup table.

A protocol is a module with ``run(config, experiment_folder, sources=None, log=print) -> dict``:

- ``config``: the merged config (``pml_extensions.runner.config.loader``); ``config["protocol"]`` names the
  protocol (default ``"mlrc"``).
- ``experiment_folder``: where everything goes (layout: :mod:`pml_extensions.runner.experiment.folder`); rerunning
  with the same folder resumes.
- ``sources``: top-level key -> file, so errors name the file; ``log``: a print-like function.

It returns the results it also wrote to ``<experiment_folder>/results.json``. :func:`run_protocol` is what the
command line calls: it checks a rerun's saved config, saves ``config.yaml`` and ``command.txt``, runs the protocol
and writes ``report.html``. Two more ways in sit beside it: :mod:`.search` (an Optuna study whose trials are
``run_protocol`` calls) and :mod:`.reproduce` (a finished run again from its ``config.yaml``). Each protocol is a
sub-package (``mlrc/``, ``xml_vs_gap/``, ``resolution_distillation/``, ``template_block/``, ``localization/``)
whose ``protocol.py`` holds ``run``; every
object it trains with comes from :class:`pml_extensions.runner.objects.builder.Builder`, and no protocol imports
another.

Example::

    >>> from pml_extensions.runner.protocols import PROTOCOLS, get_protocol
    >>> sorted(PROTOCOLS)
    ['localization', 'mlrc', 'resolution_distillation', 'template_block', 'xml_vs_gap']
    >>> callable(get_protocol("mlrc").run)
    True
"""

import importlib
from types import ModuleType
from typing import Any, Callable, Dict, Optional, Sequence

from ..errors import ConfigError

#: protocol name -> module (imported on first use, so one protocol's dependencies never load for another)
PROTOCOLS: Dict[str, str] = {
    "mlrc": "pml_extensions.runner.protocols.mlrc",
    "xml_vs_gap": "pml_extensions.runner.protocols.xml_vs_gap",
    "resolution_distillation": "pml_extensions.runner.protocols.resolution_distillation",
    "template_block": "pml_extensions.runner.protocols.template_block",
    "localization": "pml_extensions.runner.protocols.localization",
}
DEFAULT_PROTOCOL = "mlrc"

#: one line per protocol for ``run --list protocol``
DESCRIPTIONS: Dict[str, str] = {
    "mlrc": "Metric Learning Reality Check: class-disjoint folds, early stopping, separate + concatenated test",
    "xml_vs_gap": "the main job: variants (HistogramPooling + XMLWrapper vs GAP) trained with one seed, compared",
    "resolution_distillation": "RAML: teacher at database resolution, students at query resolutions, FLOPs",
    "template_block": "template-matching block vs its controls (plain, aux loss only, wider), paired over seeds",
    "localization": "explanation maps localise objects: methods x sign conventions, MS vs Triplet, paired seeds",
}


def protocol_name(config: Dict[str, Any], sources: Optional[Dict[str, str]] = None) -> str:
    """The config's ``protocol`` (default ``"mlrc"``).

    Raises:
        ConfigError: one line naming the file and the known protocols when the name is unknown.
    """
    name = config.get("protocol", DEFAULT_PROTOCOL)
    if name is None:
        name = DEFAULT_PROTOCOL
    if not isinstance(name, str) or name not in PROTOCOLS:
        where = (sources or {}).get("protocol", "config_general")
        raise ConfigError(f"{where}: protocol: unknown {name!r}; choose one of {', '.join(sorted(PROTOCOLS))}")
    return name


def get_protocol(name: str) -> ModuleType:
    """The protocol module called ``name`` (it has a ``run`` function).

    Raises:
        ConfigError: for a name that is not in :data:`PROTOCOLS`.
    """
    if name not in PROTOCOLS:
        raise ConfigError(f"protocol: unknown {name!r}; choose one of {', '.join(sorted(PROTOCOLS))}")
    return importlib.import_module(PROTOCOLS[name])


def run_protocol(
    config: Dict[str, Any],
    experiment_folder: str,
    sources: Optional[Dict[str, str]] = None,
    log: Callable[..., None] = print,
    on_change: str = "stop",
    command: Optional[Sequence[str]] = None,
) -> Dict[str, Any]:
    """Run the config's protocol in ``experiment_folder`` (the one entry point of the command line).

    Args:
        config, experiment_folder, sources, log: passed to the protocol's ``run``.
        on_change: what to do when the folder holds a saved ``config.yaml`` that differs from ``config``:
            ``"stop"`` (raise), ``"new"`` (move the old folder aside and start afresh; ``--new``) or ``"resume"``
            (continue with the new config deliberately; ``--resume-anyway``).
        command: the command line, saved to ``command.txt`` and shown in the report.

    Returns:
        the protocol's results.

    Raises:
        ConfigError: unknown protocol, or a changed config with ``on_change="stop"`` (one line listing the
        differing keys and the two flags).
    """
    from ..experiment import distributed as dist_utils
    from ..experiment.folder import prepare_folder
    from ..outputs.report import write_report

    name = protocol_name(config, sources)
    module = get_protocol(name)
    prepare_folder(experiment_folder, config, on_change=on_change, command=command, log=log)
    results = module.run(config, experiment_folder, sources=sources, log=log)
    if dist_utils.is_main():
        write_report(experiment_folder)
    return results
