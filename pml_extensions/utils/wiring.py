"""What a method registers, on import, for whoever builds models and losses from specs (the runner's Builder never
imports a method, as timm's ``register_model``): :func:`after_losses` hooks, :func:`param_group` optimizer options
(``prototype_lr``), :func:`data_init` config keys (``prototype_init``) and :func:`unit_step` hooks, the steps of a
training unit that a method's config keys take part in (a distilling trainer's ``teacher``)."""

import dataclasses
from typing import Any, Callable, Dict, List

_AFTER_LOSSES: List[Callable[[Dict[str, Any], Dict[str, Any]], None]] = []
_PARAM_GROUPS: Dict[str, Callable[[Any], List[Any]]] = {}
_DATA_INIT: Dict[str, Callable[..., bool]] = {}
#: the steps of a training unit, in the order they run (:func:`unit_step`)
UNIT_STEPS = ("check", "train_set", "prepare", "reference", "describe")
_UNIT_STEPS: Dict[str, List[Callable]] = {step: [] for step in UNIT_STEPS}


class KeyProblem(ValueError):
    """A bad value of the config key ``key`` (dotted, e.g. ``trainer.Name.option``) raised by a :func:`unit_step` hook:
    the message without the file and key, which whoever calls the hook puts first."""

    def __init__(self, key: str, message: str):
        super().__init__(message)
        self.key = key


@dataclasses.dataclass
class Reference:
    """The reference side of an asymmetric test (a ``reference`` :func:`unit_step`): ``trunk`` + ``embedder`` embed
    ``datasets`` (split -> the tested split's items, in its order, with their own transform); ``words``: whose
    references they are, for notes (``"the teacher's references (transforms.reference)"``)."""

    trunk: Any
    embedder: Any
    datasets: Dict[str, Any]
    words: str

    def tester_kwargs(self) -> Dict[str, Any]:
        """The reference arguments of ``AsymmetricTester.test`` (pml_extensions.testers)."""
        return {
            "reference_trunk_model": self.trunk,
            "reference_embedder_model": self.embedder,
            "reference_dataset_dict": self.datasets,
        }


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


def unit_step(step: str) -> Callable:
    """Register ``fn`` (a decorator) for the step ``step`` of a training unit (the ``paired`` protocol's), so that the
    runner calls it without knowing the keys it reads. ``b`` is the unit's Builder, duck-typed (``config``, ``get``,
    ``where``, ``device``, ``build``, ``build_dataset``, ``build_transform``, ``subset``, ``spec_class``);
    ``load_run_models(path) -> (trunk, embedder)`` reads a finished run's checkpoint. The steps:

    - ``check(b, seeds, load_run_models, memo)``: the preflight's refusal of bad values; ``memo``: a set shared by
      the variants of one preflight (e.g. the checkpoints already loaded);
    - ``train_set(b, indices, labels, seed) -> dataset or None``: the training set instead of items ``indices`` of
      the transformed ``train`` split;
    - ``prepare(b, models, seed, load_run_models) -> (trainer models, trainer kwargs)``: called once the unit's models
      are built, before a resume loads a checkpoint's weights; what the trainer gets besides them;
    - ``reference(b, seed, split, source, indices, data, load_run_models) -> Reference or None``: the reference side
      of testing ``split`` (items ``indices`` of the config's split ``source``; ``data``: that split, built or None);
    - ``describe(builders) -> str``: a sentence about the variants (name -> Builder) for the results' header.

    Raises:
        ValueError: an unknown step (a hook refuses a bad value with :class:`KeyProblem`).
    """
    if step not in _UNIT_STEPS:
        raise ValueError(f"step must be one of {', '.join(UNIT_STEPS)}, got {step!r}")

    def register(fn):
        if fn not in _UNIT_STEPS[step]:
            _UNIT_STEPS[step].append(fn)
        return fn

    return register


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


def unit_steps(step: str) -> List[Callable]:
    """The hooks registered for the training unit's step ``step`` (:func:`unit_step`), in registration order."""
    return list(_UNIT_STEPS[step])
