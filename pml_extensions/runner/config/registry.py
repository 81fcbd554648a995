"""The names a config may use (:func:`resolve`: user registrations, then :data:`SEARCH_MODULES` only, never an
arbitrary import path) and the role of each class (:func:`classes_for_role`, by base class, not by name).

Example::

    >>> import torch
    >>> from pml_extensions.runner.config.registry import find, register, resolve
    >>> @register(role="model", name="TinyHead")
    ... class TinyHead(torch.nn.Linear):
    ...     pass
    >>> find("model", "TinyHead") is TinyHead, resolve("TinyHead") is TinyHead
    (True, True)
"""

import contextlib
import difflib
import functools
import importlib
import inspect
import pkgutil
import sys
from typing import Any, Dict, Iterable, Optional, Tuple

from ..errors import ConfigError
from .specs import nearest

#: config name -> (class or callable, role or None), written by :func:`register` and :func:`discover`
_REGISTRY: Dict[str, Tuple[Any, Optional[str]]] = {}

#: searched in this order by :func:`resolve` (ours shadow nothing: PML classes are re-exported as the same objects);
#: ``runner.objects.mlp`` is imported only when a config asks for ``MLP``
SEARCH_MODULES = tuple(
    """pml_extensions.losses pml_extensions.trunks pml_extensions.trainers pml_extensions.testers
    pml_extensions.datasets pml_extensions.utils pytorch_metric_learning.miners pytorch_metric_learning.reducers
    pytorch_metric_learning.distances pytorch_metric_learning.regularizers pytorch_metric_learning.samplers
    pytorch_metric_learning.utils.accuracy_calculator pytorch_metric_learning.datasets torch.nn torch.optim
    torch.optim.lr_scheduler torch.utils.data torchvision.models torchvision.transforms
    pml_extensions.runner.objects.mlp pml_extensions.knn pml_extensions.explain torchvision.datasets""".split()
)


#: the roles and the modules scanned for each, ours first
ROLE_MODULES: Dict[str, tuple] = {
    "loss": ("pml_extensions.losses", "pytorch_metric_learning.losses"),
    "miner": ("pytorch_metric_learning.miners",),
    "reducer": ("pytorch_metric_learning.reducers",),
    "distance": ("pytorch_metric_learning.distances",),
    "regularizer": ("pytorch_metric_learning.regularizers",),
    "model": ("pml_extensions.trunks", "pml_extensions.runner.objects.mlp", "torch.nn", "torchvision.models"),
    "trainer": ("pml_extensions.trainers", "pytorch_metric_learning.trainers"),
    "tester": ("pml_extensions.testers", "pytorch_metric_learning.testers"),
    "accuracy_calculator": ("pml_extensions.knn", "pytorch_metric_learning.utils.accuracy_calculator"),
    "hook": ("pml_extensions.explain", "pytorch_metric_learning.utils.logging_presets"),
    "dataset": ("pml_extensions.datasets", "pytorch_metric_learning.datasets", "torchvision.datasets"),
    "sampler": ("pytorch_metric_learning.samplers", "torch.utils.data"),
    "optimizer": ("torch.optim",),
    "lr_scheduler": ("torch.optim.lr_scheduler",),
    "transform": ("torchvision.transforms",),
}

ROLES = tuple(ROLE_MODULES)
#: sub-packages of pml_extensions scanned module by module, so a class is found before its package re-exports it
SCANNED_PACKAGES = tuple(f"pml_extensions.{p}" for p in "losses trunks trainers testers utils datasets explain".split())
#: roles whose type test is loose (any Module / any callable) take classes from their own modules only
ROLE_PLACES = {role: ROLE_MODULES[role] for role in ("model", "regularizer", "transform")}


def resolve(name: str, where: str = "config") -> Any:
    """The class or function called ``name``: a registration, else the first of :data:`SEARCH_MODULES` defining it.

    Raises:
        ConfigError: ``"<where>: unknown class 'X' (searched ...)"`` if no allowed module defines ``name``.
    """
    if name in _REGISTRY:
        return _REGISTRY[name][0]
    for module_name in SEARCH_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        obj = getattr(module, name, None)
        if obj is not None and callable(obj) and not name.startswith("_"):
            return obj
    raise ConfigError(
        f"{where}: unknown class {name!r}{_nearest_name(name)} (searched pml_extensions, pytorch_metric_learning, "
        "torch, torchvision)"
    )


def _nearest_name(name: str, known: Iterable[str] = ()) -> str:
    names = set(_REGISTRY) | set(known)
    for module_name in SEARCH_MODULES:
        module = sys.modules.get(module_name)
        if module is not None:
            names.update(n for n, o in vars(module).items() if not n.startswith("_") and callable(o))
    return nearest(name, names, cutoff=0.75, ignore_case=True)


@functools.lru_cache(maxsize=None)
def package_classes() -> Dict[str, Any]:
    """name -> every public class defined in a module of :data:`SCANNED_PACKAGES`."""
    found: Dict[str, Any] = {}
    for package_name in SCANNED_PACKAGES:
        try:
            package = importlib.import_module(package_name)
        except Exception:  # noqa: BLE001 - an optional or broken sibling package must not break the registry
            continue
        modules = [package]
        for info in pkgutil.iter_modules(getattr(package, "__path__", [])):
            if info.name.startswith("_") or info.name in ("cli", "__main__"):
                continue
            try:
                modules.append(importlib.import_module(f"{package_name}.{info.name}"))
            except Exception:  # noqa: BLE001
                continue
        for module in modules:
            for name, obj in vars(module).items():
                if inspect.isclass(obj) and not name.startswith("_") and obj.__module__.startswith(package_name):
                    found.setdefault(name, obj)
    return found


