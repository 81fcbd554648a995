"""The names a config may use (:func:`resolve`: user registrations, then :data:`SEARCH_MODULES` only, never an
arbitrary import path), the role of each class (:func:`classes_for_role`, by base class, not by name), and their
index with each one's keyword arguments (:func:`lookup`), to check a config without importing torch: built once and
cached as JSON under a :func:`fingerprint` of the installed versions (registrations are read live).

Example::

    >>> import torch
    >>> @register(role="model", name="TinyHead")
    ... class TinyHead(torch.nn.Linear):
    ...     pass
    >>> find("model", "TinyHead") is TinyHead, resolve("TinyHead") is TinyHead
    (True, True)
    >>> entry = lookup("ContrastiveLoss")
    >>> entry["module"], "pos_margin" in entry["params"], "reducer" in entry["params"], entry["open"]
    ('pytorch_metric_learning.losses.contrastive_loss', True, True, False)
"""

import ast
import contextlib
import difflib
import functools
import glob
import hashlib
import importlib
import inspect
import json
import os
import pkgutil
import sys
import textwrap
from importlib import metadata
from typing import Any, Dict, Iterable, Iterator, List, Optional, Tuple

from ...utils.atomic_io import atomic_write_json
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


def _imported(names: Iterable[str], errors=ImportError) -> Iterator[Any]:
    """The modules called ``names`` that import (``errors``: what an import that is skipped raises)."""
    for name in names:
        try:
            yield importlib.import_module(name)
        except errors:
            continue


def resolve(name: str, where: str = "config") -> Any:
    """The class or function called ``name``: a registration, else the first of :data:`SEARCH_MODULES` defining it.

    Raises:
        ConfigError: ``"<where>: unknown class 'X' (searched ...)"`` if no allowed module defines ``name``.
    """
    if name in _REGISTRY:
        return _REGISTRY[name][0]
    for module in _imported(SEARCH_MODULES):
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
    for package in _imported(SCANNED_PACKAGES, Exception):  # a broken sibling package must not break the registry
        infos = pkgutil.iter_modules(getattr(package, "__path__", []))
        names = [f"{package.__name__}.{i.name}" for i in infos if not i.name.startswith("_") and i.name != "cli"]
        for module in [package, *_imported(names, Exception)]:
            for name, obj in vars(module).items():
                if inspect.isclass(obj) and not name.startswith("_") and obj.__module__.startswith(package.__name__):
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
    for module in _imported(ROLE_MODULES[role], Exception):  # optional modules
        names = getattr(module, "__all__", None) or [n for n in vars(module) if not n.startswith("_")]
        for n in names:
            obj = getattr(module, n, None)
            origin = getattr(obj, "__module__", "") or ""
            if not include_stock and not origin.startswith("pml_extensions"):
                continue
            consider(n, obj, origin if origin.startswith("pml_extensions") else module.__name__)
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


INDEX_VERSION = 1  # bump when the index's layout changes
INDEXED_DISTRIBUTIONS = ("torch", "torchvision", "pytorch-metric-learning")
_TESTER_INTERNAL = "self data_device dtype end_of_testing_hook dataset_labels data_and_label_getter visualizer_hook"


def cache_dir() -> Optional[str]:
    """``$PML_EXTENSIONS_CACHE_DIR`` (``none``: memory only), else ``$XDG_CACHE_HOME`` or ``~/.cache``'s."""
    folder = os.environ.get("PML_EXTENSIONS_CACHE_DIR")
    if folder is not None:
        return None if folder.strip().lower() in ("", "none", "off") else folder
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "pml_extensions")


@functools.lru_cache(maxsize=None)
def fingerprint() -> str:
    """A hash of the versions and of every ``pml_extensions`` module's path, size and time (none imported)."""
    parts: List[Any] = [INDEX_VERSION, sys.version_info[:2]]
    for dist in INDEXED_DISTRIBUTIONS:
        try:
            parts.append((dist, metadata.version(dist)))
        except metadata.PackageNotFoundError:
            parts.append((dist, None))
    package = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for path in sorted(glob.glob(os.path.join(package, "**", "*.py"), recursive=True)):
        stat = os.stat(path)
        parts.append((os.path.relpath(path, package), stat.st_size, stat.st_mtime_ns))
    return hashlib.sha1(repr(parts).encode()).hexdigest()[:16]


def _forwards_kwargs(init) -> bool:
    """True when ``init`` passes its ``**kwargs`` to ``super().__init__`` or ``Base.__init__``."""
    try:
        fn = ast.parse(textwrap.dedent(inspect.getsource(init))).body[0]
    except (OSError, TypeError, SyntaxError, IndexError):
        return False
    if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) or fn.args.kwarg is None:
        return False
    for node in ast.walk(fn):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "__init__"):
            continue
        owner = node.func.value
        by_super = isinstance(owner, ast.Call) and getattr(owner.func, "id", None) == "super"
        if (by_super or isinstance(owner, (ast.Name, ast.Attribute))) and any(
            k.arg is None and getattr(k.value, "id", None) == fn.args.kwarg.arg for k in node.keywords
        ):
            return True
    return False


