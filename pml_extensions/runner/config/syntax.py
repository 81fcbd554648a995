"""Powerful-benchmarker's config syntax: :func:`merge` and its key markers (``~OVERRIDE~``, ``~APPLY~n``,
``~SWAP~n``, ``~DELETE~``, ``~BAYESIAN~``), as docs/configs.md describes them and where they differ from PB's.

Example::

    >>> merge({"optimizers": {"trunk_optimizer": {"RMSprop": {"lr": 1e-6}}}}, {"optimizers~APPLY~3": {"lr": 0.01}})
    {'optimizers': {'trunk_optimizer': {'RMSprop': {'lr': 0.01}}}}
"""

import copy
import re
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from ..errors import ConfigError

_MARKER = re.compile(
    r"^(?P<name>.*?)~(?P<op>OVERRIDE|DELETE|APPLY|SWAP|BAYESIAN|LOG_BAYESIAN|INT_BAYESIAN)~(?P<n>\d*)$"
)
_SEARCH_OPS = ("BAYESIAN", "LOG_BAYESIAN", "INT_BAYESIAN")


def split_marker(key: Any, where: str = "config") -> Tuple[Any, Optional[str], Optional[int]]:
    """Split ``"name~OP~n"`` into ``(name, OP, n)`` (plain keys: ``(key, None, None)``)."""
    match = _MARKER.match(key) if isinstance(key, str) else None
    if match is None:
        return key, None, None
    name, op, n = match.group("name"), match.group("op"), match.group("n")
    if op in ("APPLY", "SWAP"):
        if not n or int(n) < 1:
            raise ConfigError(f"{where}: key {key!r}: ~{op}~ needs a depth >= 1, e.g. {name}~{op}~1")
        return name, op, int(n)
    if n:
        raise ConfigError(f"{where}: key {key!r}: ~{op}~ takes no depth number")
    return name, op, None


def _join(where: str, key: Any) -> str:
    return f"{where}.{key}" if where else str(key)


def _drop_variants(out: Dict, name: Any, keep_plain: bool = False) -> None:
    """A plain key replaces its ``~BAYESIAN~``-family twin and vice versa."""
    for key in ([] if keep_plain else [name]) + [f"{name}~{op}~" for op in _SEARCH_OPS]:
        out.pop(key, None)


def _template(old: Any, value: Any, where: str) -> Any:
    """The value of ``key~OVERRIDE~: value``: markers inside ``value`` act on the old value at the same place."""
    if not isinstance(value, dict):
        return copy.deepcopy(value)
    old = old if isinstance(old, dict) else {}
    out: Dict = {}
    for key, v in value.items():
        name, op, _ = split_marker(key, where)
        if op in ("APPLY", "SWAP"):
            out.update(merge({name: old[name]} if name in old else {}, {key: v}, where))
        elif (op is None and not isinstance(v, dict)) or op in _SEARCH_OPS:
            out[key] = copy.deepcopy(v)
        elif op != "DELETE":  # plain or nested OVERRIDE: replace, resolving markers inside against the old value
            out[name] = _template(old.get(name), v, _join(where, key))
    return out


