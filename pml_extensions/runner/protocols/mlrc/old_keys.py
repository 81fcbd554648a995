"""powerful-benchmarker's pre-0.9.29 spellings of config keys (docs/configs.md, "Older spellings"): each read as the
argument of today's object key (:data:`OLD_KEYS`) with one note, or refused with one line (:data:`_OLD_REFUSED`).
"""

import sys
from typing import Any, Callable, Dict, Optional

from ...config.pb_keys import _TESTER, _where
from ...config.specs import one_spec
from ...errors import ConfigError

#: PB's older spellings -> (today's object key, the argument of its class they are)
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


#: top-level keys that are older spellings (accepted by the key check, then mapped here)
OLD_TOP_LEVEL_KEYS = tuple(OLD_KEYS) + tuple(_OLD_REFUSED)


def map_old_keys(config: Dict[str, Any], sources: Dict[str, str], log: Optional[Callable[..., None]] = None):
    """Map PB's older spellings onto arguments of today's object keys, one note each to ``log`` (default: stderr).

    Returns:
        a new config dict.

    Raises:
        ConfigError: a refused key: one line naming it and what to write instead.

    Example::

        >>> map_old_keys({"eval_batch_size": 64}, {}, log=lambda msg: None)["tester"]
        {'GlobalEmbeddingSpaceTester': {'batch_size': 64}}
    """
    log = log or (lambda msg: print(msg, file=sys.stderr))
    out = dict(config)
    for old in [k for k in config if k in _OLD_REFUSED]:
        raise ConfigError(f"{_where(sources, old)}: {_OLD_REFUSED[old]}")
    for old in [k for k in config if k in OLD_KEYS]:
        value = out.pop(old)
        parent, arg = OLD_KEYS[old]
        name, kwargs = one_spec(out.get(parent), _where(sources, parent), default=_DEFAULT_CLASS[parent])
        out[parent] = {name: dict(kwargs, **{arg: value})}
        sources.setdefault(parent, sources.get(old, "config"))
        log(
            f"note: {_where(sources, old)} is powerful-benchmarker's pre-0.9.29 spelling; read as "
            f"{parent}~APPLY~2: {{{arg}: {value!r}}}"
        )
    return out
