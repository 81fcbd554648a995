"""Protocols as plugins (docs/runner.md, "Protocols"): the lookup (a name of :data:`PROTOCOLS`, one registered by
:func:`register_protocol` or under the entry-point group ``pml_extensions.protocols``, or a dotted path
``package.module:ClassName``), :func:`load_config`, which merges and checks a config against its protocol, and
:func:`run_protocol`, which runs it in an experiment folder.

Example::

    >>> from pml_extensions.runner.protocols import PROTOCOLS, get_protocol
    >>> sorted(PROTOCOLS)
    ['mlrc', 'paired']
    >>> "num_epochs" in get_protocol("paired").keys(), get_protocol("mlrc").description.split(":")[0]
    (True, 'Metric Learning Reality Check')
"""

import contextlib
import importlib
import os
import tempfile
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

from ..config.specs import nearest
from ..errors import ConfigError
from .base import Protocol, misspelt_required, parse_columns

#: protocol name -> ``module:Class`` (imported on first use, so one protocol's dependencies never load for another)
PROTOCOLS: Dict[str, str] = {
    "mlrc": "pml_extensions.runner.protocols.mlrc.protocol:MLRC",
    "paired": "pml_extensions.runner.protocols.paired.protocol:Paired",
}
#: the protocol of a config without ``protocol:``, by layout (:func:`pml_extensions.runner.config.loader.config_layout`)
DEFAULT_PROTOCOLS = {"folders": "mlrc", "flat": "paired"}
ENTRY_POINT_GROUP = "pml_extensions.protocols"
_REGISTERED: Dict[str, type] = {}


def register_protocol(name: str, cls: type) -> type:
    """Make ``cls`` (a :class:`~.base.Protocol` subclass) the protocol called ``name`` in this process; returns it.

    Raises:
        TypeError: ``cls`` is not a Protocol subclass.
    """
    if not (isinstance(cls, type) and issubclass(cls, Protocol)):
        raise TypeError(f"register_protocol: {cls!r} is not a Protocol subclass")
    _REGISTERED[name] = cls
    return cls


def _entry_points() -> Dict[str, Any]:
    from importlib.metadata import entry_points

    try:
        found = entry_points(group=ENTRY_POINT_GROUP)
    except TypeError:  # pragma: no cover - Python 3.9's entry_points() takes no group
        found = entry_points().get(ENTRY_POINT_GROUP, [])
    return {ep.name: ep for ep in found}


def _import(path: str, where: str) -> type:
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigError(
            f"{where}: cannot import {module_name!r} ({str(e).splitlines()[0]}); run from the folder that holds it"
        ) from None
    cls = getattr(module, attr or "PROTOCOL", None)
    if not (isinstance(cls, type) and issubclass(cls, Protocol)):
        raise ConfigError(f"{where}: {path!r} is not a protocol (a Protocol subclass, or a module with PROTOCOL)")
    return cls


def get_protocol(name: str, where: str = "config_general: protocol") -> type:
    """The protocol class called ``name`` (the module docstring says where names come from).

    Raises:
        ConfigError: an unknown name (the known ones listed, with "did you mean"), or a path that does not import.
    """
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{where}: expected a protocol name, got {name!r}")
    if name in _REGISTERED:
        return _REGISTERED[name]
    if name in PROTOCOLS:
        return _import(PROTOCOLS[name], where)
    if "." in name or ":" in name:
        return _import(name, where)
    plugins = _entry_points()
    if name in plugins:
        return plugins[name].load()
    known = sorted(set(PROTOCOLS) | set(_REGISTERED) | set(plugins))
    raise ConfigError(f"{where}: unknown {name!r}{nearest(name, known)} (known: {', '.join(known)}, or a dotted path)")


def protocol_of(config: Dict[str, Any], sources: Optional[Dict[str, str]] = None) -> type:
    """The protocol class of a merged config (``protocol:``; a config without it is ``mlrc``)."""
    where = f"{(sources or {}).get('protocol', 'config_general')}: protocol"
    return get_protocol(config.get("protocol") or DEFAULT_PROTOCOLS["folders"], where)


