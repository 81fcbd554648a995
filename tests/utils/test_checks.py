"""pml_extensions.utils.checks: YAML's true is a bool, and a bool is never taken for an integer or a number."""

import numpy as np
import pytest

from pml_extensions.utils.checks import int_at_least, is_int, is_number


@pytest.mark.parametrize(
    "value, integer, number",
    [
        (0, True, True),
        (np.int64(7), True, True),
        (np.uint8(1), True, True),
        (True, False, False),
        (np.bool_(True), False, False),
        (2.0, False, True),
        (np.float32(0.5), False, True),
        (float("nan"), False, True),
        ("3", False, False),
        (None, False, False),
        ([1], False, False),
    ],
)
def test_is_int_and_is_number(value, integer, number):
    assert is_int(value) is integer
    assert is_number(value) is number


def test_int_at_least_returns_a_python_int_and_names_the_argument():
    got = int_at_least("num_views", np.int64(3), 1)
    assert got == 3 and type(got) is int
    assert int_at_least("seed", 0, 0) == 0
    for bad in (0, -1, 1.0, True, "2", None):
        with pytest.raises(ValueError, match=rf"^num_views must be an int >= 1, got {bad!r}$".replace("(", r"\(")):
            int_at_least("num_views", bad, 1)