def merge(base: Dict, update: Dict, where: str = "") -> Dict:
    """Return ``base`` with ``update`` merged in (neither input is modified); every marker works at every depth and
    inside every other marker's value.

    Args:
        base: the config so far (plain keys only).
        update: a dict that may use the key markers.
        where: prefix of error messages: the file name, then the key path.

    Raises:
        ConfigError: on ``~APPLY~``/``~SWAP~`` whose target is missing or not a dict, a ``~SWAP~`` mapping
        that names a missing key or is ambiguous, or a non-dict ``update``.

    Example::

        >>> merge({"tester": {"T": {"accuracy_calculator": {"AccuracyCalculator": {"k": 5}}}}},
        ...       {"tester~APPLY~2": {"accuracy_calculator~OVERRIDE~": {"ChunkedAccuracyCalculator": None}}})
        {'tester': {'T': {'accuracy_calculator': {'ChunkedAccuracyCalculator': None}}}}
    """
    if not isinstance(update, dict):
        raise ConfigError(f"{where or 'config'}: expected a mapping, got {type(update).__name__}")
    out = copy.deepcopy(base) if isinstance(base, dict) else {}
    for key, value in update.items():
        name, op, depth = split_marker(key, where or "config")
        here = _join(where, key)
        if op == "DELETE":
            _drop_variants(out, name)
        elif op == "OVERRIDE":
            old = out.get(name)
            _drop_variants(out, name, keep_plain=True)
            out[name] = _template(old, value, here)
        elif op in ("APPLY", "SWAP"):
            if not isinstance(value, dict):
                raise ConfigError(f"{here}: ~{op}~ needs a mapping value, got {type(value).__name__}")
            if name not in out or not isinstance(out[name], dict):
                raise ConfigError(f"{here}: ~{op}~ target {name!r} does not exist or is not a mapping")
            out[name] = (_apply if op == "APPLY" else _swap)(out[name], value, depth, here)
        elif op in _SEARCH_OPS:
            _drop_variants(out, name)
            out[key] = copy.deepcopy(value)  # kept with its marker for the search (runner.protocols.search)
        elif name in out and isinstance(out[name], dict) and isinstance(value, dict):
            out[name] = merge(out[name], value, here)
        else:
            _drop_variants(out, name, keep_plain=True)
            out[name] = merge({}, value, here) if isinstance(value, dict) else copy.deepcopy(value)
    return out


def _apply(target: Dict, value: Dict, depth: int, where: str) -> Dict:
    """Merge ``value`` into every dict at ``depth`` (``target`` is depth 1); a non-dict there is replaced, as in PB."""
    if depth == 1:
        return merge(target, value, where)  # a non-dict target merges as {}
    return {
        k: _apply(v, value, depth - 1, _join(where, k)) if isinstance(v, dict) or depth == 2 else v
        for k, v in target.items()
    }


def _swap(target: Dict, mapping: Dict, depth: int, where: str) -> Dict:
    if depth > 1:
        return {
            k: (_swap(v, mapping, depth - 1, _join(where, k)) if isinstance(v, dict) else v) for k, v in target.items()
        }
    renames = {}
    for old, new in mapping.items():
        if new is None or new == {}:
            if old in target:
                continue  # already that class
            if len(target) != 1:
                raise ConfigError(
                    f"{where}: ~SWAP~ to {old!r} needs exactly one key at that depth, found {list(target)}; "
                    f"use {{old_name: {old}}}"
                )
            renames[next(iter(target))] = old
        elif old in target:
            renames[old] = new
        else:
            raise ConfigError(f"{where}: ~SWAP~ {old!r} -> {new!r}: no key {old!r} here (keys: {list(target)})")
    return {renames.get(k, k): v for k, v in target.items()}


def key_path(path: Sequence[Any]) -> str:
    """``("trunk", 0, "ConvNetBody")`` -> ``"trunk[0].ConvNetBody"``."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def search_markers(config: Any, path: Tuple = ()) -> Iterator[Tuple[Tuple, str, Any]]:
    """``(path, op, value)`` of every ``~BAYESIAN~``-family key of ``config``, at any depth, list items included."""
    if isinstance(config, dict):
        for key, value in config.items():
            op = split_marker(key)[1]
            if op in _SEARCH_OPS:
                yield path + (key,), op, value
            else:
                yield from search_markers(value, path + (key,))
    elif isinstance(config, list):
        for i, value in enumerate(config):
            yield from search_markers(value, path + (i,))


def find_search_markers(config: Any) -> List[str]:
    """Key paths that carry a ``~BAYESIAN~``-family marker."""
    return [key_path(path) for path, _, _ in search_markers(config)]
