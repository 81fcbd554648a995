"""Type checks for arguments and config values: YAML reads ``true`` as a ``bool``, a subclass of ``int``; these say
"an integer" or "a number" and mean it, so ``true`` is never taken for 1.
"""

import numbers
from typing import Any


def is_int(value: Any) -> bool:
    """Whether ``value`` is an integer (Python or NumPy), not a ``bool``.

    Example:
        >>> import numpy as np
        >>> is_int(3), is_int(np.int64(3)), is_int(True), is_int(3.0)
        (True, True, False, False)
    """
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """Whether ``value`` is a real number (Python or NumPy), not a ``bool``.

    Example:
        >>> is_number(0.5), is_number(2), is_number(False), is_number("1")
        (True, True, False, False)
    """
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def int_at_least(name: str, value: Any, low: int) -> int:
    """``value`` as an ``int`` when it is an integer ``>= low``.

    Raises:
        ValueError: ``<name> must be an int >= <low>, got <value>`` for anything else (a ``bool`` included).

    Example:
        >>> int_at_least("num_views", 2, 1)
        2
        >>> int_at_least("seed", True, 0)
        Traceback (most recent call last):
        ...
        ValueError: seed must be an int >= 0, got True
    """
    if not is_int(value) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    return int(value)
