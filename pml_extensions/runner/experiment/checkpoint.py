"""Atomic checkpoints and record-keeper logs that survive SIGKILL: :meth:`Checkpointer.commit` writes the buffered
log rows, then the checkpoint; :meth:`Checkpointer.resume` deletes every log row newer than it (docs/runner.md)."""

import csv
import os
import pickle
import random
import shutil
import sqlite3
from typing import Any, Callable, Dict, Optional

import numpy as np
import torch
from record_keeper import RecordKeeper, RecordWriter
from record_keeper import utils as rk_utils

from ...utils.atomic_io import atomic_path, atomic_write_text  # noqa: F401 (atomic_write_text re-exported)
from ...utils.checks import is_number
from ..errors import OutputError, critical, first_line
from .distributed import unwrap

ITERATION_COLUMN = "~iteration~"
#: what ``torch.load`` raises for a truncated or corrupt file
READ_ERRORS = (RuntimeError, EOFError, ValueError, pickle.UnpicklingError, OSError)


def first_sentence(error: BaseException) -> str:
    """The first sentence of an error (torch's unreadable-file errors run on for several)."""
    return first_line(error).split(". ")[0].rstrip(".")


def save_keeping_previous(state: Any, path: str, previous: str) -> None:
    """``torch.save(state)`` to ``path`` atomically, the file it replaces becoming ``previous`` (a killed save leaves
    two complete checkpoints: the new file is fsynced before the old one is linked aside)."""
    link = previous + ".tmp"
    if os.path.exists(link):
        os.remove(link)
    try:
        with atomic_path(path) as tmp:
            torch.save(state, tmp)
            if os.path.exists(path):  # the last checkpoint, kept aside as a hard link (else a copy) until then
                try:
                    os.link(path, link)
                except OSError:
                    shutil.copyfile(path, link)
        if os.path.exists(link):
            os.replace(link, previous)
    finally:
        if os.path.exists(link):
            os.remove(link)


def load_weights(path: str, map_location: Any = "cpu") -> Any:
    """``torch.load(path, weights_only=True)``; ``FileNotFoundError``, or :class:`OutputError` for a corrupt file."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such file")
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except READ_ERRORS as e:
        raise OutputError(
            f"{path}: truncated or corrupt ({first_sentence(e)}); remove {os.path.dirname(path) or '.'} and rerun "
            "the same command to train that stage again"
        ) from None


def load_weights_into(models: Dict[str, torch.nn.Module], path: str, map_location: Any = "cpu") -> None:
    """:func:`load_weights` of ``path`` into each of ``models`` the file has a state dict for (by name)."""
    state = load_weights(path, map_location)
    for name, module in models.items():
        if name in state:
            module.load_state_dict(state[name])


def rng_state() -> Dict[str, Any]:
    """The global torch / numpy / python RNG states in a ``weights_only``-loadable form."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "numpy": {
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "gauss": float(gauss),
        },
        "python": random.getstate(),
    }


