"""The experiment folder every protocol writes (``config.yaml``, ``command.txt``, ``environment.json``, one folder per
stage with its checkpoint, logs and ``result.json``, ``results.json``; see docs/runner.md), and the services around it
(device, seeds, stages, resume).

Example::

    >>> import tempfile
    >>> exp = Experiment(tempfile.mkdtemp(), {"seed": 3, "device": "cpu"})
    >>> exp.device.type, exp.seed_everything(offset=1)
    ('cpu', 4)
    >>> exp.stage_result("fold_0") is None
    True
"""

import json
import os
import platform
import random
import shlex
import shutil
from importlib import metadata
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np
import torch
import yaml

from ...utils.atomic_io import atomic_write_json, atomic_write_text
from ..config.yaml_reader import read_yaml
from ..errors import ConfigError, OutputError
from . import distributed as dist_utils
from .checkpoint import Checkpointer

#: keys that may change between a run and its resume without changing what is trained
RESUME_NEUTRAL_KEYS = ("device", "progress")


def time_estimate(took: float, count: int) -> Tuple[str, str]:
    """``("<took> s", "about <m> min")``: a unit's seconds and the minutes ``count`` more would take, for a run's
    announcements; sub-second units say so instead of ``0 s`` and ``about 0.0 min``.

    Example::

        >>> time_estimate(100.0, 3), time_estimate(0.2, 3)
        (('100 s', 'about 5.0 min'), ('under 1 s', 'a few seconds'))
    """
    rest = took * count
    return (f"{took:.0f} s" if took >= 1 else "under 1 s"), (
        f"about {rest / 60:.1f} min" if rest >= 6 else "a few seconds"
    )


def config_differences(old: Any, new: Any, prefix: str = "") -> List[str]:
    """Dotted keys whose values differ between two configs (added, removed or changed), sorted.

    Example::

        >>> config_differences({"a": 1, "b": {"c": 2}}, {"a": 1, "b": {"c": 3}, "d": 0})
        ['b.c', 'd']
    """
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for key in sorted(set(old) | set(new), key=str):
            path = f"{prefix}.{key}" if prefix else str(key)
            if key not in old or key not in new:
                out.append(path)
            else:
                out += config_differences(old[key], new[key], path)
        return out
    return [] if old == new else [prefix or "<config>"]


def _yaml_roundtrip(config: Dict[str, Any]) -> Dict[str, Any]:
    return read_yaml(yaml.safe_dump(config, sort_keys=False)) or {}


def saved_config(folder: str) -> Optional[Dict[str, Any]]:
    """The ``config.yaml`` saved in ``folder`` (``None`` when there is none)."""
    path = os.path.join(folder, "config.yaml")
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            saved = read_yaml(f) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise OutputError(
            f"{path}: unreadable ({reason}); remove it and rerun (the run's checkpoints stay, and resume)"
        ) from None
    if not isinstance(saved, dict):
        raise OutputError(f"{path}: not a config (a mapping); remove it and rerun")
    return saved


def has_progress(folder: str) -> bool:
    """True when ``folder`` holds anything a run produced (a checkpoint, a stage result, ``results.json``)."""
    for _, _, files in os.walk(folder):
        if {"checkpoint.pth", "result.json", "results.json"} & set(files):
            return True
    return False


