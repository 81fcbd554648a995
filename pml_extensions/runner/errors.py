"""Build objects from powerful-benchmarker-style specs: ``{ClassName: {kwargs}}``.

Class names resolve against a fixed set of modules only — pml_extensions, pytorch-metric-learning, torch and
torchvision — plus classes registered with :func:`register`. A config can never import an arbitrary path.
"""

import importlib
from typing import Any, Dict, Optional

# Searched in this order; the first module that has the name wins (ours shadow nothing: PML classes are re-exported
# as the same objects).
SEARCH_MODULES = (
    "pml_extensions.losses",
    "pml_extensions.trunks",
    "pml_extensions.trainers",
    "pml_extensions.testers",
    "pml_extensions.datasets",
    "pml_extensions.utils",
    "pytorch_metric_learning.miners",
    "pytorch_metric_learning.reducers",
    "pytorch_metric_learning.distances",
    "pytorch_metric_learning.regularizers",
    "pytorch_metric_learning.samplers",
    "pytorch_metric_learning.utils.accuracy_calculator",
    "pytorch_metric_learning.datasets",
    "torch.nn",
    "torch.optim",
    "torch.optim.lr_scheduler",
    "torchvision.models",
    "torchvision.transforms",
    "pml_extensions.runner.build.mlp",
    "pml_extensions.utils.chunked_accuracy_calculator",
    "pml_extensions.explain",
    "torchvision.datasets",
)

#: the one store of user registrations: config name -> (class or callable, role or None);
#: written only by :func:`pml_extensions.runner.registry.register`
_REGISTRY: Dict[str, Any] = {}


class ConfigError(ValueError):
    """A config problem; the message names the file (when known) and the key."""


def register(obj: Any = None, name: Optional[str] = None, *, role: Optional[str] = None) -> Any:
    """The same function as :func:`pml_extensions.runner.registry.register` (one store, :data:`_REGISTRY`)."""
    from .config.registry import register as _register

    return _register(obj, role=role, name=name)


def resolve(name: str, where: str = "config") -> Any:
    """Return the class or function called ``name`` from the registry or the search modules.

    Raises:
        ConfigError: if no allowed module defines ``name``.
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
        f"{where}: unknown class {name!r} (searched pml_extensions, pytorch_metric_learning, torch, torchvision)"
    )


def is_object_spec(spec: Any) -> bool:
    """True for a one-key dict whose key starts with an upper-case letter: ``{ClassName: kwargs}``."""
    return (
        isinstance(spec, dict)
        and len(spec) == 1
        and isinstance(next(iter(spec)), str)
        and next(iter(spec))[:1].isupper()
    )


def build(spec: Any, where: str = "config", **extra_kwargs) -> Any:
    """Recursively build ``spec``.

    ``{Name: {kwargs}}`` calls ``Name(**kwargs)``; ``{Name: [args]}`` calls ``Name(*args)``; ``{Name: null}`` calls
    ``Name()``. Nested specs inside kwargs, lists and dicts are built first. Other values are returned as they are.
    ``extra_kwargs`` are passed to the outermost call only (e.g. ``params=`` for optimizers).

    Raises:
        ConfigError: naming ``where`` and the key, for unknown classes or bad keyword arguments.
    """
    if is_object_spec(spec):
        name, args = next(iter(spec.items()))
        cls = resolve(name, where)
        inner = f"{where}.{name}"
        try:
            if args is None:
                return cls(**extra_kwargs)
            if isinstance(args, list):
                return cls(*[build(a, f"{inner}[{i}]") for i, a in enumerate(args)], **extra_kwargs)
            if isinstance(args, dict):
                kwargs = {k: build(v, f"{inner}.{k}") for k, v in args.items()}
                return cls(**kwargs, **extra_kwargs)
            return cls(build(args, inner), **extra_kwargs)
        except ConfigError:
            raise
        except TypeError as e:
            raise ConfigError(f"{inner}: bad arguments: {e}") from e
        except ValueError as e:  # the class rejected a value (e.g. a negative ridge)
            raise ConfigError(f"{inner}: {e}") from e
    if isinstance(spec, list):
        return [build(v, f"{where}[{i}]") for i, v in enumerate(spec)]
    if isinstance(spec, dict):
        return {k: build(v, f"{where}.{k}") for k, v in spec.items()}
    return spec