def descriptions() -> Dict[str, str]:
    """Name -> one line, for ``run --list protocol`` (the package's, registered and entry-point protocols)."""
    names = list(PROTOCOLS) + [n for n in _REGISTERED if n not in PROTOCOLS] + sorted(_entry_points())
    return {n: get_protocol(n).description for n in dict.fromkeys(names)}


def check_keys(
    config: Dict[str, Any],
    sources: Dict[str, str],
    protocol: type,
    file_keys: Sequence[str] = (),
    skip: Sequence[str] = (),
) -> None:
    """Refuse top-level keys the protocol does not read (its :meth:`~.base.Protocol.keys`), but those in ``skip``
    (misspellings of a required key, reported once as that key missing).

    Raises:
        ConfigError: ``"<file>: num_epoch: the paired protocol reads no such key; did you mean num_epochs?"``, or
        for a command-line key no file defines ``"command line: --bogus: no config file defines this key and the
        mlrc protocol does not read it ..."``; a key another protocol of the package reads is named as such.
    """
    from ..config.loader import split_marker

    known = set(protocol.keys())
    file_keys = {split_marker(k)[0] for k in file_keys}
    for key in config:
        name = split_marker(key)[0]
        if name in known or name in skip:
            continue
        command_line = sources.get(name) == "command line" and name not in file_keys
        hint = _hint(name, protocol, known | file_keys if command_line else known)
        if command_line:
            raise ConfigError(
                f"command line: --{name}: no config file defines this key and the {protocol.name} protocol does not "
                f"read it{hint} (all keys: the same command with --dry-run)"
            )
        raise ConfigError(
            f"{sources.get(name, 'config')}: {name}: the {protocol.name} protocol reads no such key{hint}"
        )


def _hint(name: str, protocol: type, known) -> str:
    others = [p for p in PROTOCOLS if p != protocol.name and name in get_protocol(p).keys()]
    if not others:
        return nearest(name, known, cutoff=0)
    close = nearest(name, known)
    lead = f"{close} It" if close else "; it"
    return f"{lead} is a key of the {' and '.join(others)} protocol{'s' if len(others) > 1 else ''}"


