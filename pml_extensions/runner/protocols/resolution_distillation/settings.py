"""The resolution-distillation protocol's settings: its top-level keys, their defaults and their checks.

The keys (:data:`pml_extensions.runner.config.keys.RESOLUTION_DISTILLATION_KEYS`): ``datasets`` (name -> resolutions
and data settings, :data:`DATASET_KEYS`), ``models`` (the network, built by the runner's Builder), ``seeds``,
``device``, ``validation: {class_fraction, seed}``, the teacher's ``teacher_iterations`` / ``teacher_lr`` /
``teacher_classes_per_batch``, the students' ``student_iterations`` / ``images_per_batch`` / ``num_augmentations``
/ ``lr`` or ``student_lr_grid`` / ``lambda_ts`` / ``lambda_ss`` / ``student_variants``, ``eval_batch_size``,
``num_workers``, ``low_resolution_teacher``, ``checkpoint_every``. Before the floor plan they sat inside one
``resolution_job:`` mapping; that layout is still read, with one note.

Example::

    >>> job = job_config({"resolution_job": {"datasets": {"glyphs": {"database_resolution": 32,
    ...                   "query_resolutions": [16]}}, "embedding_dim": 16}})
    >>> job["seeds"], job["datasets"]["glyphs"]["ablation_query_resolution"], job["models"]["embedder"]
    ([0], 16, {'RetrievalHead': {'in_channels': 1280, 'out_dim': 16}})
"""

import copy
import difflib
from typing import Any, Dict, Optional

from ...config.keys import seed_list
from ...config.old_keys import map_resolution_job
from ...errors import ConfigError
from .recipe import DATASETS, STUDENT_VARIANTS

#: every top-level key of the protocol with its default (``None``: required)
JOB_DEFAULTS: Dict[str, Any] = {
    "datasets": None,
    "models": None,
    "seeds": [0],
    "teacher_iterations": 40,
    "teacher_lr": 1e-4,
    "teacher_classes_per_batch": 2,
    "student_iterations": 40,
    "images_per_batch": 8,
    "num_augmentations": 4,
    "lr": 1e-4,
    "lambda_ts": 0.7,
    "lambda_ss": 0.7,
    "eval_batch_size": 64,
    "device": "cpu",
    "num_workers": 0,
    "low_resolution_teacher": True,
    "student_variants": [],
    "checkpoint_every": 0,
    "validation": None,
    "student_lr_grid": None,
}
VALIDATION_KEYS = ("class_fraction", "seed")
DATASET_KEYS = (
    "database_resolution",
    "query_resolutions",
    "max_test_per_class",
    "crop_scale",
    "image_size",
    "source",
    "max_classes",
    "max_side",
    "root",
    "ablation_query_resolution",
)


def _unknown(keys, known, key, where):
    for k in keys:
        if k not in known:
            near = difflib.get_close_matches(str(k), list(known), n=1)
            raise ConfigError(f"{where(key)}: unknown key {k!r}" + (f"; did you mean {near[0]!r}?" if near else ""))


