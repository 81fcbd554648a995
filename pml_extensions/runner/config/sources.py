"""Where each value of a merged config came from: the command line, a user's file or a shipped file.

Example::

    >>> s = Sources({"trainer": "command line"})
    >>> s.add_layer("general.yaml", {"trainer": {"T": {"batch_size": 32, "iterations_per_epoch": 100}}})
    >>> s.add_layer("command line", {"trainer": {"T": {"batch_size": 64, "iterations_per_epoch": 100}}})
    >>> s.of("trainer.T.batch_size"), s.of(("trainer", "T", "iterations_per_epoch")), s.of("seed")
    ('command line', 'general.yaml', 'config')
    >>> describe("command line"), describe("configs/contrastive/config_general/quick.yaml")
    ('the command line', 'the shipped configs/contrastive/config_general/quick.yaml')
"""

import copy
import os
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from .syntax import split_marker

_MISSING = object()
COMMAND_LINE = "command line"


def _value(config: Any, path: Sequence[Any]) -> Any:
    for key in path:
        if isinstance(config, dict) and key in config:
            config = config[key]
        elif isinstance(config, list) and isinstance(key, int) and -len(config) <= key < len(config):
            config = config[key]
        else:
            return _MISSING
    return config


class Sources(dict):
    """top-level key -> the file (or ``"command line"``) that set it last, plus the config after each file
    (:meth:`add_layer`) to name the source of a nested value (:meth:`of`)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        #: (name, config after it, the paths it replaced whole with ``~OVERRIDE~``: every value below one is its own)
        self.layers: List[Tuple[str, Dict[str, Any], List[Tuple[Any, ...]]]] = []

    def add_layer(self, name: str, config: Dict[str, Any], update: Optional[Dict[str, Any]] = None) -> None:
        """Record the config after ``name``; ``update`` (what it merged) tells which subtrees it replaced whole
        (``~OVERRIDE~``), so that a value it gave again, equal to the old one, is still its own."""
        self.layers.append((name, copy.deepcopy(config), _overridden(update or {})))

    def of(self, path: Union[str, Sequence[Any]]) -> str:
        """The source that last changed the value at ``path`` (dotted or a sequence of keys), else its top key's."""
        keys = tuple(path.split(".")) if isinstance(path, str) else tuple(path)
        found, previous = None, _MISSING
        for name, config, overridden in self.layers:
            value = _value(config, keys)
            replaced = any(keys[: len(p)] == p for p in overridden)
            if value is not _MISSING and (previous is _MISSING or value != previous or replaced):
                found = name
            elif value is _MISSING and previous is not _MISSING:
                found = None  # deleted (~DELETE~ / ~OVERRIDE~): a later layer may set it again
            previous = value
        return found or self.get(keys[0] if keys else "", "config")


def _overridden(update: Any, prefix: Tuple[Any, ...] = ()) -> List[Tuple[Any, ...]]:
    """The paths of ``update`` marked ``~OVERRIDE~``, at any depth."""
    out: List[Tuple[Any, ...]] = []
    if isinstance(update, dict):
        for key, value in update.items():
            name, op, _ = split_marker(key)
            out += [prefix + (name,)] if op == "OVERRIDE" else _overridden(value, prefix + (name,))
    return out


def source_of(sources: Optional[Dict[str, str]], path: Union[str, Sequence[Any]]) -> str:
    """:meth:`Sources.of`, also for a plain dict (top-level keys only) or None."""
    return (sources if isinstance(sources, Sources) else Sources(sources or {})).of(path)


#: the shipped configs (``pml_extensions/configs``), whose files messages show as ``configs/<name>/...``
SHIPPED = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "configs")


def describe(source: str) -> str:
    """``"the command line"``, ``"the shipped configs/x/..."`` or ``"your <file>"``: whom a message asks to edit."""
    if source == COMMAND_LINE:
        return "the command line"
    if source == "config" or not source:
        return "the config"
    path = source if os.path.isabs(source) else os.path.join(os.path.dirname(SHIPPED), source)
    shipped = os.path.abspath(path).startswith(SHIPPED + os.sep) and os.path.exists(path)
    return f"the shipped {source}" if shipped else f"your {source}"


def merged_next_to(new: str, new_source: str, old: str, old_sources: Iterable[str], key: str) -> str:
    """The refusal of a plain merge that kept two objects where one belongs."""
    flag = f"--{key}~OVERRIDE~" if new_source == COMMAND_LINE else f"{key}~OVERRIDE~:"
    return (
        f"{new} ({describe(new_source)}) was merged next to {old} "
        f"({', '.join(describe(s) for s in sorted(set(old_sources)))}); a merge keeps both, write {flag} to replace it"
    )
