"""The ``{ClassName: kwargs}`` shape of every object key, and its one parser.

powerful-benchmarker writes each object as ``trainer: {MetricLossOnly: {batch_size: 32}}`` (``{ClassName: null}``:
no arguments); :func:`one_spec` is the one place that takes such a spec apart.

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
    return (
        isinstance(spec, dict)
        and len(spec) == 1
        and isinstance(next(iter(spec)), str)
        and next(iter(spec))[:1].isupper()
    )


def one_spec(spec: Any, where: str, default: Optional[str] = None) -> Tuple[str, Dict[str, Any]]:
    """``(name, kwargs)`` of a ``{Name: kwargs}`` spec (``kwargs`` ``None`` -> ``{}``).

    Args:
        spec: the value of the key.
        where: ``"<file>: <key>"`` for error messages.
        default: class name used when ``spec`` is None (None: a missing spec is an error).

    Raises:
        ConfigError: ``"<where>: missing"``, ``"<where>: expected {ClassName: {kwargs}}, got ..."`` or
        ``"<where>.<Name>: expected keyword arguments (a mapping), got ..."``.
    """
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
    """powerful-benchmarker writes transform ranges as ``"0.16 1"``: such strings become number lists (one
    number alone stays a number); anything else is returned as it is."""
    if isinstance(value, str):
        parts = value.split()
        if not parts or not all(_INT.match(p) or YAML_12_FLOAT.match(p) for p in parts):
            return value
        nums = [int(p) if _INT.match(p) else float(p) for p in parts]
        return nums if len(nums) > 1 else nums[0]
    return value


def nearest(name: str, known: Iterable[str], cutoff: float = 0.5, ignore_case: bool = False) -> str:
    """``"; did you mean X?"`` for the closest known name (``difflib``; ``cutoff=0`` always names one;
    ``ignore_case``: ``Resnet50`` finds ``resnet50``), or ``""``."""
    fold = str.lower if ignore_case else str
    names: Dict[str, str] = {}
    for n in sorted(set(known)):
        names.setdefault(fold(n), n)
    close = difflib.get_close_matches(fold(str(name)), list(names), n=1, cutoff=cutoff)
    return f"; did you mean {names[close[0]]}?" if close else ""
