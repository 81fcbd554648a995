"""Atomic checkpoints and record-keeper logs that survive SIGKILL.

Contract (used by every protocol in :mod:`pml_extensions.runner.protocols`): log rows are buffered in memory during
an epoch; at the end of the epoch :meth:`Checkpointer.commit` first writes the rows to record-keeper's SQLite database
(one transaction per table) and rewrites each table's CSV from the database (tmp file + ``os.replace``), then
writes the checkpoint (tmp file + fsync + ``os.replace``). On restart :meth:`Checkpointer.resume` loads the
checkpoint with ``torch.load(weights_only=True)`` and deletes every log row newer than it, so rows of an epoch
that was killed after its logs but before its checkpoint are not duplicated when the epoch is rerun, and rows
of a killed epoch that
never reached the database are simply written by the rerun: no row is lost, none is duplicated.
"""

import csv
import os
import sqlite3
from typing import Any, Dict, Optional

import numpy as np
import torch
from record_keeper import RecordKeeper, RecordWriter
from record_keeper import utils as rk_utils

from ...utils.atomic_io import atomic_path, atomic_torch_save, atomic_write_text  # noqa: F401 (re-exported)

ITERATION_COLUMN = "~iteration~"


def load_weights(path: str, map_location: Any = "cpu") -> Any:
    """``torch.load(path, weights_only=True)``: tensors, dicts, lists, tuples and numbers only."""
    return torch.load(path, map_location=map_location, weights_only=True)


