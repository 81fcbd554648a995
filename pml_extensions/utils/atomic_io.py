"""Atomic file writes: write a temporary file in the target's folder, fsync it, ``os.replace`` it onto the target.

A reader (or a rerun after SIGKILL) sees either the old file or the complete new one, never a partial file. One
implementation for every checkpoint, log, table, plot and tensor file the package writes.
"""

import json
import os
import tempfile
from contextlib import contextmanager
from typing import Any, Iterator


def _fsync_path(path: str, flags: int = os.O_RDONLY) -> None:
    try:
        fd = os.open(path, flags)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextmanager
def atomic_path(path: str) -> Iterator[str]:
    """Yield a temporary path next to ``path`` (same extension); on normal exit it is fsynced and moved onto
    ``path`` (and the folder fsynced); on an exception it is removed and ``path`` is left as it was."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp_", suffix=os.path.splitext(path)[1])
    os.close(fd)
    try:
        yield tmp
        _fsync_path(tmp)
        os.replace(tmp, path)
        _fsync_path(folder)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def atomic_write_text(path: str, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    with atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)


def atomic_write_json(path: str, obj: Any, **dump_kwargs) -> None:
    """``json.dump(obj)`` to ``path`` atomically (``indent=2`` unless given)."""
    dump_kwargs.setdefault("indent", 2)
    atomic_write_text(path, json.dumps(obj, **dump_kwargs))


def atomic_torch_save(obj: Any, path: str) -> None:
    """``torch.save`` to ``path`` atomically."""
    import torch

    with atomic_path(path) as tmp:
        torch.save(obj, tmp)


def atomic_savefig(fig, path: str, **savefig_kwargs) -> None:
    """``fig.savefig`` (matplotlib) to ``path`` atomically; the format follows ``path``'s extension."""
    with atomic_path(path) as tmp:
        fig.savefig(tmp, **savefig_kwargs)
