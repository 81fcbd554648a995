"""The index of every name a config may use and its keyword arguments, to check a config without importing torch;
built once and cached as JSON under a :func:`fingerprint` of the installed versions (registrations are read live).

Example::

    >>> entry = lookup("ContrastiveLoss")
    >>> entry["module"], "pos_margin" in entry["params"], "reducer" in entry["params"], entry["open"]
    ('pytorch_metric_learning.losses.contrastive_loss', True, True, False)
"""

import ast
import functools
import glob
import hashlib
import importlib
import inspect
import json
import os
import sys
import textwrap
from importlib import metadata
from typing import Any, Dict, List, Optional, Tuple

from ...utils.atomic_io import atomic_write_json
from . import registry

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
    following ``**kwargs`` passed to a base ``__init__`` along the MRO.

    Example::

        >>> from pytorch_metric_learning.losses import ContrastiveLoss
        >>> found = keyword_arguments(ContrastiveLoss)
        >>> found["params"][:2], "collect_stats" in found["params"], found["open"]
        (['pos_margin', 'neg_margin'], True, False)
    """
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
    for module_name in registry.SEARCH_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        for name in dir(module):
            obj = getattr(module, name, None)
            nameable = inspect.isclass(obj) or inspect.isfunction(obj) or inspect.isbuiltin(obj)
            if nameable and not name.startswith("_") and name not in objects:
                objects[name] = obj
    for name, obj in registry.package_classes().items():  # what registry.discover() makes nameable
        objects.setdefault(name, obj)
    names = {name: describe(obj) for name, obj in objects.items()}
    roles: Dict[str, Dict[str, str]] = {}
    for role in registry.ROLES:
        found = registry.classes_for_role(role, include_registered=False)
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
        try:
            if path:
                atomic_write_json(path, data, indent=None)
        except OSError:  # an unwritable cache folder only costs the next process the build
            pass
    return data


def lookup(name: str) -> Optional[Dict[str, Any]]:
    """The entry of ``name`` (:func:`describe`), registrations first; None when unknown."""
    if name not in registry._REGISTRY:
        return index()["names"].get(name)
    obj, role = registry._REGISTRY[name]
    if inspect.isclass(obj) and any(k.__name__ == "BaseTester" for k in inspect.getmro(obj)):
        role = "tester"  # registered without its role
    return {**describe(obj), **_role_extras(obj, role)}


def names_for_role(role: str) -> Dict[str, str]:
    """name -> module of the classes of ``role``, registrations first."""
    out = {n: getattr(o, "__module__", "") or "" for n, (o, r) in registry._REGISTRY.items() if r == role}
    for name, module in index()["roles"].get(role, {}).items():
        out.setdefault(name, module)
    return out


def all_names() -> List[str]:
    """Every name a config may use."""
    return sorted(set(index()["names"]) | set(registry._REGISTRY))
