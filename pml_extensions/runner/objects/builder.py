"""The one way to build an object: every object of every protocol comes from a :class:`Builder` (one spec parser, one
registry, one error format); the keys it reads are in ``docs/configs.md`` and ``docs/runner.md``.

Example::

    >>> b = Builder({"models": {"trunk": {"Flatten": {}}}, "loss_funcs": {"metric_loss": {"ContrastiveLoss": {}}}})
    >>> models = b.build_models(torch.zeros(2, 3, 3))
    >>> b.embedding_size, type(b.build_losses(models, 4)[0]["metric_loss"]).__name__
    (18, 'ContrastiveLoss')
"""

import contextlib
import inspect
from typing import Any, Callable, Dict, Optional

import numpy as np
import torch

from ...datasets.normalization import IMAGENET_MEAN, IMAGENET_STD
from ...utils import wiring
from ...utils.eval_mode import eval_mode
from ..config import pb_keys
from ..config.pb_keys import _TESTER, _where, accuracy_calculator_spec, tester_spec
from ..config.registry import discover, resolve
from ..config.specs import is_object_spec, one_spec, pb_numbers
from ..errors import ConfigError, MissingDataError, first_line
from ..experiment import distributed as dist_utils
from ..experiment.epoch_loop import EpochLoop
from ..experiment.folder import seed_everything
from . import preflight
from .data import Subset, ToRGB, dataset_labels
from .feature_cache import end_of_epoch_hook

PARAM_GROUP_KEYS = ("modules", "lr_multiplier")  # ours; every other key of a group goes to the optimizer


def _parameters(cls) -> Dict[str, inspect.Parameter]:
    try:
        return dict(inspect.signature(cls).parameters)
    except (TypeError, ValueError):
        return {}


def accepts(cls, name: str) -> bool:
    """Whether ``cls`` (a class or function) takes a keyword argument ``name`` (or any, ``**kwargs``)."""
    params = _parameters(cls)
    return name in params or any(p.kind == p.VAR_KEYWORD for p in params.values())


@contextlib.contextmanager
def _one_line(where: str):
    """The block's errors as one line at ``where``: ConfigError as raised, MissingDataError for a missing file,
    ConfigError for bad arguments (TypeError), a rejected value (ValueError, its own words) or a KeyError."""
    try:
        yield
    except ConfigError:
        raise
    except FileNotFoundError as e:
        raise MissingDataError(f"{where}: {first_line(e)}") from e
    except TypeError as e:
        raise ConfigError(f"{where}: bad arguments: {first_line(e)}") from e
    except (ValueError, KeyError) as e:
        kind = "" if isinstance(e, ValueError) else f"{type(e).__name__}: "
        raise ConfigError(f"{where}: {kind}{first_line(e)}") from e


def build(spec: Any, where: str = "config", **extra_kwargs) -> Any:
    """Recursively build ``spec``: ``{Name: {kwargs}}`` calls ``Name(**kwargs)``, ``{Name: [args]}`` ``Name(*args)``,
    ``{Name: null}`` ``Name()``, nested specs first; ``extra_kwargs`` go to the outermost call (e.g. ``params=``).
    Raises ConfigError naming ``where`` and the key, for unknown classes or bad arguments (:func:`_one_line`).

    Example::

        >>> build({"Linear": {"in_features": 2, "out_features": 3}}).weight.shape
        torch.Size([3, 2])
    """
    if is_object_spec(spec):
        name, args = next(iter(spec.items()))
        cls, inner = resolve(name, where), f"{where}.{name}"
        positional = args if isinstance(args, list) else [] if args is None or isinstance(args, dict) else [args]
        with _one_line(inner):  # e.g. a class rejecting a value (a negative ridge): its own words
            return cls(
                *[build(a, f"{inner}[{i}]") for i, a in enumerate(positional)],
                **{k: build(v, f"{inner}.{k}") for k, v in (args if isinstance(args, dict) else {}).items()},
                **extra_kwargs,
            )
    if isinstance(spec, list):
        return [build(v, f"{where}[{i}]") for i, v in enumerate(spec)]
    if isinstance(spec, dict):
        return {k: build(v, f"{where}.{k}") for k, v in spec.items()}
    return spec


