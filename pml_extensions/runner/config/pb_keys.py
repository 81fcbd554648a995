"""Every powerful-benchmarker (PB v0.9.33) config value, evaluation keys included, honoured as in PB or refused with
one line naming the key (:func:`check_values`, at load time); docs/configs.md tabulates the defaults.

Example::

    >>> split_settings({"split_manager": {"ClassDisjointSplitManager": {"test_size": 0.25}}})["test_size"]
    0.25
    >>> ensemble_settings({"ensemble": {"ConcatenateEmbeddings": {"normalize_embeddings": False}}})
    {'normalize_embeddings': False, 'use_trunk_output': False}
"""

import importlib.util
import json
import os
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ...utils.checks import is_int, is_number
from ..errors import ConfigError
from .loader import merged_next_to, source_of
from .registry import lookup, names_for_role
from .specs import nearest, one_spec

#: object keys whose value maps names to specs (``{metric_loss: {ContrastiveLoss: ...}}``)
NAMED_SPEC_KEYS = ("models", "loss_funcs", "mining_funcs", "optimizers", "test_hooks")
#: object keys whose value is one spec
ONE_SPEC_KEYS = ("sampler", "trainer", "tester", "accuracy_calculator", "dataset")
_TESTER = "GlobalEmbeddingSpaceTester"
_DEFAULT_ENSEMBLE = {"normalize_embeddings": True, "use_trunk_output": False}
#: PB's own classes for these keys that this runner does not implement (refused by name, not "unknown")
_PB_ONLY = {
    "split_manager": (
        "ClosedSetSplitManager",
        "IndexSplitManager",
        "PredefinedSplitManager",
        "EmbeddingSpaceSplitManager",
        "MLRCSplitManager",
        "UseOriginalTestSplitManager",
    ),
}
_DEFAULT_SPLIT = {
    "test_size": 0.5,
    "test_start_idx": 0.5,
    "num_training_partitions": 4,
    "num_training_sets": 4,
    "hierarchy_level": 0,
    "data_and_label_getter_keys": None,
    "test_classes": None,
}
_DEFAULT_HOOKS = {"primary_metric": "mean_average_precision_at_r", "validation_split_name": "val", "save_models": True}
#: config_general flags: key -> (default, allowed values or None for any bool, reason when refused)
_FLAGS = {
    "api_parser": (None, (None,), "API parsers are PB's internals; choose the protocol with `protocol:`"),
    "skip_eval_if_already_done": (
        True,
        (True,),
        "a resumed run continues from its checkpoint and never evaluates a logged epoch again",
    ),
    "skip_ensemble_eval_if_already_done": (True, (True, False), ""),
    "log_data_to_tensorboard": (False, (True, False), ""),
    "save_figures_on_tensorboard": (False, (False,), "figures go to report.html, not to tensorboard"),
    "save_lists_in_db": (False, (True, False), ""),
    "override_required_compatible_factories": (
        False,
        (False,),
        "custom factories are not supported; register classes with pml_extensions.runner.register instead",
    ),
}


def _where(sources: Optional[Dict[str, str]], key: str) -> str:
    return f"{(sources or {}).get(key.split('.')[0], 'config')}: {key}"


def _check_kwargs(where: str, kwargs: Dict, allowed: Sequence[str]) -> None:
    for k in kwargs:
        if k not in allowed:
            raise ConfigError(f"{where}: unknown argument {k!r}{nearest(k, allowed)} (known: {', '.join(allowed)})")


def _settings(config: Dict[str, Any], key: str, sources, default: str, defaults: Dict[str, Any]):
    """``(where, defaults updated by the arguments)`` of a key whose only class here is ``default``."""
    name, kwargs = one_spec(config.get(key), _where(sources, key), default)
    where = f"{_where(sources, key)}.{name}"
    if name in _PB_ONLY.get(key, ()):
        raise ConfigError(f"{where}: {name} is powerful-benchmarker's, not implemented here; use {default}")
    if name != default:
        raise ConfigError(f"{where}: unknown class {name!r}{nearest(name, [default])} (known: {default})")
    _check_kwargs(where, kwargs, tuple(defaults))
    return where, dict(defaults, **kwargs)