def job_config(config: Dict[str, Any], sources: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    """The validated settings (the protocol's top-level keys, :data:`JOB_DEFAULTS` filled in). A config in the old
    layout (one ``resolution_job:`` mapping) is read through
    :func:`pml_extensions.runner.config.old_keys.map_resolution_job` first.

    Raises:
        ConfigError: one line naming the key: an unknown key (with the nearest known one), a missing ``models`` or
        ``datasets``, a query resolution not in (0, database_resolution), an unknown student variant,
        ``checkpoint_every`` that does not divide the iterations, a non-positive size.
    """
    sources = dict(sources or {})
    config = map_resolution_job(config, sources)

    def where(key):
        return f"{sources.get(key.split('.')[0], 'config')}: {key}"

    for key in config:
        if key != "protocol" and key not in JOB_DEFAULTS:
            near = difflib.get_close_matches(str(key), list(JOB_DEFAULTS), n=1)
            raise ConfigError(
                f"{where(str(key))}: the resolution_distillation protocol reads no such key"
                + (f"; did you mean {near[0]}?" if near else "")
            )
    job = copy.deepcopy(JOB_DEFAULTS)
    job.update({k: copy.deepcopy(v) for k, v in config.items() if k in JOB_DEFAULTS})
    job["seeds"] = seed_list(job["seeds"])  # "0 1 2" or "0,1,2" from the command line
    if not isinstance(job["models"], dict) or "trunk" not in job["models"]:
        raise ConfigError(
            f"{where('models')}: a mapping with trunk and embedder is required, e.g. {{trunk: "
            "{mobilenet_v2_features: {pretrained: true}}, embedder: {RetrievalHead: {in_channels: 1280, out_dim: 512}}}"
        )
    if not isinstance(job["datasets"], dict) or not job["datasets"]:
        raise ConfigError(f"{where('datasets')}: a non-empty mapping {{name: settings}} is required")
    seeds = job["seeds"] if isinstance(job["seeds"], (list, tuple)) else [job["seeds"]]
    if not seeds or any(isinstance(s, bool) or not isinstance(s, int) for s in seeds) or len(set(seeds)) != len(seeds):
        raise ConfigError(f"{where('seeds')}: a list of distinct ints is required, got {job['seeds']!r}")
    job["seeds"] = list(seeds)
    for key in (
        "teacher_iterations",
        "student_iterations",
        "images_per_batch",
        "num_augmentations",
        "eval_batch_size",
        "teacher_classes_per_batch",
    ):
        v = job[key]
        if isinstance(v, bool) or not isinstance(v, int) or v < (0 if key == "teacher_iterations" else 1):
            raise ConfigError(f"{where(key)}: a positive int is required, got {v!r}")
    every = job["checkpoint_every"]
    if isinstance(every, bool) or not isinstance(every, int) or every < 0:
        raise ConfigError(f"{where('checkpoint_every')}: an int >= 0 is required (0: once at the end), got {every!r}")
    for key in ("teacher_iterations", "student_iterations"):
        if every and job[key] % every:
            raise ConfigError(f"{where('checkpoint_every')}: {every} must divide {key} ({job[key]})")
    bad = [v for v in job["student_variants"] if v not in STUDENT_VARIANTS or v == "full"]
    if bad:
        raise ConfigError(
            f"{where('student_variants')}: unknown {bad}; choose from "
            f"{', '.join(v for v in STUDENT_VARIANTS if v != 'full')}"
        )
    val = job["validation"]
    if val is not None:
        if not isinstance(val, dict):
            raise ConfigError(
                f"{where('validation')}: a mapping {{class_fraction, seed}} or null is required, got {val!r}"
            )
        _unknown(val, VALIDATION_KEYS, "validation", where)
        job["validation"] = val = {"class_fraction": val.get("class_fraction", 0.25), "seed": val.get("seed", 0)}
        fraction = val["class_fraction"]
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction < 1:
            raise ConfigError(f"{where('validation')}.class_fraction: a number in (0, 1) is required, got {fraction!r}")
        if isinstance(val["seed"], bool) or not isinstance(val["seed"], int):
            raise ConfigError(f"{where('validation')}.seed: an int is required, got {val['seed']!r}")
    grid = job["student_lr_grid"]
    if grid is not None:
        if (
            not isinstance(grid, (list, tuple))
            or not grid
            or len(set(grid)) != len(grid)
            or any(isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0 for v in grid)
        ):
            raise ConfigError(
                f"{where('student_lr_grid')}: a non-empty list of distinct positive numbers is required, got {grid!r}"
            )
        if "lr" in config:
            raise ConfigError(
                f"{where('lr')}: give lr (one learning rate) or student_lr_grid (chosen on validation), not both"
            )
        if val is None:
            raise ConfigError(
                f"{where('student_lr_grid')}: needs validation (the learning rate is chosen on the validation classes)"
            )
        job["student_lr_grid"] = [float(v) for v in grid]
    if "init_low_resolution_teacher" in job["student_variants"] and not job["low_resolution_teacher"]:
        raise ConfigError(
            f"{where('student_variants')}: init_low_resolution_teacher needs low_resolution_teacher: true"
        )
    for name, d in job["datasets"].items():
        dw = where(f"datasets.{name}")
        if name not in DATASETS:
            raise ConfigError(f"{dw}: unknown dataset; valid: {', '.join(DATASETS)}")
        if not isinstance(d, dict):
            raise ConfigError(f"{dw}: must be a mapping")
        _unknown(d, DATASET_KEYS, f"datasets.{name}", where)
        db, qs = d.get("database_resolution"), d.get("query_resolutions")
        if isinstance(db, bool) or not isinstance(db, int) or db <= 0:
            raise ConfigError(f"{dw}.database_resolution: a positive int is required, got {db!r}")
        if not isinstance(qs, (list, tuple)) or not qs:
            raise ConfigError(f"{dw}.query_resolutions: a non-empty list is required, got {qs!r}")
        for q in qs:
            if isinstance(q, bool) or not isinstance(q, int) or not 0 < q < db:
                raise ConfigError(
                    f"{dw}.query_resolutions: query resolution {q!r} must be in (0, database_resolution={db})"
                )
        aq = d.setdefault("ablation_query_resolution", qs[0])
        if aq not in qs:
            raise ConfigError(f"{dw}.ablation_query_resolution: {aq!r} is not one of query_resolutions {list(qs)}")
    return job
