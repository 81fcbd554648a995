"""The experiment folder every protocol writes (docs/runner.md) and the services around it: device, seeds, stages."""

import itertools
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
from ..config.pb_keys import _where
from ..config.specs import read_yaml
from ..errors import ConfigError, OutputError, first_line
from . import distributed as dist_utils
from .checkpoint import Checkpointer

#: keys that may change between a run and its resume without changing what is trained
RESUME_NEUTRAL_KEYS = ("device", "progress")


def time_estimate(took: float, count: int) -> Tuple[str, str]:
    """``("<took> s", "about <m> min")``: a unit's seconds and the minutes ``count`` more would take."""
    rest = took * count
    return (f"{took:.0f} s" if took >= 1 else "under 1 s"), (
        f"about {rest / 60:.1f} min" if rest >= 6 else "a few seconds"
    )


def config_differences(old: Any, new: Any, prefix: str = "") -> List[str]:
    """Dotted keys whose values differ between two configs (added, removed or changed), sorted."""
    if not (isinstance(old, dict) and isinstance(new, dict)):
        return [] if old == new else [prefix or "<config>"]
    out = []
    for key in sorted(set(old) | set(new), key=str):
        path = f"{prefix}.{key}" if prefix else str(key)
        out += config_differences(old[key], new[key], path) if key in old and key in new else [path]
    return out


def saved_config(folder: str) -> Optional[Dict[str, Any]]:
    """The ``config.yaml`` saved in ``folder`` (``None`` when there is none)."""
    path = os.path.join(folder, "config.yaml")
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            saved = read_yaml(f) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise OutputError(
            f"{path}: unreadable ({first_line(e)}); remove it and rerun (the run's checkpoints stay, and resume)"
        ) from None
    if not isinstance(saved, dict):
        raise OutputError(f"{path}: not a config (a mapping); remove it and rerun")
    return saved


def prepare_folder(
    folder: str,
    config: Dict[str, Any],
    on_change: str = "stop",
    command: Optional[Sequence[str]] = None,
    log: Callable[..., None] = print,
) -> None:
    """Check a rerun's saved config (:data:`RESUME_NEUTRAL_KEYS` aside), then save ``config.yaml``, ``command.txt``
    and ``environment.json``. ``on_change`` for a changed config: ``"stop"`` (a :class:`ConfigError` listing the keys),
    ``"new"`` (the old folder moved to ``<folder>.old-<n>``) or ``"resume"`` (the new config replaces the saved one)."""
    if on_change not in ("stop", "new", "resume"):
        raise ValueError(f"on_change must be 'stop', 'new' or 'resume', got {on_change!r}")
    # a folder that trained nothing yet (no checkpoint, stage result or results.json) is just reused
    progress = any({"checkpoint.pth", "result.json", "results.json"} & set(files) for _, _, files in os.walk(folder))
    old = saved_config(folder) if progress else None
    if old is not None:
        new = read_yaml(yaml.safe_dump(config, sort_keys=False)) or {}  # as a resume will read it back
        diff = [k for k in config_differences(old, new) if k.split(".")[0] not in RESUME_NEUTRAL_KEYS]
        if diff and on_change == "stop":
            shown = ", ".join(diff[:12]) + (f" (+{len(diff) - 12} more)" if len(diff) > 12 else "")
            raise ConfigError(
                f"{os.path.basename(os.path.normpath(folder))}: the saved config.yaml differs from this run's config "
                f"in {shown}; rerun with --new to start afresh or --resume-anyway to continue with the new config"
            )
        if diff and on_change == "new" and dist_utils.is_main():
            n = next(n for n in itertools.count(1) if not os.path.exists(f"{os.path.normpath(folder)}.old-{n}"))
            shutil.move(folder, f"{os.path.normpath(folder)}.old-{n}")
            log(f"note: the previous run was moved to {os.path.normpath(folder)}.old-{n}")
        elif diff:
            log(f"note: continuing with a changed config ({', '.join(diff[:12])})")
    dist_utils.barrier()
    if dist_utils.is_main():
        try:  # the first writes of a run: an unwritable folder stops it here, before any data is read
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
    """The CPU model and its instruction-set flags."""
    info: Dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for key, _, value in (line.partition(":") for line in f):
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
    """What torch's CPU kernels are built from and the CPU capability they use."""
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
            settings = dict(item.strip().split("=", 1) for item in line.partition(":")[2].split(", ") if "=" in item)
            for key in ("BLAS_INFO", "LAPACK_INFO", "USE_MKLDNN", "USE_OPENMP", "COMMIT_SHA"):
                if key in settings:
                    out[key.lower()] = settings[key].strip()
    return out


def _version(name: str) -> Optional[str]:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:  # e.g. pml_extensions run from a checkout without installing it
        return None


#: the distributions whose versions ``environment.json`` records
VERSIONED = "torch torchvision numpy Pillow matplotlib pytorch-metric-learning faiss-cpu pml_extensions".split()


