"""Older spellings of config keys, each mapped onto today's key with one note (or refused with one line).

* powerful-benchmarker's pre-0.9.29 spellings (``mlrc`` protocol): ``eval_batch_size``, top-level ``test_size``,
  ``batch_size`` ... are read as the argument of today's object key (:data:`OLD_KEYS`); a few have no
  counterpart and are refused (:data:`_OLD_REFUSED`);
* the resolution protocol's ``resolution_job:`` mapping (before the floor plan): its entries are read as
  top-level keys, ``embedding_dim`` as the ``models`` key of the same network (:func:`map_resolution_job`).
  A key given both at the top level and inside ``resolution_job`` takes the command line's value when one of the
  two comes from it (``--seeds 0 1`` over an old config file, ``--resolution_job "{device: cuda}"`` over a new
  one), else the top-level value.

Example::

    >>> cfg = {"protocol": "resolution_distillation", "resolution_job": {"seeds": [0], "embedding_dim": 16}}
    >>> out = map_old_keys(cfg, {}, log=lambda msg: None)
    >>> out["seeds"], out["models"]["embedder"]
    ([0], {'RetrievalHead': {'in_channels': 1280, 'out_dim': 16}})
"""

import copy
import difflib
import sys
from typing import Any, Callable, Dict, Optional

from ..errors import ConfigError
from .eval_keys import _TESTER, _where
from .specs import one_spec

#: PB's older spellings -> (new key path, note); a path ending in "*" applies to the class's kwargs
OLD_KEYS = {
    "eval_reference_set": ("tester", "reference_set"),
    "eval_normalize_embeddings": ("tester", "normalize_embeddings"),
    "eval_use_trunk_output": ("tester", "use_trunk_output"),
    "eval_batch_size": ("tester", "batch_size"),
    "eval_dataloader_num_workers": ("tester", "dataloader_num_workers"),
    "eval_pca": ("tester", "pca"),
    "eval_accuracy_calculator": ("tester", "accuracy_calculator"),
    "eval_label_hierarchy_level": ("tester", "label_hierarchy_level"),
    "label_hierarchy_level": ("tester", "label_hierarchy_level"),
    "eval_primary_metric": ("hook_container", "primary_metric"),
    "eval_metric_for_best_epoch": ("hook_container", "primary_metric"),
    "test_size": ("split_manager", "test_size"),
    "test_start_idx": ("split_manager", "test_start_idx"),
    "num_training_partitions": ("split_manager", "num_training_partitions"),
    "num_training_sets": ("split_manager", "num_training_sets"),
    "iterations_per_epoch": ("trainer", "iterations_per_epoch"),
    "batch_size": ("trainer", "batch_size"),
    "dataloader_num_workers": ("trainer", "dataloader_num_workers"),
}
_OLD_REFUSED = {
    "training_method": "PB's pre-0.9.29 name of the trainer; write `trainer: {MetricLossOnly: {...}}`",
    "split_names": "the splits are always train/val/test here; remove the key",
    "eval_size_of_ensemble": "the ensemble is every trained fold; remove the key",
    "meta_testing_method": "the ensemble is set with `ensemble: {ConcatenateEmbeddings: {...}}`",
}
_DEFAULT_CLASS = {
    "tester": _TESTER,
    "hook_container": "HookContainer",
    "split_manager": "ClassDisjointSplitManager",
    "trainer": "MetricLossOnly",
}


#: the keys of the old ``resolution_job:`` mapping of the resolution_distillation protocol
RESOLUTION_JOB_KEYS = (
    "datasets",
    "seeds",
    "teacher_iterations",
    "teacher_lr",
    "teacher_classes_per_batch",
    "student_iterations",
    "images_per_batch",
    "num_augmentations",
    "lr",
    "lambda_ts",
    "lambda_ss",
    "embedding_dim",
    "eval_batch_size",
    "device",
    "num_workers",
    "low_resolution_teacher",
    "student_variants",
    "checkpoint_every",
    "validation",
    "student_lr_grid",
)
#: protocol -> top-level keys that are older spellings (accepted by the key check, then mapped here)
OLD_TOP_LEVEL_KEYS = {
    "mlrc": tuple(OLD_KEYS) + tuple(_OLD_REFUSED),
    "resolution_distillation": ("resolution_job",),
}


