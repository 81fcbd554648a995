"""What a method registers, on import, for whoever builds models and losses from specs (the runner's Builder never
imports a method, as timm's ``register_model``): :func:`after_losses` hooks, :func:`param_group` optimizer options
(``prototype_lr``) and :func:`data_init` config keys (``prototype_init``)."""

from typing import Any, Callable, Dict, List

_AFTER_LOSSES: List[Callable[[Dict[str, Any], Dict[str, Any]], None]] = []
_PARAM_GROUPS: Dict[str, Callable[[Any], List[Any]]] = {}
_DATA_INIT: Dict[str, Callable[..., bool]] = {}


def after_losses(fn: Callable[[Dict[str, Any], Dict[str, Any]], None]) -> Callable:
    """Register ``fn(loss_funcs, models)`` (a decorator), called once both are built; ValueError: a loss they cannot
    serve."""
    if fn not in _AFTER_LOSSES:
        _AFTER_LOSSES.append(fn)
    return fn


def _register(table: dict, key: str) -> Callable:
    def register(fn):
        table[key] = fn
        return fn

    return register


def param_group(option: str) -> Callable:
    """Register ``fn(module) -> [parameters]`` for the optimizer option ``option`` (a decorator)."""
    return _register(_PARAM_GROUPS, option)


def data_init(key: str) -> Callable:
    """Register ``fn(models, dataset, seed, spec, log=None) -> bool`` for the config key ``key`` (a decorator)."""
    return _register(_DATA_INIT, key)


def wire(loss_funcs: Dict[str, Any], models: Dict[str, Any]) -> None:
    """Call every :func:`after_losses` hook (ValueError from a hook: a loss the models cannot serve)."""
    for fn in _AFTER_LOSSES:
        fn(loss_funcs, models)


def param_groups() -> Dict[str, Callable[[Any], List[Any]]]:
    """Optimizer option -> ``fn(module) -> [parameters]`` (:func:`param_group`)."""
    return dict(_PARAM_GROUPS)


def data_inits() -> Dict[str, Callable[..., bool]]:
    """Config key -> ``fn(models, dataset, seed, spec) -> bool`` (:func:`data_init`)."""
    return dict(_DATA_INIT)
