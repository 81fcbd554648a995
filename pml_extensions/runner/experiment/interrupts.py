"""Stopping a run cleanly: inside :func:`raise_on_signals` (the command line's), SIGINT and SIGTERM raise
:class:`pml_extensions.runner.errors.Interrupted`, but never inside a :func:`critical` section (a checkpoint commit:
raised at its end); :func:`at` records the stage and epoch that :func:`position` reports. Code below the command line
never catches ``KeyboardInterrupt``.
"""

import signal
import threading
from contextlib import contextmanager
from typing import Iterator, Optional, Sequence

from ..errors import Interrupted

_STATE = {"depth": 0, "pending": None, "stage": None, "epoch": None}


def at(stage: Optional[str], epoch: Optional[int] = None) -> None:
    """Record that ``stage`` (e.g. ``"fold 1"``) is at ``epoch`` (``None``: not in an epoch)."""
    _STATE["stage"], _STATE["epoch"] = stage, epoch


def position() -> str:
    """``"fold 1, epoch 3"``, ``"fold 1"`` or ``"the start"`` (nothing trained in this call yet)."""
    stage, epoch = _STATE["stage"], _STATE["epoch"]
    if stage is None:
        return "the start"
    stage = str(stage).strip("[]")
    return f"{stage}, epoch {epoch}" if epoch is not None else stage


def _handler(signum, frame):
    if _STATE["depth"] > 0:
        _STATE["pending"] = signum  # raised when the critical section ends
        return
    raise Interrupted(signum)


@contextmanager
def critical() -> Iterator[None]:
    """A section a signal does not cut short: an ``Interrupted`` that arrives inside is raised at its end."""
    _STATE["depth"] += 1
    try:
        yield
    finally:
        _STATE["depth"] -= 1
        if _STATE["depth"] == 0 and _STATE["pending"] is not None:
            signum, _STATE["pending"] = _STATE["pending"], None
            raise Interrupted(signum)


@contextmanager
def raise_on_signals(signals: Sequence[int] = (signal.SIGINT, signal.SIGTERM)) -> Iterator[None]:
    """Raise :class:`~pml_extensions.runner.errors.Interrupted` for ``signals`` while the block runs (main thread
    only; elsewhere the block runs with the handlers as they are). Resets :func:`position`."""
    at(None)
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, _handler) for s in signals}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        _STATE["pending"] = None