def discover() -> None:
    """Register the classes of :func:`package_classes` that :func:`resolve` cannot find."""
    for name, obj in package_classes().items():
        try:
            resolve(name)
        except ConfigError:
            _REGISTRY[name] = (obj, None)


def _role_test(role: str):
    import torch
    from pytorch_metric_learning import distances, losses, miners, reducers, testers, trainers
    from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator

    def _forward_takes_embeddings(cls) -> bool:  # forward(embeddings, labels, ...) like every PML loss
        try:
            return list(inspect.signature(cls.forward).parameters)[1:3] == ["embeddings", "labels"]
        except (TypeError, ValueError):
            return False

    if role == "loss":
        return lambda c: (
            issubclass(c, losses.BaseMetricLossFunction)
            or (
                issubclass(c, torch.nn.Module)
                and not issubclass(c, miners.BaseMiner)
                and (_forward_takes_embeddings(c) or c.__module__.startswith("pml_extensions.losses"))
            )
        )
    if role == "hook":
        hooks = ("end_of_testing_hook", "end_of_epoch_hook", "end_of_iteration_hook")
        return lambda c: any(callable(getattr(c, m, None)) for m in hooks)
    if role == "transform":
        return lambda c: True
    base = {
        "miner": miners.BaseMiner,
        "reducer": reducers.BaseReducer,
        "distance": distances.BaseDistance,
        "regularizer": torch.nn.Module,
        "model": torch.nn.Module,
        "trainer": trainers.BaseTrainer,
        "tester": testers.BaseTester,
        "accuracy_calculator": AccuracyCalculator,
        "dataset": torch.utils.data.Dataset,
        "sampler": torch.utils.data.Sampler,
        "optimizer": torch.optim.Optimizer,
        "lr_scheduler": torch.optim.lr_scheduler.LRScheduler,
    }[role]
    return lambda c: issubclass(c, base)


def _check_role(role: str) -> None:
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}; got {role!r}")


def register(obj: Any = None, *, role: Optional[str] = None, name: Optional[str] = None):
    """Make a class (or factory function) available under ``role`` and to configs as ``name`` (also a decorator).

    Args:
        obj: the class or callable.
        role: one of :data:`ROLES`; ``None`` registers for configs only (any role).
        name: the name configs use; default ``obj.__name__``.

    Returns:
        ``obj`` (or a decorator when ``obj`` is None).

    Raises:
        ValueError: on an unknown role. TypeError: if ``obj`` is not callable.
    """
    if role is not None:
        _check_role(role)
    if obj is None:
        return lambda o: register(o, role=role, name=name)
    if not callable(obj):
        raise TypeError(f"obj must be a class or callable, got {type(obj).__name__}")
    _REGISTRY[name or obj.__name__] = (obj, role)
    return obj


def classes_for_role(role: str, include_stock: bool = True, include_registered: bool = True) -> Dict[str, Any]:
    """All classes found under ``role``.

    Args:
        role: one of :data:`ROLES`.
        include_stock: also list the stock (non-``pml_extensions``) classes.
        include_registered: also list this process's :func:`register` calls (False for the class index).

    Returns:
        name -> class: registrations, then every class of ``pml_extensions``, then the stock :data:`ROLE_MODULES`.

    Raises:
        ValueError: on an unknown role.
    """
    _check_role(role)
    test = _role_test(role)
    found: Dict[str, Any] = {n: o for n, (o, r) in _REGISTRY.items() if r == role} if include_registered else {}

    def consider(name, obj, module_name):
        if name in found or not inspect.isclass(obj) or name.startswith("_"):
            return
        if role in ROLE_PLACES and not any(module_name.startswith(p) for p in ROLE_PLACES[role]):
            return
        with contextlib.suppress(TypeError):
            if test(obj):
                found[name] = obj

    for name, obj in package_classes().items():
        consider(name, obj, obj.__module__)
    for module_name in ROLE_MODULES[role]:
        try:
            module = importlib.import_module(module_name)
        except Exception:  # noqa: BLE001 - optional modules
            continue
        names = getattr(module, "__all__", None) or [n for n in vars(module) if not n.startswith("_")]
        for n in names:
            obj = getattr(module, n, None)
            origin = getattr(obj, "__module__", "") or ""
            if not include_stock and not origin.startswith("pml_extensions"):
                continue
            consider(n, obj, origin if origin.startswith("pml_extensions") else module_name)
    return found


def find(role: str, name: str) -> Any:
    """The class called ``name`` under ``role``.

    Raises:
        ValueError: on an unknown role. ConfigError: if no class of that role has that name.
    """
    classes = classes_for_role(role)
    if name in classes:
        return classes[name]
    close = difflib.get_close_matches(str(name), sorted(classes), n=3, cutoff=0.5)
    sample = ", ".join(close or sorted(classes)[:12])
    raise ConfigError(
        f"{role}: unknown class {name!r}; {'did you mean' if close else 'known classes include'} {sample}"
        f"{'?' if close else ', ... (run --list ' + role + ')'}"
    )