def tester_spec(config: Dict[str, Any], sources: Optional[Dict[str, str]] = None) -> Tuple[str, Dict[str, Any]]:
    """``tester``'s class and checked arguments (``reference_set`` and ``visualizer`` removed)."""
    name, kwargs = one_spec(config.get("tester"), _where(sources, "tester"), _TESTER)
    where = f"{_where(sources, 'tester')}.{name}"
    testers = names_for_role("tester")
    if name not in testers:
        raise ConfigError(f"{where}: unknown tester class {name!r}{nearest(name, testers)}")
    _check_kwargs(where, kwargs, tuple(lookup(name).get("tester_params") or ()))
    kwargs = dict(kwargs)
    reference = kwargs.pop("reference_set", "compared_to_self")
    if reference != "compared_to_self":
        raise ConfigError(
            f"{where}.reference_set: only compared_to_self is supported (each split is its own "
            f"reference set, as in the MLRC paper), got {reference!r}"
        )
    visualizer = kwargs.pop("visualizer", None)
    if visualizer:  # PB: `if tester_params.get("visualizer", None):` -- {} and null mean no visualizer
        name = next(iter(visualizer)) if isinstance(visualizer, dict) else visualizer
        raise ConfigError(
            f"{where}.visualizer: embedding plots are not supported ({name}: PB drew them with a visualizer class "
            "such as sklearn's TSNE or umap's UMAP, neither a dependency here); set visualizer: {} (none, as PB "
            "reads it) or null"
        )
    pca = kwargs.get("pca")
    if pca is not None and (not is_int(pca) or pca < 1):
        raise ConfigError(f"{where}.pca: expected null or a positive number of dimensions, got {pca!r}")
    level = kwargs.get("label_hierarchy_level", 0)
    if not is_int(level) or level < 0:
        raise ConfigError(f"{where}.label_hierarchy_level: expected a non-negative integer, got {level!r}")
    accuracy_calculator_spec(kwargs, where)
    return name, kwargs


def accuracy_calculator_spec(tester_kwargs: Dict[str, Any], where: str) -> Tuple[str, Dict[str, Any]]:
    """The tester's ``accuracy_calculator`` (default ``AccuracyCalculator(k="max_bin_count")``, the MLRC paper's)."""
    spec = tester_kwargs.get("accuracy_calculator") or {"AccuracyCalculator": {"k": "max_bin_count"}}
    where = f"{where}.accuracy_calculator"
    name, kwargs = one_spec(spec, where)
    calculators = names_for_role("accuracy_calculator")
    if name not in calculators:
        raise ConfigError(f"{where}: unknown class {name!r}{nearest(name, calculators)}")
    metrics = lookup(name).get("metrics")  # None: a calculator that needs arguments; PML checks the names itself
    known = set(metrics or ()) | {"mean_reciprocal_rank"}
    for key in ("include", "exclude"):
        for metric in kwargs.get(key) or ():
            if metrics is not None and metric not in known:
                raise ConfigError(f"{where}.{name}.{key}: unknown metric {metric!r}{nearest(metric, known)}")
    return name, dict(kwargs)  # a copy: the Builder adds the device


def aggregate(
    config: Dict[str, Any], fold_metrics: Sequence[Dict[str, float]], sources: Optional[Dict[str, str]] = None
) -> Dict[str, float]:
    """``aggregator``: the mean of each metric over the folds' ``fold_metrics`` (at each one's best epoch)."""
    where, settings = _settings(config, "aggregator", sources, "MeanAggregator", {"split_to_aggregate": "val"})
    if settings["split_to_aggregate"] != "val":
        raise ConfigError(
            f"{where}.split_to_aggregate: only val is aggregated (the test split is evaluated by "
            f"the ensemble), got {settings['split_to_aggregate']!r}"
        )
    common = set.intersection(*(set(m) for m in fold_metrics)) if fold_metrics else set()
    return {m: float(sum(f[m] for f in fold_metrics) / len(fold_metrics)) for m in sorted(common)}


def ensemble_settings(config: Dict[str, Any], sources: Optional[Dict[str, str]] = None) -> Dict[str, bool]:
    """``ensemble``'s ConcatenateEmbeddings arguments with PB's defaults."""
    where, out = _settings(config, "ensemble", sources, "ConcatenateEmbeddings", _DEFAULT_ENSEMBLE)
    for k, v in out.items():
        if not isinstance(v, bool):
            raise ConfigError(f"{where}.{k}: expected true or false, got {v!r}")
    return out