def _named(params) -> List[str]:
    return [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def keyword_arguments(obj: Any) -> Dict[str, Any]:
    """``{"params": [names], "open": bool}``: the keyword arguments ``obj`` takes (``open``: also any other),
    following ``**kwargs`` passed to a base ``__init__`` along the MRO."""
    names: List[str] = []

    def found(is_open: bool) -> Dict[str, Any]:
        return {"params": list(dict.fromkeys(names)), "open": is_open}

    for klass in inspect.getmro(obj) if inspect.isclass(obj) else ():
        if klass is object or (klass.__name__ == "Module" and klass.__module__ == "torch.nn.modules.module"):
            return found(False)
        if "__init__" not in vars(klass):
            if "__new__" in vars(klass):  # e.g. a named tuple: the signature is __new__'s
                break
            continue
        init = vars(klass)["__init__"]
        try:
            params = list(inspect.signature(init).parameters.values())[1:]  # less self
        except (TypeError, ValueError):
            return found(True)
        names += _named(params)
        if not any(p.kind == p.VAR_KEYWORD for p in params):
            return found(False)
        if not _forwards_kwargs(init):
            return found(True)
    try:  # a function, or a class whose signature is its __new__'s
        params = list(inspect.signature(obj).parameters.values())
    except (TypeError, ValueError):
        return found(True)
    names += _named(params)
    return found(any(p.kind == p.VAR_KEYWORD for p in params))


def tester_params(cls=None) -> Tuple[str, ...]:
    """The arguments of ``cls`` and PML's ``BaseTester`` less the runner's own, plus PB's ``reference_set``."""
    from pytorch_metric_learning.testers import BaseTester

    names = list(inspect.signature(BaseTester.__init__).parameters)
    for klass in getattr(cls, "__mro__", ()):
        init = vars(klass).get("__init__") if klass is not object else None
        if init is not None:
            names += _named(inspect.signature(init).parameters.values())
    return tuple(dict.fromkeys(p for p in names if p not in _TESTER_INTERNAL.split())) + ("reference_set",)


def _role_extras(obj: Any, role: Optional[str]) -> Dict[str, Any]:
    if role == "tester":
        return {"tester_params": list(tester_params(obj))}
    if role == "accuracy_calculator":
        try:
            return {"metrics": list(obj().get_curr_metrics())}
        except Exception:  # noqa: BLE001 - a calculator that needs arguments: its metrics stay unknown
            return {"metrics": None}
    return {}


def describe(obj: Any) -> Dict[str, Any]:
    """The index entry of one class or function: ``module``, ``kind``, ``params``, ``open``."""
    kind = "class" if inspect.isclass(obj) else "function"
    return {"module": getattr(obj, "__module__", "") or "", "kind": kind, **keyword_arguments(obj)}


def build_index() -> Dict[str, Any]:
    """``{"names": {name: entry}, "roles": {role: {name: module}}}``, by importing every search module (seconds)."""
    objects: Dict[str, Any] = {}
    for module in _imported(SEARCH_MODULES):
        for name in dir(module):
            obj = getattr(module, name, None)
            nameable = inspect.isclass(obj) or inspect.isfunction(obj) or inspect.isbuiltin(obj)
            if nameable and not name.startswith("_") and name not in objects:
                objects[name] = obj
    for name, obj in package_classes().items():  # what discover() makes nameable
        objects.setdefault(name, obj)
    names = {name: describe(obj) for name, obj in objects.items()}
    roles: Dict[str, Dict[str, str]] = {}
    for role in ROLES:
        found = classes_for_role(role, include_registered=False)
        roles[role] = {name: cls.__module__ for name, cls in found.items()}
        for name, cls in found.items():  # the object resolve() gives keeps the name
            names.setdefault(name, describe(cls)).update(_role_extras(cls, role))
    return {"names": names, "roles": roles}


@functools.lru_cache(maxsize=None)
def index() -> Dict[str, Any]:
    """The cached index of this :func:`fingerprint`, else built and saved."""
    folder = cache_dir()
    path = os.path.join(folder, f"class_index-{fingerprint()}.json") if folder else None
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, TypeError, ValueError):  # no cache folder, no file yet, or a broken one
        data = None
    if not (isinstance(data, dict) and "names" in data and "roles" in data):
        data = build_index()
        if path:
            with contextlib.suppress(OSError):  # an unwritable cache folder costs the next process the build
                atomic_write_json(path, data, indent=None)
    return data


def lookup(name: str) -> Optional[Dict[str, Any]]:
    """The entry of ``name`` (:func:`describe`), registrations first; None when unknown."""
    if name not in _REGISTRY:
        return index()["names"].get(name)
    obj, role = _REGISTRY[name]
    if inspect.isclass(obj) and any(k.__name__ == "BaseTester" for k in inspect.getmro(obj)):
        role = "tester"  # registered without its role
    return {**describe(obj), **_role_extras(obj, role)}


def names_for_role(role: str) -> Dict[str, str]:
    """name -> module of the classes of ``role``, registrations first."""
    out = {n: getattr(o, "__module__", "") or "" for n, (o, r) in _REGISTRY.items() if r == role}
    for name, module in index()["roles"].get(role, {}).items():
        out.setdefault(name, module)
    return out


def all_names() -> List[str]:
    """Every name a config may use."""
    return sorted(set(index()["names"]) | set(_REGISTRY))