def load_config(
    config_root: str,
    selection: Optional[Dict[str, Sequence[str]]] = None,
    overrides: Optional[Dict[str, Any]] = None,
    allow_search: bool = False,
    data_folder: Optional[str] = None,
    columns: Any = None,
    check: bool = True,
    log: Optional[Callable[..., None]] = None,
) -> Tuple[Dict[str, Any], Dict[str, str]]:
    """The one loader: merge the config's files and ``overrides``, make ``data_folder`` the dataset by the protocol's
    rule, then check the config against its protocol (``check=False`` skips): keys, settings, every class's arguments.

    Returns:
        ``(config, sources)`` as :func:`~pml_extensions.runner.config.loader.merge_config`.

    Raises:
        ConfigError: one line naming the file and the key.

    Example::

        >>> from pml_extensions.runner.config.loader import find_config
        >>> cfg, src = load_config(find_config("contrastive"), {"config_general": ["default", "quick"]})
        >>> cfg["num_epochs_train"], src["num_epochs_train"]
        (3, 'configs/contrastive/config_general/quick.yaml')
    """
    from ..config.loader import check_no_search, config_layout, display_path, merge, merge_config

    config, sources = merge_config(config_root, selection, overrides)
    if "protocol" not in config:
        config["protocol"] = DEFAULT_PROTOCOLS[config_layout(config_root) or "folders"]
        sources["protocol"] = display_path(config_root)
    protocol = protocol_of(config, sources)
    if columns is not None and data_folder is None:
        raise ConfigError("command line: --columns: maps the columns of --data_folder's CSV file; give --data_folder")
    if data_folder is not None:
        if not isinstance(data_folder, str) or not data_folder:
            raise ConfigError("command line: --data_folder: needs a folder of class folders or a CSV file")
        is_csv = os.path.isfile(data_folder) and data_folder.lower().endswith(".csv")
        if not (os.path.isdir(data_folder) or is_csv):
            raise ConfigError(
                f"command line: --data_folder {data_folder}: no such folder (one sub-folder per class) or CSV file "
                "(label, path, split columns)"
            )
        path = os.path.abspath(data_folder)
        if columns is not None and not is_csv:
            raise ConfigError(f"command line: --columns: {path} is a folder of class folders, not a CSV file")
        update = protocol.data_folder(path, is_csv, parse_columns(columns) if columns is not None else None)
        config = merge(config, update, "command line")
        # the command line's own flags on those keys refine the data folder's (--dataset "{kwargs: {...}}")
        replaced = {k.split("~")[0] for k in update}
        refine = {k: v for k, v in (overrides or {}).items() if isinstance(k, str) and k.split("~")[0] in replaced}
        config = merge(config, refine, "command line") if refine else config
        sources.update(dict.fromkeys(replaced, "command line"))
        sources.add_layer("command line", config, update)  # nested values of the new dataset are the command line's
    if check:  # every check runs, and every problem found is reported together
        from ..config.arguments import check_arguments
        from ..config.loader import find_search_markers
        from ..errors import Problems

        problems = Problems()
        with problems.check():
            typos = misspelt_required(protocol.Settings, config)
            check_keys(config, sources, protocol, getattr(sources, "file_keys", config), skip=list(typos))
        with problems.check():
            config = protocol.normalize(config, sources, log)
            protocol.check(config, sources)
        settled = not problems.found  # the keys and settings hold: the data can be checked too
        with problems.check():
            check_arguments(config, sources)
        if problems.found and settled and not find_search_markers(config) and _names_files(config.get("dataset")):
            # the preflight's bad files of the user's data join the refusal (wrong classes or arguments)
            found, unused = Problems(), os.path.join(tempfile.gettempdir(), "pml_extensions_preflight")  # never written
            with contextlib.suppress(Exception), found.check():  # (the data check is extra: a failure is not reported)
                protocol(config, unused, sources, lambda *a, **k: None).preflight()
            problems.found += [line for line in found.data_files if line not in problems.found]
        problems.raise_any()
    if not allow_search:
        check_no_search(config, sources)
    return config, sources


def _names_files(value: Any) -> bool:
    """Whether ``value`` (a config's ``dataset``, at any depth) names a file or folder on disk."""
    if isinstance(value, dict):
        return any(_names_files(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_names_files(v) for v in value)
    return isinstance(value, str) and (os.sep in value or os.path.isabs(value)) and os.path.exists(value)


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
        config, experiment_folder, sources, log: what the protocol is built with.
        on_change: when the folder's saved ``config.yaml`` differs from ``config``: ``"stop"`` (raise), ``"new"``
            (move the old folder aside and start afresh; ``--new``) or ``"resume"`` (``--resume-anyway``).
        command: the command line, saved to ``command.txt`` and shown in the report.

    Returns:
        the protocol's results.

    Raises:
        ConfigError: unknown protocol, or a changed config with ``on_change="stop"`` (the differing keys).
    """
    from ..experiment import distributed as dist_utils
    from ..experiment.folder import prepare_folder
    from ..outputs.report import write_report

    protocol = protocol_of(config, sources)(config, experiment_folder, sources, log)
    protocol.preflight()  # a refused run leaves no folder behind
    protocol.preflown = True
    prepare_folder(experiment_folder, config, on_change=on_change, command=command, log=log)
    results = protocol.run()
    if dist_utils.is_main():
        write_report(experiment_folder)
    return results


__all__ = [
    "PROTOCOLS",
    "Protocol",
    "check_keys",
    "descriptions",
    "get_protocol",
    "load_config",
    "protocol_of",
    "register_protocol",
    "run_protocol",
]
