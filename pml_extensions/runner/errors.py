"""The runner's exceptions: :class:`ConfigError` (one line; the command line exits with 2, 1 for an
:class:`OutputError`) and :class:`Interrupted`, raised by SIGINT/SIGTERM outside a :func:`critical` section."""

import contextlib
import errno
import signal
import threading
from typing import Iterator, List, Optional, Sequence


class ConfigError(ValueError):
    """A config problem: a ``ValueError`` whose one-line message starts with the file (or ``command line``) and names
    the key, e.g. ``configs/x/config_models/default.yaml: models.trunk: unknown class 'bninception'``."""


def first_line(error: BaseException) -> str:
    """The first line of ``error``'s message, else its class name."""
    return str(error).splitlines()[0] if str(error) else type(error).__name__


class DataFileError(ConfigError):
    """The dataset's own image files are bad (undecodable, missing): a config refusal lists them too."""


class ConfigProblems(ConfigError):
    """Every problem of one pass (:class:`Problems`), one line each; ``data_files``: those of a DataFileError."""

    def __init__(self, problems: List[str], data_files: Sequence[str] = ()):
        self.problems = list(problems)
        self.data_files = [line for line in data_files if line in self.problems]
        numbered = "".join(f"\n  {i}. {line}" for i, line in enumerate(self.problems, 1))
        many = f"{len(self.problems)} problems, nothing was run:{numbered}"
        super().__init__(self.problems[0] if len(self.problems) == 1 else many)


class Problems:
    """Collect the problems of independent checks to report them together."""

    def __init__(self):
        self.found: List[str] = []
        self.data_files: List[str] = []

    @contextlib.contextmanager
    def check(self) -> Iterator[None]:
        """Run the block, recording a :class:`ConfigError` it raises."""
        try:
            yield
        except ConfigProblems as e:
            found, data_files = e.problems, e.data_files
        except ConfigError as e:
            found = [first_line(e)]
            data_files = found if isinstance(e, DataFileError) else []
        else:
            return
        self.found += [line for line in found if line not in self.found]  # two checks may find the same problem
        self.data_files += [line for line in data_files if line not in self.data_files]

    def raise_any(self) -> None:
        """Raise :class:`ConfigProblems` when any check failed."""
        if self.found:
            raise ConfigProblems(self.found, self.data_files)


class MissingDataError(ConfigError, FileNotFoundError):
    """Data a config names (a dataset, model weights) is not on this machine; the message says how to get it."""


#: errno values that mean "this place cannot take the file" (a read-only, foreign or full folder), not a bug
OUTPUT_ERRNOS = (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.ENOTDIR, errno.EISDIR)


class OutputError(ConfigError, OSError):
    """A run's file cannot be written (read-only or full folder) or read back; the message says what to do."""

    @classmethod
    def writing(cls, path: str, error: BaseException, where: str = "--root_experiment_folder") -> "OutputError":
        """The error for ``path`` not written because of ``error`` (``where``: the option that chose the folder)."""
        text = first_line(error)
        code = getattr(error, "errno", None)
        if code in (errno.ENOSPC, errno.EDQUOT) or "No space left" in text or "disk is full" in text:
            advice = "the disk is full: free space, then rerun the same command to resume from the last checkpoint"
        else:
            advice = f"choose a writable {where} or fix its permissions, then rerun"
        return cls(f"{path}: cannot write ({getattr(error, 'strerror', None) or text}); {advice}")


class Interrupted(KeyboardInterrupt):
    """A run stopped by ``signal_number`` (SIGINT, SIGTERM); the command line exits with ``128 + signal_number``."""

    def __init__(self, signal_number: int = signal.SIGINT):
        super().__init__(int(signal_number))
        self.signal_number = int(signal_number)


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


@contextlib.contextmanager
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


@contextlib.contextmanager
def raise_on_signals(signals: Sequence[int] = (signal.SIGINT, signal.SIGTERM)) -> Iterator[None]:
    """Raise :class:`Interrupted` for ``signals`` while the block runs (main thread only); resets :func:`position`."""
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