def run_environment() -> Dict[str, Any]:
    """What a run's exact numbers depend on besides its config (``environment.json``): versions, the CPU, torch's
    kernels and ``torch_threads`` (CPU sums split by thread; ``--reproduce`` reruns with it)."""
    return {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.version.cuda if torch.cuda.is_available() else None,
        "torch_interop_threads": torch.get_num_interop_threads(),
        "thread_variables": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")},
        "cpu": _cpu(),
        "torch_build": _torch_build(),
        "versions": {name: _version(name) for name in VERSIONED},
        "platform": platform.platform(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }


def environment_summary(env: Dict[str, Any]) -> str:
    """One line of ``environment.json`` for a results table: torch and its kernels, the CPU, the thread count (and
    the GPU), e.g. ``torch 2.14.1 (BLAS mkl, oneDNN v3.12.0, AVX512 kernels), numpy 2.2.6, AMD EPYC (2 cores), 1 torch
    thread``."""
    build, cpu, threads = env.get("torch_build") or {}, env.get("cpu") or {}, env.get("torch_threads")
    onednn = (build.get("onednn") or "").split(" (")[0].split(" ")[-1]  # "Intel(R) MKL-DNN v3.12.0 (Git Hash ..)"
    kernels = {"BLAS {}": build.get("blas_info"), "oneDNN {}": onednn, "{} kernels": build.get("cpu_capability")}
    kernels = ", ".join(form.format(value) for form, value in kernels.items() if value)
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
    """``"auto"`` (CUDA when available, else CPU) or a torch device string (under torchrun the rank's GPU)."""
    if not name or name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError) as e:
        raise ConfigError(f"{where}: {e} (expected auto, cpu, cuda or cuda:N)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"{where}: {name!r} requested but no CUDA device is available")
    if dist_utils.is_active() and device.type == "cuda":  # torchrun: the rank's GPU
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return device


def seed_everything(seed: Optional[int]) -> Optional[int]:
    """Seed torch, numpy and python's global RNGs and PML's ``c_f.NUMPY_RANDOM`` (``None``: untouched)."""
    if seed is None:
        return None
    seed = int(seed)
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)
    from pytorch_metric_learning.utils import common_functions as c_f

    c_f.NUMPY_RANDOM = np.random
    return seed


def read_json(path: str, then: str) -> Optional[Any]:
    """A JSON file the run wrote, or ``None``; :class:`OutputError` (remove it, and ``then``) for a corrupt one."""
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except ValueError as e:
        raise OutputError(f"{path}: truncated or corrupt ({first_line(e)}); remove it and rerun: {then}") from None


class Experiment:
    """One experiment folder and the services every protocol uses; reads the config's ``seed`` (default 0;
    ``null``: RNGs untouched) and ``device`` (default ``"auto"``); ``sources``: key -> file (:meth:`where`)."""

    def __init__(
        self,
        folder: str,
        config: Dict[str, Any],
        sources: Optional[Dict[str, str]] = None,
        log: Callable[..., None] = print,
    ):
        self.folder, self.config, self.sources = folder, config, sources or {}
        self.log = log if dist_utils.is_main() else (lambda *a, **k: None)
        self.device = select_device(config.get("device", "auto"), self.where("device"))

    def where(self, key: str) -> str:
        """``"<file>: <key>"`` for error messages."""
        return _where(self.sources, key)

    @property
    def seed(self) -> Optional[int]:
        seed = self.config.get("seed", 0)
        return None if seed is None else int(seed)

    def seed_everything(self, offset: int = 0) -> Optional[int]:
        """Seed the global RNGs with ``seed + offset`` (e.g. the fold index)."""
        return seed_everything(None if self.seed is None else self.seed + int(offset))

    def stage_folder(self, stage: str) -> str:
        return os.path.join(self.folder, stage)

    def checkpointer(self, stage: str, epoch_tables: Iterable[str] = (), **options: Any) -> Checkpointer:
        """The stage's :class:`Checkpointer` (``options``: ``save_lists``, ``tensorboard_writer``)."""
        return Checkpointer(self.stage_folder(stage), epoch_tables=epoch_tables, **options)

    def stage_result(self, stage: str) -> Optional[Dict[str, Any]]:
        """The saved summary of a finished stage, or ``None`` (then run it; it resumes from its checkpoint)."""
        return read_json(os.path.join(self.stage_folder(stage), "result.json"), "the stage resumes from its checkpoint")

    def finish_stage(self, stage: str, result: Dict[str, Any], rank_local: bool = False) -> Dict[str, Any]:
        """Save a finished stage's summary (by the main rank, or with ``rank_local`` this rank alone); return it."""
        if rank_local or dist_utils.is_main():  # atomic_write_json makes the folder
            atomic_write_json(os.path.join(self.stage_folder(stage), "result.json"), result, indent=2)
        if not rank_local:
            dist_utils.barrier()
        return result

    def write_results(self, results: Dict[str, Any]) -> str:
        """Write ``results.json`` atomically (main rank) and return its path."""
        path = os.path.join(self.folder, "results.json")
        if dist_utils.is_main():
            atomic_write_json(path, results, indent=2)
        dist_utils.barrier()
        return path
