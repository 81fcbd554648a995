"""``--reproduce RUN_FOLDER``: rerun a finished experiment from its saved ``config.yaml`` into
``<RUN_FOLDER>_reproduced`` and compare the numbers of the two ``results.json`` (docs/runner.md)."""

import math
import os
from typing import Any, Dict, List, Optional

import torch

from ...utils.atomic_io import atomic_write_json
from ..errors import ConfigError
from ..experiment.folder import ENVIRONMENT_NAME, read_json, saved_config

IGNORED_KEY_PARTS = ("second", "time", "path", "folder")


def numeric_differences(old: Any, new: Any, prefix: str = "") -> List[str]:
    """Dotted keys of numbers (and numbers' containers) that differ between two results, times and paths aside.

    NaN equals NaN; ints and floats compare by value; a missing or extra key counts as a difference.

    Example::

        >>> numeric_differences({"a": 1.0, "seconds": 3, "b": [1, 2]}, {"a": 1.0, "seconds": 9, "b": [1, 3]})
        ['b[1]']
    """
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for key in sorted(set(old) | set(new), key=str):
            if any(part in str(key).lower() for part in IGNORED_KEY_PARTS):
                continue
            path = f"{prefix}.{key}" if prefix else str(key)
            if key not in old or key not in new:
                out.append(path)
            else:
                out += numeric_differences(old[key], new[key], path)
        return out
    if isinstance(old, list) and isinstance(new, list):
        if len(old) != len(new):
            return [prefix]
        return [d for i, (a, b) in enumerate(zip(old, new)) for d in numeric_differences(a, b, f"{prefix}[{i}]")]
    if isinstance(old, float) and isinstance(new, float) and math.isnan(old) and math.isnan(new):
        return []
    return [] if old == new else [prefix]


def reproduce(
    run_folder: str, output_folder: Optional[str] = None, log=print, command: Optional[List[str]] = None
) -> Dict[str, Any]:
    """Rerun ``run_folder`` from its saved config into ``output_folder`` and compare the results.

    The rerun uses the torch thread count recorded in the run's ``environment.json`` (CPU reductions are split by
    thread, so bit-identical numbers need the same count); this process's count is restored afterwards.

    Returns:
        ``{"run_folder", "output_folder", "equal": bool, "differences": [dotted keys]}`` (also written to
        ``<output_folder>/reproduce.json``).

    Raises:
        ConfigError: when ``run_folder`` has no ``config.yaml`` or no ``results.json`` (not a finished run).
    """
    from . import run_protocol

    config, then = saved_config(run_folder), f"--reproduce {run_folder}"
    original = read_json(os.path.join(run_folder, "results.json"), then)
    if config is None or original is None:
        raise ConfigError(f"{then}: not a finished experiment folder (needs config.yaml and results.json)")
    out = output_folder or os.path.normpath(run_folder) + "_reproduced"
    threads = (read_json(os.path.join(run_folder, ENVIRONMENT_NAME), then) or {}).get("torch_threads")
    before = torch.get_num_threads()
    if isinstance(threads, int) and threads > 0 and threads != before:  # CPU reductions split by thread
        log(f"note: rerunning with {threads} torch threads as the original run (this process had {before})")
        torch.set_num_threads(threads)
    try:
        run_protocol(config, out, log=log, command=command)
    finally:
        torch.set_num_threads(before)
    rerun = read_json(os.path.join(out, "results.json"), then)  # as written: both sides JSON-encoded alike
    diffs = numeric_differences(original, rerun)
    outcome = {"run_folder": run_folder, "output_folder": out, "equal": not diffs, "differences": diffs}
    atomic_write_json(os.path.join(out, "reproduce.json"), outcome, indent=2)
    return outcome


def main(run_folder: str, output_folder: Optional[str] = None, command: Optional[List[str]] = None) -> int:
    """CLI glue: returns 0 when the rerun reproduced every number exactly, 1 otherwise (differences listed)."""
    outcome = reproduce(run_folder, output_folder, command=command)
    if outcome["equal"]:
        print(f"reproduced exactly: {outcome['output_folder']} matches {run_folder}")
        return 0
    shown = ", ".join(outcome["differences"][:20])
    print(f"NOT reproduced: {len(outcome['differences'])} numbers differ ({shown}); see {outcome['output_folder']}")
    return 1