def prepare_folder(
    folder: str,
    config: Dict[str, Any],
    on_change: str = "stop",
    command: Optional[Sequence[str]] = None,
    log: Callable[..., None] = print,
) -> None:
    """Make ``folder`` ready for ``config``: check a rerun's saved config (keys in :data:`RESUME_NEUTRAL_KEYS` aside;
    a folder with no progress yet simply takes the new one), then save ``config.yaml`` and ``command.txt``.

    Args:
        on_change: ``"stop"``, ``"new"`` (move the old folder to ``<folder>.old-<n>`` and start afresh) or
            ``"resume"`` (continue with the new config; the saved config is replaced).

    Raises:
        ConfigError: with ``on_change="stop"`` and a changed config: one line listing the differing keys and
        the flags ``--new`` / ``--resume-anyway``.
        ValueError: for another ``on_change``.
    """
    if on_change not in ("stop", "new", "resume"):
        raise ValueError(f"on_change must be 'stop', 'new' or 'resume', got {on_change!r}")
    old = saved_config(folder) if has_progress(folder) else None  # a folder that trained nothing is just reused
    if old is not None:
        diff = [
            k for k in config_differences(old, _yaml_roundtrip(config)) if k.split(".")[0] not in RESUME_NEUTRAL_KEYS
        ]
        if diff and on_change == "stop":
            shown = ", ".join(diff[:12]) + (f" (+{len(diff) - 12} more)" if len(diff) > 12 else "")
            raise ConfigError(
                f"{os.path.basename(os.path.normpath(folder))}: the saved config.yaml differs from this run's config "
                f"in {shown}; rerun with --new to start afresh or --resume-anyway to continue with the new config"
            )
        if diff and on_change == "new" and dist_utils.is_main():
            n = 1
            while os.path.exists(f"{os.path.normpath(folder)}.old-{n}"):
                n += 1
            shutil.move(folder, f"{os.path.normpath(folder)}.old-{n}")
            log(f"note: the previous run was moved to {os.path.normpath(folder)}.old-{n}")
        elif diff:
            log(f"note: continuing with a changed config ({', '.join(diff[:12])})")
    dist_utils.barrier()
    if dist_utils.is_main():
        path = folder
        try:  # the first writes of a run: an unwritable folder stops it here, before any data is read
            os.makedirs(folder, exist_ok=True)
            path = os.path.join(folder, "config.yaml")
            atomic_write_text(path, yaml.safe_dump(config, sort_keys=False, allow_unicode=True))
            if command is not None:
                path = os.path.join(folder, "command.txt")
                atomic_write_text(path, shlex.join(str(c) for c in command) + "\n")  # pastes back
            path = os.path.join(folder, ENVIRONMENT_NAME)
            if not os.path.exists(path):  # the first run's; a resume keeps it
                atomic_write_text(path, json.dumps(run_environment(), indent=2) + "\n")
        except OSError as e:
            raise OutputError.writing(getattr(e, "filename", None) or path, e) from None
    dist_utils.barrier()


#: the file beside ``config.yaml`` that records what a CPU run's exact numbers depend on besides the config
ENVIRONMENT_NAME = "environment.json"


def _cpu() -> Dict[str, Any]:
    """The CPU model and its instruction-set flags (``/proc/cpuinfo`` on Linux; ``platform`` elsewhere)."""
    info: Dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                info.setdefault(key.strip(), value.strip())  # the first core's
    except OSError:
        pass
    flags = info.get("flags", info.get("Features"))  # x86 / ARM
    return {
        "model": info.get("model name") or platform.processor() or None,
        "machine": platform.machine(),
        "count": os.cpu_count(),
        "flags": sorted(flags.split()) if flags is not None else None,
    }


def _torch_build() -> Dict[str, Any]:
    """What torch's CPU kernels are built from (``torch.__config__.show()``) and the CPU capability they use."""
    try:
        out: Dict[str, Any] = {"cpu_capability": torch.backends.cpu.get_cpu_capability()}
    except (AttributeError, RuntimeError):  # older torch
        out = {"cpu_capability": None}
    for line in torch.__config__.show().splitlines():
        line = line.strip(" -\t")
        if "Math Kernel Library" in line:
            out["mkl"] = line
        elif "MKL-DNN" in line or "oneDNN" in line:
            out["onednn"] = line
        elif line.startswith("OpenMP"):
            out["openmp"] = line
        elif line.startswith("Build settings:"):
            settings = dict(
                item.strip().split("=", 1) for item in line[len("Build settings:") :].split(", ") if "=" in item
            )
            for key in ("BLAS_INFO", "LAPACK_INFO", "USE_MKLDNN", "USE_OPENMP", "COMMIT_SHA"):
                if key in settings:
                    out[key.lower()] = settings[key].strip()
    return out


