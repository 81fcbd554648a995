"""The resolution-distillation protocol's settings: its top-level keys (:class:`Settings`, with their defaults and
types) and the checks across them (:func:`job_config`).

Example::

    >>> job = job_config({"models": {"trunk": {"Flatten": {}}}, "datasets": {"glyphs": {"database_resolution": 32,
    ...                   "query_resolutions": [16]}}})
    >>> job["seeds"], job["datasets"]["glyphs"]["ablation_query_resolution"]
    ([0], 16)
"""

import dataclasses
import difflib
from typing import Any, Dict, List, Optional

from pml_extensions.runner.errors import ConfigError
from pml_extensions.runner.protocols.base import REQUIRED, read_settings, setting

from .recipe import DATASETS, STUDENT_VARIANTS


@dataclasses.dataclass
class Settings:
    """The top-level keys of the ``resolution_distillation`` protocol."""

    datasets: Dict[str, Any] = setting(
        REQUIRED, "`{name: {database_resolution, query_resolutions, ...}}`: the datasets and resolutions.", "mapping"
    )
    models: Dict[str, Any] = setting(REQUIRED, "`{trunk, embedder}` of the teacher and the students.", "mapping")
    seeds: List[int] = setting([0], "The paired seeds.", "seeds")
    teacher_iterations: int = setting(40, "Training iterations of each teacher.", "int", minimum=0)
    teacher_lr: float = setting(1e-4, "Learning rate of the teachers.", "float", minimum=0)
    teacher_classes_per_batch: int = setting(2, "Classes per teacher batch (4 images each).", "int", minimum=1)
    student_iterations: int = setting(40, "Distillation iterations of each student.", "int", minimum=1)
    images_per_batch: int = setting(8, "Source images per student batch.", "int", minimum=1)
    num_augmentations: int = setting(4, "Coupled augmentations per source image.", "int", minimum=1)
    lr: float = setting(
        1e-4, "Learning rate of the students (unless `student_lr_grid` chooses it).", "float", minimum=0
    )
    lambda_ts: float = setting(0.7, "Weight of the teacher-student relation term (RAML's λ_ts).", "float")
    lambda_ss: float = setting(0.7, "Weight of the student-student relation term (RAML's λ_ss).", "float")
    eval_batch_size: int = setting(64, "Batch size of the evaluation passes.", "int", minimum=1)
    device: str = setting("cpu", "`auto`, `cpu`, `cuda` or `cuda:N`.", "str")
    num_workers: int = setting(0, "DataLoader worker processes.", "int", minimum=0)
    low_resolution_teacher: bool = setting(True, "Also train a teacher at each query resolution (Table 2).", "bool")
    student_variants: List[str] = setting([], "Ablation students (Tables 3-4).", "list")
    checkpoint_every: int = setting(
        0, "Checkpoint (and validate) every this many iterations; 0: at the end.", "int", minimum=0
    )
    validation: Optional[Dict[str, Any]] = setting(
        None, "`{class_fraction, seed}` held out of the training classes.", "mapping"
    )
    student_lr_grid: Optional[List[float]] = setting(None, "Learning rates tried for the full student.", "list")


#: every top-level key of the protocol with its default (``None``: required)
JOB_DEFAULTS: Dict[str, Any] = {
    f.name: (None if f.default is REQUIRED else f.default_factory()) for f in dataclasses.fields(Settings)
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
    """The validated settings as a dict (:class:`Settings`, defaults filled in) with the checks across keys.

    Raises:
        ConfigError: one line naming the key: a missing ``models`` or ``datasets``, a query resolution not in
        (0, database_resolution), an unknown student variant, ``checkpoint_every`` that does not divide the
        iterations, a bad size.
    """
    sources = dict(sources or {})

    def where(key):
        return f"{sources.get(key.split('.')[0], 'config')}: {key}"

    job = dataclasses.asdict(read_settings(Settings, config, sources))
    if "trunk" not in job["models"]:
        raise ConfigError(
            f"{where('models')}: a mapping with trunk and embedder is required, e.g. {{trunk: "
            "{mobilenet_v2_features: {pretrained: true}}, embedder: {RetrievalHead: {in_channels: 1280, out_dim: 512}}}"
        )
    if not job["datasets"]:
        raise ConfigError(f"{where('datasets')}: a non-empty mapping {{name: settings}} is required")
    every = job["checkpoint_every"]
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