def rng_state() -> Dict[str, Any]:
    """The global torch / numpy / python RNG states in a ``weights_only``-loadable form."""
    import random

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
    """Restore what :func:`rng_state` returned (the runner's resume step; documented runner behaviour)."""
    import random

    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state(("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))


def module_generators(modules: Dict[str, torch.nn.Module]) -> Dict[str, torch.Generator]:
    """The CPU ``torch.Generator`` attributes of the modules and their submodules (e.g. ``XMLWrapper.generator``),
    by dotted path, so a checkpoint also restores the losses' own random streams (read only)."""
    from .distributed import unwrap

    out = {}
    for key, module in modules.items():
        for path, m in unwrap(module).named_modules():
            for attr, value in vars(m).items():
                if isinstance(value, torch.Generator) and value.device.type == "cpu":
                    out[f"{key}.{path}.{attr}" if path else f"{key}.{attr}"] = value
    return out


def module_records(modules: Dict[str, torch.nn.Module]) -> Dict[str, Any]:
    """The numeric recordable attributes (PML's ``_record_these``, e.g. ``XMLWrapper.num_skipped_xml``) of the
    modules and their submodules, by dotted path: counters a resumed run must continue, not restart."""
    from .distributed import unwrap

    out = {}
    for key, module in modules.items():
        for path, m in unwrap(module).named_modules():
            for attr in getattr(m, "_record_these", ()) or ():
                value = getattr(m, attr, None)
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    out[f"{key}.{path}.{attr}" if path else f"{key}.{attr}"] = value
                elif torch.is_tensor(value) and value.numel() == 1:
                    out[f"{key}.{path}.{attr}" if path else f"{key}.{attr}"] = value.detach().cpu().clone()
    return out


def _restore_records(modules: Dict[str, torch.nn.Module], saved: Dict[str, Any]) -> None:
    from .distributed import unwrap

    for key, module in modules.items():
        for path, m in unwrap(module).named_modules():
            for attr in getattr(m, "_record_these", ()) or ():
                name = f"{key}.{path}.{attr}" if path else f"{key}.{attr}"
                if name in saved:
                    setattr(m, attr, saved[name])


def training_state(
    epoch: int,
    global_iteration: int,
    models: Dict[str, torch.nn.Module],
    optimizers: Optional[Dict[str, Any]] = None,
    loss_funcs: Optional[Dict[str, torch.nn.Module]] = None,
    **extra: Any,
) -> Dict[str, Any]:
    """Everything a resumed epoch needs, ``weights_only``-loadable: the models', optimizers' and losses' state
    dicts, the global RNG states, the losses' private generators and recordable counters
    (:func:`module_records`) and ``extra`` (numbers, strings, tensors ...).

    Example::

        >>> s = training_state(2, 20, {"trunk": torch.nn.Linear(2, 2)}, best_metric=0.5)
        >>> s["epoch"], s["global_iteration"], s["best_metric"]
        (2, 20, 0.5)
    """
    from .distributed import unwrap

    loss_funcs = loss_funcs or {}
    return {
        "epoch": int(epoch),
        "global_iteration": int(global_iteration),
        "models": {k: unwrap(m).state_dict() for k, m in models.items()},
        "optimizers": {k: o.state_dict() for k, o in (optimizers or {}).items()},
        "loss_funcs": {k: unwrap(l).state_dict() for k, l in loss_funcs.items()},
        "rng": rng_state(),
        "generators": {k: g.get_state() for k, g in module_generators(loss_funcs).items()},
        "records": module_records(loss_funcs),
        **extra,
    }


def restore_training_state(
    state: Dict[str, Any],
    models: Dict[str, torch.nn.Module],
    optimizers: Optional[Dict[str, Any]] = None,
    loss_funcs: Optional[Dict[str, torch.nn.Module]] = None,
) -> Dict[str, Any]:
    """Load what :func:`training_state` saved into the objects and restore the RNGs; returns ``state``.

    Raises:
        KeyError: when the state lacks a model, optimizer or loss that is given.
    """
    from .distributed import unwrap

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
    _restore_records(loss_funcs, state.get("records", {}))
    return state


class _AtomicRecordWriter(RecordWriter):
    """record-keeper's writer, but each table goes to SQLite in one transaction and its CSV is regenerated
    atomically from the database (record-keeper appends to the CSV before the DB write, which a kill can
    split).
    """

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
        with atomic_path(path) as tmp:
            with open(tmp, "w", newline="", encoding="utf-8") as f:
                w = csv.writer(f)
                w.writerow(names)
                for r in rows:
                    w.writerow([r[k] for k in names])

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
        folder: where ``checkpoint.pth`` and the ``logs/`` folder (``logs.db`` + one CSV per table) live.
        epoch_tables: names of tables whose ``~iteration~`` column holds the epoch (e.g. accuracies); all
        other tables hold the global training iteration.
        save_lists: keep list-valued records (record-keeper's ``save_lists``).
        tensorboard_writer: a ``torch.utils.tensorboard.SummaryWriter`` the record keeper also writes to.

    Attributes:
        record_keeper: a ``record_keeper.RecordKeeper`` to log into (``update_records`` / ``append_data``);
        rows stay in memory until :meth:`commit`.

    A checkpoint ``state`` is a dict of tensors, numbers, strings, lists, tuples and dicts (``weights_only``
    safe); it must hold ``"epoch"`` and ``"global_iteration"`` (ints).
    """

    FILENAME = "checkpoint.pth"

    def __init__(self, folder: str, epoch_tables=(), save_lists: bool = False, tensorboard_writer=None):
        self.folder = folder
        os.makedirs(folder, exist_ok=True)
        self.epoch_tables = set(epoch_tables)
        self.writer = _AtomicRecordWriter(os.path.join(folder, "logs"), save_lists=save_lists)
        self.record_keeper = RecordKeeper(
            tensorboard_writer=tensorboard_writer,
            record_writer=self.writer,
            attributes_to_search_for=["_record_these"],
        )

    @property
    def path(self) -> str:
        return os.path.join(self.folder, self.FILENAME)

    def commit(self, state: Dict[str, Any]) -> None:
        """Write the buffered log rows, then the checkpoint (in that order; see the module docstring).

        Raises:
            ValueError: if ``state`` lacks ``epoch`` or ``global_iteration``.
        """
        for key in ("epoch", "global_iteration"):
            if not isinstance(state.get(key), int):
                raise ValueError(f"state[{key!r}] must be an int, got {state.get(key)!r}")
        self.writer.save_records()
        atomic_torch_save(state, self.path)

    def resume(self, map_location: Any = "cpu") -> Optional[Dict[str, Any]]:
        """Load the last checkpoint (``weights_only=True``) and drop log rows written after it.

        Returns:
            the state, or ``None`` when there is no checkpoint (then every log row is dropped: the run
            restarts).
        """
        self.writer.records = self.writer.get_empty_nested_dict()
        state = self.load_state(map_location)
        if state is None:
            self.writer.truncate({}, default=float("-inf"))
            return None
        thresholds = {t: state["epoch"] for t in self.writer.tables() if t in self.epoch_tables}
        self.writer.truncate(thresholds, default=state["global_iteration"])
        return state

    def load_state(self, map_location: Any = "cpu") -> Optional[Dict[str, Any]]:
        """The last checkpoint (``weights_only=True``) or ``None``; read only (the logs are left alone: what the
        ranks other than 0 use under torchrun, where rank 0 alone writes the logs)."""
        return load_weights(self.path, map_location) if os.path.exists(self.path) else None

    def rows(self, table: str):
        """All committed rows of ``table`` as dicts (``[]`` when it does not exist)."""
        if table not in self.writer.tables():
            return []
        return [dict(r) for r in self.writer.rows(table)]