def _versions() -> Dict[str, Optional[str]]:
    out = {}
    for name in (
        "torch",
        "torchvision",
        "numpy",
        "Pillow",
        "matplotlib",
        "pytorch-metric-learning",
        "faiss-cpu",
        "pml_extensions",
    ):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:  # e.g. pml_extensions run from a checkout without installing it
            out[name] = None
    return out


def run_environment() -> Dict[str, Any]:
    """What a run's exact numbers depend on besides its config, saved as ``environment.json``: versions, the CPU
    and torch's kernels, and ``torch_threads`` (CPU sums split by thread, so bit-identical numbers need the same
    count; :func:`pml_extensions.runner.protocols.reproduce.reproduce` reruns with it).

    Example::

        >>> env = run_environment()
        >>> env["torch_threads"] == torch.get_num_threads(), sorted(env["versions"])[:2]
        (True, ['Pillow', 'faiss-cpu'])
    """
    return {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.version.cuda if torch.cuda.is_available() else None,
        "torch_interop_threads": torch.get_num_interop_threads(),
        "thread_variables": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")},
        "cpu": _cpu(),
        "torch_build": _torch_build(),
        "versions": _versions(),
        "platform": platform.platform(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }


def environment_summary(env: Dict[str, Any]) -> str:
    """One line for a results table: torch and its kernels, the CPU, the thread count (and the GPU).

    Example::

        >>> environment_summary({"torch": "2.14.1", "torch_threads": 1, "cpu": {"model": "AMD EPYC", "count": 2},
        ...     "torch_build": {"blas_info": "mkl", "onednn": "Intel(R) MKL-DNN v3.12.0 (Git Hash 80af)",
        ...     "cpu_capability": "AVX512"}, "versions": {"numpy": "2.2.6"}})
        'torch 2.14.1 (BLAS mkl, oneDNN v3.12.0, AVX512 kernels), numpy 2.2.6, AMD EPYC (2 cores), 1 torch thread'
    """
    build = env.get("torch_build") or {}
    onednn = (build.get("onednn") or "").split(" (")[0].split(" ")[-1]
    kernels = [
        f"BLAS {build['blas_info']}" if build.get("blas_info") else "",
        f"oneDNN {onednn}" if onednn else "",
        f"{build['cpu_capability']} kernels" if build.get("cpu_capability") else "",
    ]
    kernels = ", ".join(k for k in kernels if k)
    cpu = env.get("cpu") or {}
    threads = env.get("torch_threads")
    parts = [
        f"torch {env.get('torch')}" + (f" ({kernels})" if kernels else ""),
        f"numpy {(env.get('versions') or {}).get('numpy')}",
        f"{cpu.get('model') or 'unknown CPU'} ({cpu.get('count')} cores)",
        f"{threads} torch thread{'' if threads == 1 else 's'}",
    ]
    if env.get("gpu"):
        parts.append(f"GPU {env['gpu']}")
    return ", ".join(parts)


def select_device(name: Any, where: str = "config_general: device") -> torch.device:
    """``"auto"`` (CUDA when available, else CPU) or a torch device string; under torchrun the rank's GPU.

    Raises:
        ConfigError: for an unparsable name or CUDA requested without a CUDA device.
    """
    name = name or "auto"
    if name == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        try:
            device = torch.device(name)
        except (RuntimeError, TypeError) as e:
            raise ConfigError(f"{where}: {e}") from None
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError(f"{where}: {name!r} requested but no CUDA device is available")
    if dist_utils.is_active() and device.type == "cuda":  # torchrun: the rank's GPU
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return device


def seed_everything(seed: Optional[int]) -> Optional[int]:
    """Seed torch, numpy and python's global RNGs and point PML's ``c_f.NUMPY_RANDOM`` at numpy's (whose state a
    checkpoint saves); ``None`` leaves them alone. Returns the seed."""
    if seed is None:
        return None
    seed = int(seed)
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)
    from pytorch_metric_learning.utils import common_functions as c_f

    c_f.NUMPY_RANDOM = np.random
    return seed