def build_tester(config: Dict[str, Any], device, sources=None, sharded: bool = True, calculator_device=None, **extra):
    """:meth:`Builder.build_tester` of ``config`` on ``device``."""
    builder = Builder(config, sources, device, log=lambda *a, **k: None)
    return builder.build_tester(sharded=sharded, calculator_device=calculator_device, **extra)


class Builder:
    """Spec -> object for one merged config.

    Args:
        config: the merged config.
        sources: top-level key -> file, to name the file in error messages.
        device: where models and losses go (``torch.device``; default CPU).
        log: a print-like function (notes such as skipped optimizers).

    Attributes:
        embedding_size: the embedder's output width, set by :meth:`build_models` when it is given a sample.

    Every method raises ConfigError naming the file and key (:class:`~pml_extensions.runner.errors.MissingDataError`
    for missing data).
    """

    def __init__(self, config: Dict[str, Any], sources=None, device=None, log: Callable[..., None] = print):
        self.config = config
        self.sources = sources or {}
        self.device = torch.device("cpu") if device is None else torch.device(device)
        self.log = log
        self.embedding_size: Optional[int] = None
        self.frozen = None  # the trunk's frozen part when the config has feature_cache (.feature_cache.FrozenParts)
        pb_keys.check_factories(self.config, self.sources)
        discover()  # pml_extensions classes not re-exported yet are still nameable in configs

    def where(self, key: str) -> str:
        return _where(self.sources, key)

    def get(self, key: str, default: Any = None) -> Any:
        return self.config.get(key, default)

    def spec_class(self, key: str, default: Optional[str] = None) -> Any:
        """The class (or function) that the config's ``key`` (``{Name: kwargs}``, else ``default``) names."""
        return resolve(one_spec(self.get(key), self.where(key), default=default)[0], self.where(key))

    def build(self, key: str, spec: Any, **extra) -> Any:
        """Build ``spec`` (``{ClassName: kwargs}`` or ``{function_name: kwargs}``) with ``extra`` keyword arguments."""
        where = self.where(key)
        function = None if is_object_spec(spec) else self._function_spec(spec)
        if function is None:
            return build(spec, where, **extra)
        name, fn = function
        with _one_line(f"{where}.{name}"):  # a model function's ValueError: its own words
            kwargs = {k: build(v, f"{where}.{name}.{k}") for k, v in one_spec(spec, where)[1].items()}
            return fn(**kwargs, **extra)

    def _class_spec(self, key: str, spec: Any):
        name, kwargs = one_spec(spec, self.where(key))
        return name, resolve(name, self.where(key)), dict(kwargs)

    def _require(self, key: str):
        if key not in self.config:
            raise ConfigError(f"config: missing required key {key!r}")
        return self.config[key]

    def build_dataset(self, split: Optional[str] = None, transform=None, spec: Any = None, key: str = "dataset"):
        """The config's ``dataset`` (or ``spec``: ``{ClassName: kwargs}`` given ``dataset_root`` and ``split``, or a
        :func:`pml_extensions.datasets.get_dataset` name), untransformed unless ``transform`` is given."""
        spec = self._require(key) if spec is None else spec
        if isinstance(spec, str) or (isinstance(spec, dict) and "name" in spec):
            named = {"name": spec} if isinstance(spec, str) else dict(spec)
            unknown = sorted(set(named) - {"name", "root", "kwargs"})
            if unknown:
                raise ConfigError(
                    f"{self.where(key)}: unknown keys {unknown}; a dataset by name has name, root, kwargs"
                )
            root = named.get("root") or self.get("dataset_root")
            args = {"name": named["name"], "split": split or "all", "root": root, **dict(named.get("kwargs") or {})}
            dataset = self.build(key, {"get_dataset": args}, transform=transform)
        else:
            name, cls, kwargs = self._class_spec(key, spec)
            if "root" not in kwargs and accepts(cls, "root"):
                if self.get("dataset_root"):
                    kwargs["root"] = self.get("dataset_root")
                elif getattr(_parameters(cls).get("root"), "default", None) is inspect.Parameter.empty:
                    raise ConfigError(
                        f"{self.where(key)}.{name}: needs its data folder: pass --dataset_root "
                        "/path/to/data (nothing is downloaded)"
                    )
            if split is not None and "split" not in kwargs and accepts(cls, "split"):
                kwargs["split"] = split
            if accepts(cls, "transform"):
                kwargs["transform"] = transform  # the config's own is replaced
            elif transform is not None:
                raise ConfigError(f"{self.where(key)}.{name}: takes no transform")
            dataset = self.build(key, {name: kwargs})
        if self.get("skip_bad_images") is True:
            dataset = preflight.check_images(dataset, None, True, self.where(key), self.log)
        return dataset

    def build_transform(self, which: Optional[str] = None, spec: Any = None):
        """``transforms.<which>`` (or ``spec``): ``Compose`` as written; PB's mapping or list gets ``ToTensor`` and
        ``normalize`` appended when it has no ``ToTensor`` (and RGB conversion first for 3-channel statistics)."""
        import torchvision.transforms as T

        key = f"transforms.{which}" if which is not None else "transforms"
        spec = (self.get("transforms") or {}).get(which) if spec is None else spec
        if is_object_spec(spec) and next(iter(spec)) == "Compose":
            return self.build(key, spec)
        if isinstance(spec, dict):
            numbers = {name: {k: pb_numbers(v) for k, v in (kwargs or {}).items()} for name, kwargs in spec.items()}
            chain = [self.build(f"{key}.{name}", {name: kwargs}) for name, kwargs in numbers.items()]
        elif isinstance(spec, list):
            chain = [self.build(f"{key}[{i}]", s) for i, s in enumerate(spec)]
        elif spec is None:
            chain = []
        else:
            raise ConfigError(f"{self.where(key)}: expected a mapping of transforms, got {spec!r}")
        if not any(isinstance(t, (T.ToTensor, T.PILToTensor)) for t in chain):
            norm = self.get("normalize", {"mean": list(IMAGENET_MEAN), "std": list(IMAGENET_STD)})
            if norm and len(norm.get("mean", [])) == 3:
                chain.insert(0, ToRGB())  # grayscale datasets (glyphs, Fashion-MNIST) meet RGB trunks
            chain += [T.ToTensor()] + ([T.Normalize(**norm)] if norm else [])
        return T.Compose(chain)

    def build_models(
        self, sample=None, num_classes=None, spec=None, before=None, image=False, edit_trunk=None, cached=None
    ) -> Dict[str, torch.nn.Module]:
        """Trunk, embedder (``MLP`` sizes get the trunk width) and any other model of ``models`` (or ``spec``).

        Args:
            sample: one input ``[C, H, W]``: fills the first layer's missing ``in_channels``, probes the trunk and
                embedder (outputs must be ``[N, D]``), fills ``MLP``'s ``input_size`` and sets :attr:`embedding_size`.
            num_classes: filled into model specs that take it and lack it.
            before: called with each model's key right before it is built (e.g. to reseed).
            image: ``sample`` is an image even with ``feature_cache``: it goes through the frozen prefix first.
            edit_trunk: ``trunk -> trunk`` applied right after the whole trunk is built, before the cache split.
            cached: split the trunk for ``feature_cache`` (default: when the config has the key and ``spec`` is
                ``None``); ``models["trunk"]`` is then the trainable rest and :attr:`frozen` the frozen part.
        """
        before = before or (lambda key: None)
        models_cfg = self._require("models") if spec is None else spec
        if not isinstance(models_cfg, dict) or "trunk" not in models_cfg:
            raise ConfigError(f"{self.where('models')}: missing key 'trunk'")
        if num_classes is not None:
            models_cfg = {
                k: self._fill(v, {"num_classes": int(num_classes)}, f"models.{k}") for k, v in models_cfg.items()
            }
        if sample is not None and sample.ndim == 3:  # a first layer that leaves in_channels out takes the images'
            models_cfg = dict(models_cfg, trunk=preflight.fill_input_channels(models_cfg["trunk"], sample.shape[0]))
        before("trunk")
        trunk = self._build_trunk(models_cfg["trunk"], "models.trunk").to(self.device)
        trunk = edit_trunk(trunk) if edit_trunk is not None else trunk
        if (spec is None if cached is None else cached) and self.get("feature_cache") is not None:
            from .feature_cache import cache_spec, split_trunk_for_cache

            make_sequential = lambda: self.build("models.trunk", {"Sequential": []})  # noqa: E731
            cache = cache_spec(self.config, self.sources)
            self.frozen = split_trunk_for_cache(trunk, cache, self.where("feature_cache"), make_sequential)
            trunk = self.frozen.rest
            if sample is not None and image:
                with torch.no_grad():
                    sample = self.frozen.prefix(sample[None].to(self.device))[0]
        out = None
        if sample is not None:
            with torch.no_grad(), eval_mode(trunk):
                try:
                    out = trunk(sample[None].to(self.device))
                except RuntimeError as e:  # e.g. 3-channel images into a 1-channel trunk: one line, what to change
                    raise preflight.channel_mismatch(self, trunk, sample, e) from None
        models = {"trunk": trunk}
        before("embedder")
        if models_cfg.get("embedder") is None:
            models["embedder"] = torch.nn.Identity()
        else:
            name, cls, kwargs = self._class_spec("models.embedder", models_cfg["embedder"])
            if out is not None and "input_size" not in kwargs and "input_size" in _parameters(cls):
                kwargs["input_size"] = int(out.shape[1])
            models["embedder"] = self.build("models.embedder", {name: kwargs}).to(self.device)
        for k, other in models_cfg.items():
            if k not in models:
                before(k)
                models[k] = self.build(f"models.{k}", other).to(self.device)
        if out is not None:  # the embedding width; the outputs must end as [N, D]
            with torch.no_grad(), eval_mode(models["embedder"]):
                try:
                    emb = models["embedder"](out)
                except (RuntimeError, ValueError) as e:  # e.g. an MLP fed a feature map, a Linear of another width
                    if out.ndim == 2:
                        raise ConfigError(
                            f"{self.where('models.embedder')}: does not take the trunk's [N, {out.shape[1]}] output: "
                            f"{first_line(e)}"
                        ) from None
                    emb = out
            if emb.ndim != 2:
                pooled = "" if models_cfg.get("embedder") is None else " (or its embedder pool them)"
                raise ConfigError(
                    f"{self.where('models.trunk')}: the trunk must output [N, D] vectors{pooled}, got shape "
                    f"{tuple(out.shape)}; end it with a pooling layer, e.g. [..., AdaptiveAvgPool2d: [1], "
                    "Flatten: {}]"
                )
            self.embedding_size = int(emb.shape[1])
        return models

    def _function_spec(self, spec):
        """``(name, function)`` of a lower-case model-function spec ``{resnet50: {...}}`` that resolves, else None."""
        name, args = next(iter(spec.items())) if isinstance(spec, dict) and len(spec) == 1 else (None, None)
        if isinstance(name, str) and name[:1].islower() and (args is None or isinstance(args, dict)):
            with contextlib.suppress(ConfigError):
                return name, resolve(name, "config")
        return None

    def _build_trunk(self, spec, key):
        """:meth:`build` plus model functions run offline (``weights_path``: a local state dict), nested or listed."""
        if isinstance(spec, list):
            children = [self._build_trunk(s, f"{key}[{i}]") for i, s in enumerate(spec)]
            return self.build(key, {"Sequential": children})
        name, args = next(iter(spec.items())) if isinstance(spec, dict) and len(spec) == 1 else (None, None)
        if name == "Sequential" and isinstance(args, list):
            return self._build_trunk(args, f"{key}.Sequential")
        if not (isinstance(name, str) and name[:1].islower()):
            return self.build(key, spec)
        from ...utils.offline_weights import check_offline_weights, load_weights_file, no_downloads

        fn = resolve(name, self.where(key))  # an unknown name is an error here, not a plain mapping
        kwargs = {
            k: self._build_trunk(v, f"{key}.{name}.{k}") if self._function_spec(v) else build(v, f"{key}.{name}.{k}")
            for k, v in (args or {}).items()
        }
        where = f"{self.where(key)}.{name}"
        path = kwargs.pop("weights_path", None) if "weights_path" not in _parameters(fn) else None
        with _one_line(where):
            check_offline_weights(name, fn, kwargs, path)
            with no_downloads(where):
                model = self.build(key, {name: kwargs})
            return model if path is None else load_weights_file(model, str(path))

    def _fill(self, spec, fills, key):
        """``spec`` with ``fills`` inserted into the nested specs whose signature names them and that lack them."""
        function = self._function_spec(spec)
        if is_object_spec(spec) or function is not None:
            name, args = next(iter(spec.items()))
            if args is None or isinstance(args, dict):
                params = _parameters(function[1] if function is not None else resolve(name, self.where(key)))
                args = {k: self._fill(v, fills, f"{key}.{name}.{k}") for k, v in (args or {}).items()}
                return {name: dict(args, **{k: v for k, v in fills.items() if k in params and k not in args})}
            return spec
        if isinstance(spec, list):
            return [self._fill(v, fills, key) for v in spec]
        if isinstance(spec, dict):
            return {k: self._fill(v, fills, f"{key}.{k}") for k, v in spec.items()}
        return spec

    def build_losses(self, models, num_classes: Optional[int] = None, loss_funcs=None, mining_funcs=None):
        """``(loss_funcs, mining_funcs)`` (or the given specs) on this device, ``num_classes`` and
        :attr:`embedding_size` filled where taken, wired (:func:`pml_extensions.utils.wiring.wire`)."""
        fills = {"num_classes": num_classes, "embedding_size": self.embedding_size}
        fills = {k: int(v) for k, v in fills.items() if v is not None}
        specs = (self._require("loss_funcs") if loss_funcs is None else loss_funcs) or {}
        losses = {
            k: self.build(f"loss_funcs.{k}", self._fill(spec, fills, f"loss_funcs.{k}")).to(self.device)
            for k, spec in specs.items()
        }
        try:  # what the methods register (pml_extensions.utils.wiring), e.g. XMLWrapper finds its layer and head
            wiring.wire(losses, {k: dist_utils.unwrap(m) for k, m in models.items()})
        except ValueError as e:
            raise ConfigError(f"{self.where('loss_funcs')}: {e}") from None
        mining = (self.get("mining_funcs") if mining_funcs is None else mining_funcs) or {}
        return losses, {k: self.build(f"mining_funcs.{k}", v) for k, v in mining.items()}

    def build_optimizers(self, models, loss_funcs, spec: Optional[Dict[str, Any]] = None):
        """``<name>_optimizer`` of ``optimizers`` (or ``spec``) over the trainable parameters of the model or loss
        ``<name>``, with ``prototype_lr`` / ``param_groups`` (docs/configs.md); none for a frozen model (one note)."""
        optimizers = {}
        for key, opt_spec in ((self.get("optimizers") if spec is None else spec) or {}).items():
            where = f"optimizers.{key}"
            if not str(key).endswith("_optimizer"):
                raise ConfigError(f"{self.where(where)}: optimizer names end in _optimizer, e.g. trunk_optimizer")
            target = key[: -len("_optimizer")]
            owner = models.get(target, loss_funcs.get(target))
            if owner is None:
                raise ConfigError(
                    f"{self.where(where)}: no model or loss called {target!r} "
                    f"(models: {', '.join(models)}; losses: {', '.join(loss_funcs)})"
                )
            params = [p for p in owner.parameters() if p.requires_grad]
            if not params:
                self.log(f"note: {key} skipped: {target} has no trainable parameters")
                continue
            name, _, kwargs = self._class_spec(where, opt_spec)
            groups = self._param_groups(owner, params, kwargs, f"{where}.{name}")
            optimizers[key] = self.build(where, {name: kwargs}, params=groups)
        return optimizers

    def _param_groups(self, owner, params, kwargs, where):
        """``params`` grouped by ``prototype_lr`` / ``param_groups`` (popped from ``kwargs``); else the list."""
        rules = []  # (the group's parameters, its options)
        for option, members in wiring.param_groups().items():  # e.g. prototype_lr: the HistogramPooling prototypes
            lr = kwargs.pop(option, None)
            if lr is not None:
                rules.append((members(owner), {"lr": float(lr)}))
        for i, group in enumerate(kwargs.pop("param_groups", None) or []):
            here = self.where(f"{where}.param_groups[{i}]")
            if not isinstance(group, dict) or not isinstance(group.get("modules"), str):
                raise ConfigError(f"{here}: expected {{modules: ClassName, lr_multiplier: 10, ...}}")
            cls = resolve(group["modules"], here)
            options = {k: v for k, v in group.items() if k not in PARAM_GROUP_KEYS}
            if "lr_multiplier" in group:
                if "lr" not in kwargs:
                    raise ConfigError(f"{here}: lr_multiplier needs the optimizer's lr")
                options["lr"] = float(kwargs["lr"]) * float(group["lr_multiplier"])
            mine = [p for m in owner.modules() if isinstance(m, cls) for p in m.parameters() if p.requires_grad]
            rules.append((mine, options))
        if not rules:
            return params
        taken, groups = set(), []
        for mine, options in rules:
            mine = [p for p in mine if id(p) not in taken]
            taken |= {id(p) for p in mine}
            groups.append({"params": mine, **options})
        groups = [{"params": [p for p in params if id(p) not in taken]}] + groups
        return [g for g in groups if g["params"]]

    def build_lr_schedulers(self, optimizers, spec: Dict[str, Any]):
        """PB's ``lr_schedulers``: ``<model>_scheduler_by_<iteration|epoch|plateau>: {Class: kwargs}`` for
        ``<model>_optimizer``; a ``max_lr`` left out is the optimizer's learning rates (e.g. ``OneCycleLR``)."""
        schedulers = {}
        for key, sched_spec in (spec or {}).items():
            where = f"lr_schedulers.{key}"
            optimizer = optimizers.get(f"{str(key).split('_scheduler_by_')[0]}_optimizer")
            if "_scheduler_by_" not in str(key) or optimizer is None:
                raise ConfigError(
                    f"{self.where(where)}: expected <model>_scheduler_by_<iteration|epoch|plateau> for one of the "
                    f"optimizers {', '.join(optimizers)}"
                )
            name, cls, kwargs = self._class_spec(where, sched_spec)
            if "max_lr" not in kwargs and "max_lr" in _parameters(cls):
                kwargs["max_lr"] = [g["lr"] for g in optimizer.param_groups]
            schedulers[key] = self.build(where, {name: kwargs}, optimizer=optimizer)
        return schedulers

    def build_sampler(self, labels=None, batch_size=None, iterations_per_epoch=None, spec=None, split_over_ranks=True):
        """The config's ``sampler`` (or ``spec``) with ``labels``, ``batch_size`` and ``length_before_new_iter`` (one
        epoch: ``iterations_per_epoch``, default the trainer's, × ``batch_size``) filled when it takes them. Under
        torchrun (``split_over_ranks``) each rank gets its slice of each batch (no sampler: ``DistributedSampler``)."""
        spread = split_over_ranks and dist_utils.is_active()
        spec = self.get("sampler") if spec is None else spec
        if spec is None:
            seed = int(self.get("seed") or 0)
            return torch.utils.data.DistributedSampler(range(len(labels)), shuffle=True, seed=seed) if spread else None
        name, cls, kwargs = self._class_spec("sampler", spec)
        ipe = iterations_per_epoch
        if ipe is None and self.get("trainer") is not None:
            ipe = one_spec(self.get("trainer"), self.where("trainer"))[1].get("iterations_per_epoch")
        # length_before_new_iter: one epoch's worth of indices (PML's default, 100k, is rebuilt at every epoch)
        epoch = int(ipe) * int(batch_size) if ipe and batch_size else None
        for k, v in {"labels": labels, "batch_size": batch_size, "length_before_new_iter": epoch}.items():
            if v is not None and k not in kwargs and accepts(cls, k):
                kwargs[k] = v
        try:
            sampler = self.build("sampler", {name: kwargs})
        except AssertionError as e:  # PML's samplers check their arguments with assert
            classes = len(np.unique(np.asarray(labels))) if labels is not None else "?"
            raise ConfigError(
                f"{self.where('sampler')}.{name}: {e} (the labels hold {classes} classes; batch_size is {batch_size})"
            ) from e
        return dist_utils.DistributedBatchSliceSampler(sampler, batch_size) if spread else sampler

    def build_tester(self, spec: Any = None, sharded: bool = True, calculator_device=None, **extra):
        """The config's ``tester`` (or ``spec``) with its (or the top-level) ``accuracy_calculator``, on this device.
        PML's tester and calculator become their sharded subclasses (same numbers) unless ``sharded=False``.

        Args:
            calculator_device: where the calculator computes unless its spec names a ``device`` (default CPU).
            extra: passed to the tester, e.g. ``end_of_testing_hook``.
        """
        sources = self.sources
        tester = self.get("tester") if spec is None else spec
        if self.get("accuracy_calculator") is not None:  # also without a tester key (the default tester's)
            name, kwargs = one_spec(tester, self.where("tester"), default=_TESTER)
            if "accuracy_calculator" not in kwargs:
                tester = {name: dict(kwargs, accuracy_calculator=self.get("accuracy_calculator"))}
                sources = dict(sources, tester=sources.get("accuracy_calculator", sources.get("tester", "config")))
        name, kwargs = tester_spec(dict(self.config, tester=tester), sources)
        calc_name, calc_kwargs = accuracy_calculator_spec(kwargs, _where(sources, "tester") + f".{name}")
        calc_kwargs.setdefault("device", torch.device("cpu") if calculator_device is None else calculator_device)
        if sharded and calc_name == "AccuracyCalculator":
            calc_name, calc_kwargs = "ChunkedAccuracyCalculator", dict(calc_kwargs, distributed=True)
        calculator = self.build("tester.accuracy_calculator", {calc_name: calc_kwargs})
        kwargs = {"dataloader_num_workers": 0, **{k: v for k, v in kwargs.items() if k != "accuracy_calculator"}}
        if sharded and name == _TESTER:
            name = "ShardedGlobalEmbeddingSpaceTester"  # pml_extensions.testers: PML's class, every rank a shard
        return self.build("tester", {name: kwargs}, accuracy_calculator=calculator, data_device=self.device, **extra)

    def subset(self, dataset, indices, labels=None, transform=None, getter=None, rgb: bool = False):
        """A :class:`~.data.Subset` of ``dataset`` (``labels`` default: :func:`~.data.dataset_labels`)."""
        labels = dataset_labels(dataset) if labels is None else labels
        return Subset(dataset, indices, labels, transform, getter=getter, rgb=rgb)

    def build_trainer(self, spec: Any = None, default: str = "MetricLossOnly", **objects):
        """The config's ``trainer`` (or ``spec``, or ``{default: {}}``) called with the built ``objects``."""
        from pytorch_metric_learning.utils import common_functions as c_f

        name, kwargs = one_spec(self.get("trainer") if spec is None else spec, self.where("trainer"), default=default)
        # PML logs 'optimizers is missing "trunk_optimizer"' for every model without an optimizer; a model without
        # trainable parameters gets none on purpose (build_optimizers notes it): that line is dropped
        frozen = {
            f'optimizers is missing "{k}_optimizer"'
            for k, m in (objects.get("models") or {}).items()
            if f"{k}_optimizer" not in (objects.get("optimizers") or {})
            and not (isinstance(m, torch.nn.Module) and any(p.requires_grad for p in m.parameters()))
        }
        keep = lambda record: record.getMessage() not in frozen  # noqa: E731
        c_f.LOGGER.addFilter(keep)
        try:
            return self.build("trainer", {name: dict(kwargs)}, **objects)
        finally:
            c_f.LOGGER.removeFilter(keep)

    def train(
        self,
        ckpt,
        models: Dict[str, torch.nn.Module],
        loss_funcs: Dict[str, torch.nn.Module],
        mining_funcs: Dict[str, Any],
        dataset,
        batch_size: int,
        *,
        batch_where: str,
        extra_models: Optional[Dict[str, torch.nn.Module]] = None,
        extra_kwargs: Optional[Dict[str, Any]] = None,
        views=None,
        fresh_seed: Optional[int] = None,
        **loop_options: Any,
    ) -> EpochLoop:
        """Train ``models`` with the config's ``trainer`` (default ``MetricLossOnly``) on ``dataset`` in an
        :class:`~..experiment.epoch_loop.EpochLoop` (``loop_options``: its keyword arguments) that commits to ``ckpt``
        (a :class:`~..experiment.checkpoint.Checkpointer`) and resumes from it; returns the loop (``best``,
        ``trained``).

        Args:
            batch_size: the global batch, split over the torchrun processes (a ConfigError ``"<batch_where>: ..."``
                unless it divides); the sampler draws it from ``dataset.labels``, rebuilt every epoch.
            extra_models, extra_kwargs: added to the trainer's models and kwargs (e.g. a distilling trainer's
                teacher).
            views: the cached feature views (``set_epoch``) that ``dataset`` shows, or ``None``.
            fresh_seed: seeds the global RNGs when there is no checkpoint (a resumed stage gets its RNGs back).
        """
        world = dist_utils.world_size()  # under torchrun each process trains on its slice of every global batch
        if batch_size % world:
            raise ConfigError(f"{batch_where}: {batch_size} is not divisible by {world} processes")
        name, kwargs = one_spec(self.get("trainer"), self.where("trainer"), default="MetricLossOnly")
        kwargs = {**kwargs, **(extra_kwargs or {}), "batch_size": batch_size // world}
        optimizers = self.build_optimizers(models, loss_funcs)

        # A fresh sampler per epoch: PML's MPerClassSampler reorders its own label list in place, state that a
        # checkpoint would not hold; rebuilt from the (checkpointed) RNG, a resumed epoch draws the same batches.
        def new_sampler():
            return self.build_sampler(dataset.labels, batch_size, kwargs.get("iterations_per_epoch"))

        sampler = new_sampler()
        loop = EpochLoop(ckpt, models, optimizers, loss_funcs, **loop_options)
        if loop.resume() is None:
            seed_everything(fresh_seed)
        epoch_hook = lambda trainer: True  # noqa: E731
        if views is not None:  # epoch e trains on the views drawn for e completed epochs
            views.set_epoch(loop.start_epoch - 1)
            epoch_hook = end_of_epoch_hook(views)

        def make_trainer():
            return self.build_trainer(
                {name: kwargs},
                models={**dist_utils.wrap_models(models, self.device), **(extra_models or {})},
                optimizers=optimizers,
                loss_funcs=dist_utils.wrap_losses(loss_funcs),
                mining_funcs=mining_funcs,
                dataset=dataset,
                dataset_labels=dataset.labels,
                sampler=sampler,
                data_device=self.device,
                end_of_iteration_hook=loop.end_of_iteration,
                end_of_epoch_hook=epoch_hook,
            )

        loop.run(make_trainer, new_sampler)
        return loop

    def init_from_data(self, models: Dict[str, torch.nn.Module], dataset, seed=None, specs=None) -> bool:
        """Initialise parameters from ``dataset`` by the keys the methods register (e.g. ``prototype_init``;
        ``specs`` replace the config's); True when something was initialised."""
        seed = int(self.get("seed") or 0) if seed is None else int(seed)
        unwrapped = {k: dist_utils.unwrap(m) for k, m in models.items()}
        done = False
        for key, init in wiring.data_inits().items():
            try:
                done = init(unwrapped, dataset, seed, (specs or {}).get(key, self.get(key)), log=self.log) or done
            except ValueError as e:
                raise ConfigError(f"{self.where(key)}: {first_line(e)}") from None
        return done