def resolution_models(embedding_dim: int = 512) -> Dict[str, Any]:
    """The resolution protocol's network as a ``models`` spec: ImageNet MobileNetV2 features (read offline) and
    RAML's GeM + whitening :class:`pml_extensions.trunks.RetrievalHead` of ``embedding_dim`` (Suma & Tolias,
    WACV 2023, Sec. 5; MobileNetV2 instead of the paper's ResNet50)."""
    return {
        "trunk": {"mobilenet_v2_features": {"pretrained": True}},
        "embedder": {"RetrievalHead": {"in_channels": 1280, "out_dim": embedding_dim}},
    }


def map_resolution_job(
    config: Dict[str, Any], sources: Optional[Dict[str, str]] = None, log: Optional[Callable[..., None]] = None
) -> Dict[str, Any]:
    """Read the old ``resolution_job:`` mapping as top-level keys (``embedding_dim`` -> ``models``); a config
    without it is returned unchanged. ``log`` gets one note (None: silent).

    Raises:
        ConfigError: ``resolution_job`` not a mapping, or an unknown key in it (with the nearest known one).
    """
    if "resolution_job" not in config:
        return config
    sources = sources if sources is not None else {}
    where = f"{sources.get('resolution_job', 'config_general')}: resolution_job"
    job = config["resolution_job"]
    if not isinstance(job, dict):
        raise ConfigError(f"{where}: must be a mapping (the job settings), got {type(job).__name__}")
    for key in job:
        if key not in RESOLUTION_JOB_KEYS:
            near = difflib.get_close_matches(str(key), RESOLUTION_JOB_KEYS, n=1)
            raise ConfigError(f"{where}: unknown key {key!r}" + (f"; did you mean {near[0]!r}?" if near else ""))
    out = {k: v for k, v in config.items() if k != "resolution_job"}
    job_wins = sources.get("resolution_job") == "command line"
    for key, value in job.items():
        top = "models" if key == "embedding_dim" else key
        if top in out and not (job_wins and sources.get(top) != "command line"):
            continue  # the top-level value stands
        out[top] = resolution_models(value) if key == "embedding_dim" else copy.deepcopy(value)
        sources[top] = sources.get("resolution_job", "config")
    if "models" not in out:
        out["models"] = resolution_models()
        sources.setdefault("models", sources.get("resolution_job", "config"))
    if log is not None:
        log(
            f"note: {where} is the resolution protocol's old layout; its keys are read as top-level keys "
            "(embedding_dim as models.embedder.RetrievalHead.out_dim; a key given at both levels keeps the command "
            "line's value, else the top-level one)"
        )
    return out


def map_old_keys(config: Dict[str, Any], sources: Dict[str, str], log: Optional[Callable[..., None]] = None):
    """Map older spellings onto today's keys, printing one note per key (default: to stderr).

    ``mlrc``: PB's pre-0.9.29 spellings (``eval_batch_size``, top-level ``test_size``, ``batch_size`` ...) become
    arguments of today's object keys; those with no counterpart (:data:`_OLD_REFUSED`) are refused.
    ``resolution_distillation``: :func:`map_resolution_job`.

    Returns:
        a new config dict (the same one when nothing was mapped).

    Raises:
        ConfigError: one line naming the old key and what to write instead.
    """
    log = log or (lambda msg: print(msg, file=sys.stderr))
    protocol = config.get("protocol") or "mlrc"
    if protocol == "resolution_distillation":
        return map_resolution_job(config, sources, log)
    if protocol != "mlrc":
        return config
    out = dict(config)
    for old in [k for k in config if k in _OLD_REFUSED]:
        raise ConfigError(f"{_where(sources, old)}: {_OLD_REFUSED[old]}")
    for old in [k for k in config if k in OLD_KEYS]:
        value = out.pop(old)
        parent, arg = OLD_KEYS[old]
        if parent in out and out[parent] is not None:
            name, kwargs = one_spec(out[parent], _where(sources, parent))
        else:
            name, kwargs = _DEFAULT_CLASS[parent], {}
        out[parent] = {name: dict(kwargs, **{arg: value})}
        sources.setdefault(parent, sources.get(old, "config"))
        log(
            f"note: {_where(sources, old)} is powerful-benchmarker's pre-0.9.29 spelling; read as "
            f"{parent}~APPLY~2: {{{arg}: {value!r}}}"
        )
    return out
