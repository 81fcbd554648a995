"""The ``{ClassName: kwargs}`` shape of every object key (``trainer: {MetricLossOnly: {batch_size: 32}}``).

Example::

    >>> one_spec({"MetricLossOnly": None}, "config_general.yaml: trainer")
    ('MetricLossOnly', {})
    >>> is_object_spec({"ContrastiveLoss": {}}), is_object_spec({"layer_sizes": [128]})
    (True, False)
    >>> pb_numbers("0.16 1"), pb_numbers("1E-5 .5"), pb_numbers("crop")
    ([0.16, 1], [1e-05, 0.5], 'crop')
"""

import difflib
import re
from typing import Any, Dict, Iterable, Optional, Tuple

from ..errors import ConfigError
from .yaml_reader import YAML_12_FLOAT

_INT = re.compile(r"^[-+]?[0-9]+$")


def is_object_spec(spec: Any) -> bool:
    """True for a one-key dict whose key starts with an upper-case letter: ``{ClassName: kwargs}``."""
    key = next(iter(spec)) if isinstance(spec, dict) and len(spec) == 1 else None
    return isinstance(key, str) and key[:1].isupper()


def one_spec(spec: Any, where: str, default: Optional[str] = None) -> Tuple[str, Dict[str, Any]]:
    """``(name, kwargs)`` of a ``{Name: kwargs}`` spec (``where``: ``"<file>: <key>"``; ``default``: the name when
    ``spec`` is None, else a missing spec is an error)."""
    if spec is None:
        if default is None:
            raise ConfigError(f"{where}: missing")
        return default, {}
    if not (isinstance(spec, dict) and len(spec) == 1 and isinstance(next(iter(spec)), str)):
        raise ConfigError(f"{where}: expected {{ClassName: {{kwargs}}}}, got {spec!r}")
    name, kwargs = next(iter(spec.items()))
    if kwargs is None:
        kwargs = {}
    if not isinstance(kwargs, dict):
        raise ConfigError(f"{where}.{name}: expected keyword arguments (a mapping), got {kwargs!r}")
    return name, kwargs


def pb_numbers(value: Any) -> Any:
    """PB's transform ranges (``"0.16 1"``) as number lists (one number alone stays a number); else ``value``."""
    parts = value.split() if isinstance(value, str) else []
    if not parts or not all(_INT.match(p) or YAML_12_FLOAT.match(p) for p in parts):
        return value
    nums = [int(p) if _INT.match(p) else float(p) for p in parts]
    return nums if len(nums) > 1 else nums[0]


def nearest(name: str, known: Iterable[str], cutoff: float = 0.5, ignore_case: bool = False) -> str:
    """``"; did you mean X?"`` for the closest known name, or ``""``."""
    fold = str.lower if ignore_case else str
    names = {fold(n): n for n in sorted(set(known), reverse=True)}  # the first in sorted order wins
    close = difflib.get_close_matches(fold(str(name)), list(names), n=1, cutoff=cutoff)
    return f"; did you mean {names[close[0]]}?" if close else ""