class Experiment:
    """One experiment folder and the services every protocol uses.

    Args:
        folder: the experiment folder (see the module docstring for its layout).
        config: the merged config; reads ``seed`` (default 0; ``null``: leave the RNGs alone) and ``device``
            (default ``"auto"``).
        sources: top-level key -> file, for :meth:`where`.
        log: a print-like function (silenced off the main rank).

    Raises:
        ConfigError: for a bad ``device``.
    """

    def __init__(
        self,
        folder: str,
        config: Dict[str, Any],
        sources: Optional[Dict[str, str]] = None,
        log: Callable[..., None] = print,
    ):
        self.folder = folder
        self.config = config
        self.sources = sources or {}
        self.log = log if dist_utils.is_main() else (lambda *a, **k: None)
        self.device = select_device(config.get("device", "auto"), self.where("device"))

    def where(self, key: str) -> str:
        """``"<file>: <key>"`` for error messages."""
        return f"{self.sources.get(key.split('.')[0], 'config')}: {key}"

    @property
    def seed(self) -> Optional[int]:
        seed = self.config.get("seed", 0)
        return None if seed is None else int(seed)

    def seed_everything(self, offset: int = 0) -> Optional[int]:
        """Seed the global RNGs with ``seed + offset`` (e.g. the fold index); returns it (``None``: untouched)."""
        return seed_everything(None if self.seed is None else self.seed + int(offset))

    def generator(self, offset: int = 0) -> torch.Generator:
        """A CPU ``torch.Generator`` seeded with ``seed + offset`` (seed ``null`` counts as 0)."""
        return torch.Generator().manual_seed((self.seed or 0) + int(offset))

    # ------------------------------------------------------------------------------------------------ stages
    def stage_folder(self, stage: str) -> str:
        return os.path.join(self.folder, stage)

    def checkpointer(self, stage: str, epoch_tables: Iterable[str] = (), **options: Any) -> Checkpointer:
        """The stage's :class:`Checkpointer` (``<folder>/<stage>/checkpoint.pth`` + ``logs/``); ``options``:
        ``save_lists``, ``tensorboard_writer``."""
        return Checkpointer(self.stage_folder(stage), epoch_tables=epoch_tables, **options)

    def stage_result(self, stage: str) -> Optional[Dict[str, Any]]:
        """The saved summary of a finished stage, or ``None`` (then run it; it resumes from its checkpoint)."""
        path = os.path.join(self.stage_folder(stage), "result.json")
        if not os.path.exists(path):
            return None
        try:
            with open(path, encoding="utf-8") as f:
                return json.load(f)
        except ValueError as e:
            raise OutputError(
                f"{path}: truncated or corrupt ({str(e).splitlines()[0]}); remove it and rerun: the stage resumes "
                "from its checkpoint"
            ) from None

    def finish_stage(self, stage: str, result: Dict[str, Any], rank_local: bool = False) -> Dict[str, Any]:
        """Save a finished stage's JSON-able summary and return it: by the main rank, every rank waiting, or with
        ``rank_local=True`` (a stage this rank ran alone) by this rank, waiting for no one."""
        if rank_local or dist_utils.is_main():
            os.makedirs(self.stage_folder(stage), exist_ok=True)
            atomic_write_json(os.path.join(self.stage_folder(stage), "result.json"), result, indent=2)
        if not rank_local:
            dist_utils.barrier()
        return result

    # ------------------------------------------------------------------------------------------------ output
    def write_results(self, results: Dict[str, Any]) -> str:
        """Write ``results.json`` atomically (main rank) and return its path."""
        path = os.path.join(self.folder, "results.json")
        if dist_utils.is_main():
            atomic_write_json(path, results, indent=2)
        dist_utils.barrier()
        return path
