"""A config's values: the one YAML reader of configs (:func:`read_yaml`, with YAML 1.2's floats: in PyYAML's YAML 1.1,
``1e-3`` is a string) and the ``{ClassName: kwargs}`` shape of every object key.

Example::

    >>> read_yaml("{lr: 1e-3, eps: 1E-5, a: .5, b: 5., n: 10, s: 1e-3x, v: '1e-3'}")
    {'lr': 0.001, 'eps': 1e-05, 'a': 0.5, 'b': 5.0, 'n': 10, 's': '1e-3x', 'v': '1e-3'}
    >>> read_yaml("lr~LOG_BAYESIAN~: [1e-5, 1e-2]")
    {'lr~LOG_BAYESIAN~': [1e-05, 0.01]}
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

import yaml

from ..errors import ConfigError

FLOAT_TAG = "tag:yaml.org,2002:float"
#: YAML 1.2 core schema floats (a dot or an exponent: integers stay integers), infinities and NaN; PyYAML's ``_``
#: digit separators are kept
YAML_12_FLOAT = re.compile(
    r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?\.[0-9][0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""",
    re.X,
)


class ConfigLoader(yaml.SafeLoader):
    yaml_implicit_resolvers = {
        first: [(tag, rx) for tag, rx in resolvers if tag != FLOAT_TAG]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }


ConfigLoader.add_implicit_resolver(FLOAT_TAG, YAML_12_FLOAT, list("-+0123456789."))


def read_yaml(stream: Any) -> Any:
    """``yaml.safe_load(stream)`` (a string or an open file) with YAML 1.2 floats."""
    return yaml.load(stream, Loader=ConfigLoader)


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
