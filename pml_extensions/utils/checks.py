"""Type checks for arguments and config values: YAML reads ``true`` as a ``bool``, a subclass of ``int``; these say
"an integer" or "a number" and mean it, so ``true`` is never taken for 1.
"""

import numbers
from typing import Any


def is_int(value: Any) -> bool:
    """Whether ``value`` is an integer (Python or NumPy), not a ``bool``."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """Whether ``value`` is a real number (Python or NumPy), not a ``bool``."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def int_at_least(name: str, value: Any, low: int) -> int:
    """``value`` as an ``int`` when it is an integer ``>= low``, else ValueError ``<name> must be an int >= <low>, got
    <value>`` (a ``bool`` included)."""
    if not is_int(value) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    return int(value)
