"""PB v0.9.33's evaluation keys (``tester``, its ``accuracy_calculator``, ``aggregator``, ``ensemble``), honoured as
in PB or refused with one line.

Example::

    >>> from pml_extensions.runner.config.eval_keys import ensemble_settings
    >>> ensemble_settings({"ensemble": {"ConcatenateEmbeddings": {"normalize_embeddings": False}}})
    {'normalize_embeddings': False, 'use_trunk_output': False}
"""

from typing import Any, Dict, Optional, Sequence, Tuple

from ...utils.checks import is_int
from ..errors import ConfigError
from .class_index import lookup, names_for_role
from .specs import nearest, one_spec  # noqa: F401  (nearest: also read from here)

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
    if not (isinstance(spec, dict) and len(spec) == 1):
        raise ConfigError(f"{where}: expected one {{ClassName: {{kwargs}}}}, got {spec!r}")
    name, kwargs = next(iter(spec.items()))
    kwargs = dict(kwargs or {})
    calculators = names_for_role("accuracy_calculator")
    if name not in calculators:
        raise ConfigError(f"{where}: unknown class {name!r}{nearest(name, calculators)}")
    metrics = lookup(name).get("metrics")  # None: a calculator that needs arguments; PML checks the names itself
    known = set(metrics or ()) | {"mean_reciprocal_rank"}
    for key in ("include", "exclude"):
        for metric in kwargs.get(key) or ():
            if metrics is not None and metric not in known:
                raise ConfigError(f"{where}.{name}.{key}: unknown metric {metric!r}{nearest(metric, known)}")
    return name, kwargs


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