def set_rng_state(state: Dict[str, Any]) -> None:
    """Restore what :func:`rng_state` returned."""
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state(("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))


def _attributes(modules: Dict[str, torch.nn.Module], generators: bool = False):
    """``(dotted path, submodule, attribute)`` of each PML ``_record_these`` (or CPU ``torch.Generator``) attribute."""
    for key, module in modules.items():
        for path, m in unwrap(module).named_modules():
            if generators:
                names = [a for a, v in vars(m).items() if isinstance(v, torch.Generator) and v.device.type == "cpu"]
            else:
                names = getattr(m, "_record_these", ()) or ()
            for attr in names:
                yield (f"{key}.{path}.{attr}" if path else f"{key}.{attr}"), m, attr


def module_generators(modules: Dict[str, torch.nn.Module]) -> Dict[str, torch.Generator]:
    """The CPU ``torch.Generator`` attributes of the modules and submodules (``XMLWrapper.generator``) by path."""
    return {name: getattr(m, attr) for name, m, attr in _attributes(modules, generators=True)}


def _module_records(modules: Dict[str, torch.nn.Module]) -> Dict[str, Any]:
    """The numeric recordable attributes (``XMLWrapper.num_skipped_xml``): counters a resume continues."""
    out = {}
    for name, m, attr in _attributes(modules):
        value = getattr(m, attr, None)
        if is_number(value):
            out[name] = value
        elif torch.is_tensor(value) and value.numel() == 1:
            out[name] = value.detach().cpu().clone()
    return out


def training_state(
    epoch: int,
    global_iteration: int,
    models: Dict[str, torch.nn.Module],
    optimizers: Optional[Dict[str, Any]] = None,
    loss_funcs: Optional[Dict[str, torch.nn.Module]] = None,
    **extra: Any,
) -> Dict[str, Any]:
    """Everything a resumed epoch needs, ``weights_only``-loadable: state dicts, RNG states (the losses' own
    generators too), the losses' recordable counters and ``extra``."""
    loss_funcs = loss_funcs or {}
    return {
        "epoch": int(epoch),
        "global_iteration": int(global_iteration),
        "models": {k: unwrap(m).state_dict() for k, m in models.items()},
        "optimizers": {k: o.state_dict() for k, o in (optimizers or {}).items()},
        "loss_funcs": {k: unwrap(l).state_dict() for k, l in loss_funcs.items()},
        "rng": rng_state(),
        "generators": {k: g.get_state() for k, g in module_generators(loss_funcs).items()},
        "records": _module_records(loss_funcs),
        **extra,
    }


def restore_training_state(
    state: Dict[str, Any],
    models: Dict[str, torch.nn.Module],
    optimizers: Optional[Dict[str, Any]] = None,
    loss_funcs: Optional[Dict[str, torch.nn.Module]] = None,
) -> Dict[str, Any]:
    """Load what :func:`training_state` saved into the objects and restore the RNGs; returns ``state``."""
    loss_funcs = loss_funcs or {}
    for k, m in models.items():
        unwrap(m).load_state_dict(state["models"][k])
    for k, o in (optimizers or {}).items():
        o.load_state_dict(state["optimizers"][k])
    for k, l in loss_funcs.items():
        unwrap(l).load_state_dict(state["loss_funcs"][k])
    set_rng_state(state["rng"])
    saved = state.get("generators", {})
    for k, g in module_generators(loss_funcs).items():
        if k in saved:
            g.set_state(saved[k])
    records = state.get("records", {})
    for name, m, attr in _attributes(loss_funcs):
        if name in records:
            setattr(m, attr, records[name])
    return state


class _AtomicRecordWriter(RecordWriter):
    """record-keeper's writer, each table's CSV rewritten atomically from SQLite (record-keeper appends to it, which a
    kill can split)."""

    def save_records(self):
        for table, series in self.records.items():
            if len(series) == 0:
                continue
            columns = rk_utils.separate_iterations_from_series(series)
            if not self.save_lists:
                self.remove_lists(columns)
            self.local_db.write(table, columns)
            self.rewrite_csv(table)
        self.records = self.get_empty_nested_dict()

    def tables(self):
        if not os.path.exists(self.local_db.db_path):
            return []
        rows = self.local_db.query("SELECT name FROM sqlite_master WHERE type='table' AND name != 'sqlite_sequence'")
        return [r["name"] for r in rows]

    def rows(self, table: str):
        return self.local_db.query(f"SELECT * FROM [{table}] ORDER BY id")

    def rewrite_csv(self, table: str):
        rows = self.rows(table)
        path = os.path.join(self.folder, f"{table}.csv")
        if not rows:
            if os.path.exists(path):
                os.remove(path)
            return
        names = [k for k in rows[0].keys() if k != "id"]
        with atomic_path(path) as tmp, open(tmp, "w", newline="", encoding="utf-8") as f:
            csv.writer(f).writerows([names] + [[r[k] for k in names] for r in rows])

    def truncate(self, thresholds: Dict[str, float], default: float):
        for table in self.tables():
            limit = thresholds.get(table, default)
            try:
                self.local_db.execute(f"DELETE FROM [{table}] WHERE [{ITERATION_COLUMN}] > ?", (limit,))
            except sqlite3.OperationalError:
                continue
            self.rewrite_csv(table)


class Checkpointer:
    """Atomic checkpoint file plus record-keeper logs kept consistent with it.

    Args:
        folder: where ``checkpoint.pth`` (``path``), ``checkpoint.prev.pth`` (``previous_path``) and ``logs/``
            (``logs.db``, one CSV per table) live.
        epoch_tables: tables whose ``~iteration~`` column holds the epoch (the others: the global iteration).
        save_lists, tensorboard_writer: record-keeper's; its ``record_keeper`` keeps rows until :meth:`commit`.
    """

    def __init__(self, folder: str, epoch_tables=(), save_lists: bool = False, tensorboard_writer=None):
        self.folder = folder
        os.makedirs(folder, exist_ok=True)
        self.path = os.path.join(folder, "checkpoint.pth")
        self.previous_path = os.path.join(folder, "checkpoint.prev.pth")
        self.damaged = None  # a checkpoint load_state found unreadable: set aside by resume
        self.epoch_tables = set(epoch_tables)
        self.writer = _AtomicRecordWriter(os.path.join(folder, "logs"), save_lists=save_lists)
        self.record_keeper = RecordKeeper(tensorboard_writer, self.writer, attributes_to_search_for=["_record_these"])

    def commit(self, state: Dict[str, Any]) -> None:
        """Write the buffered log rows, then ``state`` (int ``epoch`` and ``global_iteration``, else ``ValueError``); a
        SIGINT / SIGTERM meanwhile is raised when both are written. :class:`OutputError`: an unwritable folder."""
        for key in ("epoch", "global_iteration"):
            if not isinstance(state.get(key), int):
                raise ValueError(f"state[{key!r}] must be an int, got {state.get(key)!r}")
        with critical():
            try:
                self.writer.save_records()
            except (OSError, sqlite3.Error) as e:
                raise OutputError.writing(os.path.join(self.folder, "logs"), e) from None
            try:
                save_keeping_previous(state, self.path, self.previous_path)
            except (OSError, RuntimeError) as e:  # torch.save reports a failed write as a RuntimeError
                raise OutputError.writing(self.path, e) from None

    def resume(self, map_location: Any = "cpu") -> Optional[Dict[str, Any]]:
        """:meth:`load_state`, the log rows written after it dropped (all of them without a checkpoint)."""
        self.writer.records = self.writer.get_empty_nested_dict()
        state = self.load_state(map_location)
        if self.damaged:  # set aside, so the next commit keeps the good one as the previous
            os.replace(self.damaged, self.damaged + ".damaged")
            self.damaged = None
        if state is None:
            self.writer.truncate({}, default=float("-inf"))
        else:
            self.writer.truncate({t: state["epoch"] for t in self.epoch_tables}, default=state["global_iteration"])
        return state

    def load_state(self, map_location: Any = "cpu", log: Optional[Callable[..., None]] = print) -> Optional[Dict]:
        """The last checkpoint or ``None``, logs left alone (torchrun's other ranks); a damaged one falls back to
        ``checkpoint.prev.pth`` (a note to ``log``); :class:`OutputError` when neither can be read."""
        problems = []
        for path in [p for p in (self.path, self.previous_path) if os.path.exists(p)]:
            try:
                state = torch.load(path, map_location=map_location, weights_only=True)
            except READ_ERRORS as e:
                problems.append((path, first_sentence(e)))
                continue
            if not (isinstance(state, dict) and isinstance(state.get("epoch"), int)):
                problems.append((path, "not a checkpoint of this runner"))
                continue
            if problems and log is not None:
                log(
                    f"note: {problems[0][0]} is unreadable ({problems[0][1]}); resuming from the checkpoint before "
                    f"it, {path} (epoch {state['epoch']})"
                )
            self.damaged = problems[0][0] if problems else None
            return state
        if not problems:  # no checkpoint yet
            return None
        files = " and ".join(p for p, _ in problems)
        raise OutputError(
            f"{files}: truncated or corrupt ({problems[0][1]}); remove {'them' if len(problems) > 1 else 'it'} to "
            f"start {os.path.basename(os.path.normpath(self.folder))} again from its first epoch"
        )

    def rows(self, table: str):
        """All committed rows of ``table`` as dicts (``[]`` when it does not exist)."""
        return [dict(r) for r in self.writer.rows(table)] if table in self.writer.tables() else []
