"""A config's search markers at any depth (docs/search.md), a trial's values asked of Optuna (:func:`suggest`) and
written in place of the markers (:func:`fill`)."""

import copy
from typing import Any, Dict, List, Tuple

from ...utils.checks import is_number
from ..errors import ConfigError
from .loader import key_path, search_markers, split_marker


def search_space(config: Any) -> List[Tuple[Tuple, str, str, Any]]:
    """``[(path_to_marked_key, param_name, op, [low, high])]`` for every search marker in ``config``; ConfigError
    for a range that is not ``[low, high]`` numbers with ``low < high`` (positive for LOG).

    Example::

        >>> cfg = {"trunk": [{"ConvNetBody": {"blocks_per_stage~INT_BAYESIAN~": [1, 2]}}, {"Flatten": None}]}
        >>> search_space(cfg)
        [(('trunk', 0, 'ConvNetBody', 'blocks_per_stage~INT_BAYESIAN~'), 'trunk[0].ConvNetBody.blocks_per_stage', \
'INT_BAYESIAN', [1, 2])]
    """
    found = []
    for path, op, value in search_markers(config):
        where = key_path(path[:-1] + (split_marker(path[-1])[0],))
        ok = isinstance(value, list) and len(value) == 2 and all(is_number(v) for v in value)
        if not ok or value[0] >= value[1] or (op == "LOG_BAYESIAN" and value[0] <= 0):
            raise ConfigError(
                f"{where}~{op}~: expected [low, high] with low < high"
                f"{' and low > 0' if op == 'LOG_BAYESIAN' else ''}, got {value!r}"
            )
        if op == "INT_BAYESIAN" and not all(isinstance(v, int) for v in value):
            raise ConfigError(f"{where}~{op}~: expected two integers, got {value!r}")
        found.append((path, where, op, value))
    return found


def suggest(trial, space) -> Dict[str, Any]:
    """Ask ``trial`` (an ``optuna.Trial``) for one value per marker."""
    out = {}
    for _, name, op, (low, high) in space:
        if op == "INT_BAYESIAN":
            out[name] = trial.suggest_int(name, low, high)
        else:
            out[name] = trial.suggest_float(name, float(low), float(high), log=op == "LOG_BAYESIAN")
    return out


def fill(config: Dict[str, Any], space, values: Dict[str, Any]) -> Dict[str, Any]:
    """``config`` with each marked key replaced by its plain key and the trial's value (key order kept).

    Example::

        >>> cfg = {"trunk": [{"ConvNetBody": {"widths": [8], "blocks_per_stage~INT_BAYESIAN~": [1, 2]}}]}
        >>> fill(cfg, search_space(cfg), {"trunk[0].ConvNetBody.blocks_per_stage": 2})
        {'trunk': [{'ConvNetBody': {'widths': [8], 'blocks_per_stage': 2}}]}
    """
    out = copy.deepcopy(config)
    for path, name, _, _ in space:
        parent = out
        for key in path[:-1]:
            parent = parent[key]
        items = list(parent.items())
        parent.clear()
        parent.update((split_marker(k)[0], values[name]) if k == path[-1] else (k, v) for k, v in items)
    return out
