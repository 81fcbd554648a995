"""Atomic file writes: a temporary file in the target's folder, fsynced, ``os.replace``-d onto the target, so a reader
(or a rerun after SIGKILL) sees the old file or the complete new one, with the mode ``open(path, "w")`` would give
(``0o666`` minus the umask for a new file, the old permission bits for a replaced one).
"""

import json
import os
import secrets
import stat
from contextlib import contextmanager, suppress
from typing import Any, Iterator


def _fsync_path(path: str) -> None:
    with suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _create_temporary(folder: str, suffix: str) -> str:
    """A new empty file in ``folder`` with mode ``0o666 & ~umask`` (not ``mkstemp``'s ``0o600``); returns its path."""
    for _ in range(100):
        tmp = os.path.join(folder, f".tmp_{secrets.token_hex(8)}{suffix}")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            continue
        os.close(fd)
        return tmp
    raise FileExistsError(f"could not create a temporary file in {folder}")


@contextmanager
def atomic_path(path: str) -> Iterator[str]:
    """A temporary path next to ``path`` (same extension), fsynced and moved onto ``path`` on normal exit, removed on an
    exception."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    tmp = _create_temporary(folder, os.path.splitext(path)[1])
    with suppress(FileNotFoundError):  # as open() on an existing file: keep its permission bits
        os.chmod(tmp, stat.S_IMODE(os.stat(path).st_mode))
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