def split_settings(config: Dict[str, Any], sources: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    """``split_manager``'s ClassDisjointSplitManager arguments with PB's defaults (plus ours, ``test_classes``)."""
    where, out = _settings(config, "split_manager", sources, "ClassDisjointSplitManager", _DEFAULT_SPLIT)
    for k in ("test_size", "test_start_idx"):
        if not is_number(out[k]) or not 0 <= out[k] <= 1:
            raise ConfigError(f"{where}.{k}: expected a fraction of the classes in [0, 1], got {out[k]!r}")
    for k, low in (("num_training_partitions", 1), ("num_training_sets", 1), ("hierarchy_level", 0)):
        if not is_int(out[k]) or out[k] < low:
            raise ConfigError(f"{where}.{k}: expected a {('non-negative', 'positive')[low]} integer, got {out[k]!r}")
    if out["num_training_sets"] > out["num_training_partitions"]:
        raise ConfigError(
            f"{where}.num_training_sets: {out['num_training_sets']} is more than "
            f"num_training_partitions ({out['num_training_partitions']})"
        )
    names = out["test_classes"]
    if names is not None and not (isinstance(names, list) and names and all(isinstance(n, (str, int)) for n in names)):
        raise ConfigError(f"{where}.test_classes: expected a list of class names (or labels), got {names!r}")
    keys = out["data_and_label_getter_keys"]
    if keys is not None and not (
        isinstance(keys, list) and len(keys) == 2 and all(isinstance(x, (str, int)) for x in keys)
    ):
        raise ConfigError(
            f"{where}.data_and_label_getter_keys: expected null (items are (image, label)) or "
            f"[data_key, label_key], got {keys!r}"
        )
    return out


def data_and_label_getter(keys: Optional[Sequence[Any]]) -> Callable[[Any], Tuple[Any, Any]]:
    """``item -> (data, label)`` for PB's ``data_and_label_getter_keys`` (None: ``item[0], item[1]``)."""
    if keys is None:
        return lambda item: (item[0], item[1])
    a, b = keys

    def getter(item):
        if isinstance(item, (tuple, list)) and not (isinstance(a, int) and isinstance(b, int)):
            raise ConfigError(
                f"split_manager.ClassDisjointSplitManager.data_and_label_getter_keys: {list(keys)} names dict keys, "
                "but the dataset returns (image, label) tuples; set it to null"
            )
        return item[a], item[b]

    return getter


def label_level(labels, level: int, where: str = "split_manager.ClassDisjointSplitManager.hierarchy_level"):
    """Column ``level`` of ``[N, L]`` labels (``[N]`` labels have only level 0)."""
    import numpy as np

    labels = np.asarray(labels)
    if labels.ndim == 1:
        labels = labels[:, None]
    if not 0 <= level < labels.shape[1]:
        raise ConfigError(
            f"{where}: level {level} does not exist; the dataset's labels have {labels.shape[1]} level(s)"
        )
    return labels[:, level]


def splits_to_eval(config: Dict[str, Any], sources: Optional[Dict[str, str]] = None) -> List[str]:
    """PB's ``splits_to_eval`` (default ``[val]``)."""
    splits = config.get("splits_to_eval", ["val"])
    where = _where(sources, "splits_to_eval")
    val = hook_settings(config, sources)["validation_split_name"]
    if not isinstance(splits, list) or not all(s in ("train", "val") for s in splits) or val not in splits:
        raise ConfigError(
            f"{where}: expected a list of train/val holding {val!r} (the test split is evaluated once, "
            f"by the ensemble), got {splits!r}"
        )
    return list(dict.fromkeys(splits))


def hook_settings(config: Dict[str, Any], sources: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    """``hook_container``'s HookContainer arguments with PB's defaults."""
    where, out = _settings(config, "hook_container", sources, "HookContainer", _DEFAULT_HOOKS)
    if not isinstance(out["primary_metric"], str):
        raise ConfigError(f"{where}.primary_metric: expected a metric name, got {out['primary_metric']!r}")
    if out["validation_split_name"] != "val":
        raise ConfigError(
            f"{where}.validation_split_name: the splits here are train/val/test; got {out['validation_split_name']!r}"
        )
    if out["save_models"] is not True:
        raise ConfigError(f"{where}.save_models: must be true: the test step loads each fold's best saved model")
    return out


def primary_metric(config: Dict[str, Any], sources: Optional[Dict[str, str]] = None) -> str:
    """The metric that selects the best epoch (default MAP@R)."""
    return hook_settings(config, sources)["primary_metric"]


def flag(config: Dict[str, Any], key: str, sources: Optional[Dict[str, str]] = None) -> Any:
    """A ``config_general`` flag of :data:`_FLAGS` (PB's default when absent)."""
    default, allowed, reason = _FLAGS[key]
    value = config.get(key, default)
    where = _where(sources, key)
    if key != "api_parser" and not isinstance(value, bool):
        raise ConfigError(f"{where}: expected true or false, got {value!r}")
    if value not in allowed:
        raise ConfigError(f"{where}: {value!r} is not supported: {reason}")
    if key == "log_data_to_tensorboard" and value and importlib.util.find_spec("tensorboard") is None:  # not imported
        raise ConfigError(
            f"{where}: true needs the tensorboard package: pip install 'pml_extensions[tensorboard]' (or "
            "pip install tensorboard), or set it to false; the CSV and SQLite logs are always written"
        )
    return value


def record_keeper_options(config: Dict[str, Any], folder: str, sources: Optional[Dict[str, str]] = None):
    """record-keeper's ``save_lists`` and ``tensorboard_writer`` (None unless ``log_data_to_tensorboard``)."""
    writer = None
    if flag(config, "log_data_to_tensorboard", sources):
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(os.path.join(folder, "tensorboard"))
    return {"save_lists": bool(flag(config, "save_lists_in_db", sources)), "tensorboard_writer": writer}


def reuse_test_results(config: Dict[str, Any], folder: str, sources: Optional[Dict[str, str]] = None):
    """PB's ``skip_ensemble_eval_if_already_done``: the saved ``results.json["test"]``, else None."""
    path = os.path.join(folder, "results.json")
    if not flag(config, "skip_ensemble_eval_if_already_done", sources) or not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f).get("test")


#: PB's factory roles -> their default factory (``split_manager`` -> ``SplitManagerFactory``)
_FACTORY_ROLES = (
    "model loss miner sampler optimizer tester trainer transform split_manager record_keeper hook aggregator ensemble"
).split()
DEFAULT_FACTORIES = {role: "".join(w.title() for w in role.split("_")) + "Factory" for role in _FACTORY_ROLES}


def check_factories(config: Dict[str, Any], sources: Optional[Dict[str, str]] = None) -> None:
    """PB's ``factories``: only the default factory of each role."""
    for role, spec in (config.get("factories") or {}).items():
        where = _where(sources, f"factories.{role}")
        if role not in DEFAULT_FACTORIES:
            raise ConfigError(f"{where}: unknown factory role; choose from {', '.join(DEFAULT_FACTORIES)}")
        name = next(iter(spec)) if isinstance(spec, dict) and spec else spec
        if spec is not None and name != DEFAULT_FACTORIES[role]:
            raise ConfigError(
                f"{where}: custom factory {name!r} is not supported; register classes with "
                "pml_extensions.runner.register instead"
            )


def check_values(config: Dict[str, Any], sources: Optional[Dict[str, str]] = None) -> None:
    """Check every PB key at load time (before any training)."""
    check_single_class(config, sources)
    check_factories(config, sources)
    for key in _FLAGS:
        flag(config, key, sources)
    split_settings(config, sources)
    splits_to_eval(config, sources)
    tester_spec(config, sources)
    aggregate(config, [], sources)
    ensemble_settings(config, sources)


def check_single_class(config: Dict[str, Any], sources=None) -> None:
    """PB's plain merge of ``{Adam: ..}`` into ``{RMSprop: ..}`` keeps both; here an error naming ``~OVERRIDE~``."""

    def check(key, spec):
        if not isinstance(spec, dict) or len(spec) < 2:
            return
        classes = [k for k in spec if isinstance(k, str) and k[:1].isupper()]
        by_name = key == "dataset" and classes and {"name", "root", "kwargs"} & set(spec)
        if not by_name and not (len(classes) == len(spec)):
            return
        path = key.split(".")
        origin = {k: source_of(sources, path + [k]) for k in spec}
        newest = source_of(sources, path)
        new = [k for k in classes if origin[k] == newest]
        if by_name and not new:  # the dataset by name is the newest: it was merged next to the config's classes
            new = [k for k in spec if k not in classes]
        new = new or classes[-1:]
        old = [k for k in spec if k not in new]
        old_text = "a dataset by name" if by_name and not [k for k in old if k in classes] else ", ".join(old)
        new_text = "a dataset by name" if by_name and not [k for k in new if k in classes] else ", ".join(new)
        raise ConfigError(
            f"{_where(sources, key) if newest == 'config' else newest + ': ' + key}: {len(spec)} classes "
            f"({', '.join(map(str, spec))}): "
            + merged_next_to(new_text, newest, old_text, (origin[k] for k in old), path[-1])
        )

    for key in ONE_SPEC_KEYS + ("split_manager", "aggregator", "ensemble", "hook_container"):
        check(key, config.get(key))
    for key in NAMED_SPEC_KEYS:
        for name, spec in (config.get(key) or {}).items() if isinstance(config.get(key), dict) else ():
            check(f"{key}.{name}", spec)
