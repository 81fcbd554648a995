"""One way to build objects from specs: the ``{ClassName: {kwargs}}`` entries of a merged config become the
datasets, transforms, trunk/embedder, losses (with nested wrappers), miners, optimizers, samplers, accuracy
calculators and testers of every protocol (:mod:`pml_extensions.runner.protocols`), plus ``prototype_init``.

Config keys read (powerful-benchmarker names): ``models`` (``trunk``, ``embedder``, others), ``loss_funcs``,
``mining_funcs``, ``sampler``, ``optimizers`` (``<model or loss name>_optimizer``), ``transforms`` (``train``,
``eval``), ``tester``, ``factories`` (only the default factory names), ``dataset``, ``dataset_root``, ``trainer``
(its ``iterations_per_epoch`` sizes the sampler); ours: ``normalize`` (mean/std appended after ``ToTensor``;
default ImageNet's, and then PIL images are converted to RGB first, so grayscale datasets meet RGB trunks),
``seed`` and ``prototype_init`` (``{method: kmeans|kcenter|random, num_batches: 4, batch_size: 32}``: the
trunk's HistogramPooling prototypes from its body's local features on training images; see
:meth:`Builder.prototype_init`). Loss specs whose class takes ``num_classes`` / ``embedding_size`` get the
training classes' count and the embedder's output width when the config leaves them out; model specs likewise
get ``num_classes``. XMLWrappers without a histogram layer are attached to the trunk's HistogramPooling
(:meth:`pml_extensions.losses.XMLWrapper.attach_all`).

Example::

    >>> b = Builder({"models": {"trunk": {"Flatten": {}}}, "loss_funcs": {"metric_loss": {"ContrastiveLoss": {}}}})
    >>> models = b.build_models(torch.zeros(2, 3, 3))
    >>> b.embedding_size, type(b.build_losses(models, 4)[0]["metric_loss"]).__name__
    (18, 'ContrastiveLoss')
"""

import inspect
from typing import Any, Callable, Dict, Optional

import torch

from ...datasets.normalization import IMAGENET_MEAN, IMAGENET_STD
from ..experiment import distributed as dist_utils
from .data import ToRGB
from ..errors import ConfigError, build, is_object_spec, resolve

DEFAULT_FACTORIES = {
    "model": "ModelFactory",
    "loss": "LossFactory",
    "miner": "MinerFactory",
    "sampler": "SamplerFactory",
    "optimizer": "OptimizerFactory",
    "tester": "TesterFactory",
    "trainer": "TrainerFactory",
    "transform": "TransformFactory",
    "split_manager": "SplitManagerFactory",
    "record_keeper": "RecordKeeperFactory",
    "hook": "HookFactory",
    "aggregator": "AggregatorFactory",
    "ensemble": "EnsembleFactory",
}
IMAGENET_NORMALIZE = {"mean": list(IMAGENET_MEAN), "std": list(IMAGENET_STD)}
PROTOTYPE_INIT_KEYS = ("method", "num_batches", "batch_size")


def accepts(cls, name: str) -> bool:
    try:
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind == p.VAR_KEYWORD for p in params.values())


def one_spec(spec, where):
    if not is_object_spec(spec):
        raise ConfigError(f"{where}: expected {{ClassName: {{kwargs}}}}, got {spec!r}")
    name, kwargs = next(iter(spec.items()))
    if kwargs is None:
        kwargs = {}
    if not isinstance(kwargs, dict):
        raise ConfigError(f"{where}.{name}: expected keyword arguments (a mapping), got {kwargs!r}")
    return name, kwargs


def pb_numbers(value):
    """powerful-benchmarker writes transform ranges as ``"0.16 1"``: turn such strings into number lists."""
    if isinstance(value, str):
        parts = value.split()
        try:
            nums = [float(p) if any(ch in p for ch in ".e") else int(p) for p in parts]
        except ValueError:
            return value
        return nums if len(nums) > 1 else nums[0]
    return value


class Builder:
    """Spec -> object for one merged config.

    Args:
        config: the merged config.
        sources: top-level key -> file, to name the file in error messages.
        device: where models and losses go (``torch.device``; default CPU).
        log: a print-like function (notes such as skipped optimizers).

    Attributes:
        embedding_size: the embedder's output width, set by :meth:`build_models`.

    Raises:
        ConfigError: one line naming the file and key for unknown classes, bad keywords and invalid values.
    """

    def __init__(
        self,
        config: Dict[str, Any],
        sources: Optional[Dict[str, str]] = None,
        device: Optional[torch.device] = None,
        log: Callable[..., None] = print,
    ):
        self.config = config
        self.sources = sources or {}
        self.device = torch.device("cpu") if device is None else torch.device(device)
        self.log = log
        self.embedding_size: Optional[int] = None
        self.check_factories()
        from ..config.registry import discover

        discover()  # pml_extensions classes not re-exported yet are still nameable in configs

    def where(self, key: str) -> str:
        return f"{self.sources.get(key.split('.')[0], 'config')}: {key}"

    def get(self, key: str, default: Any = None) -> Any:
        return self.config.get(key, default)

    def check_factories(self):
        factories = self.get("factories") or {}
        for role, spec in factories.items():
            if role not in DEFAULT_FACTORIES:
                raise ConfigError(
                    f"{self.where('factories.' + str(role))}: unknown factory "
                    f"role; choose from {', '.join(DEFAULT_FACTORIES)}"
                )
            if spec is None:
                continue
            name = next(iter(spec)) if isinstance(spec, dict) and spec else spec
            if name != DEFAULT_FACTORIES[role]:
                raise ConfigError(
                    f"{self.where('factories.' + role)}: custom factory "
                    f"{name!r} is not supported; register classes "
                    "with pml_extensions.runner.registry.register instead"
                )

    def _build(self, key: str, spec: Any, **extra):
        try:
            return build(spec, self.where(key), **extra)
        except ConfigError:
            raise
        except (ValueError, TypeError, FileNotFoundError, KeyError) as e:
            raise ConfigError(
                f"{self.where(key)}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            ) from e

    def _require(self, key: str):
        if key not in self.config:
            raise ConfigError(f"config: missing required key {key!r}")
        return self.config[key]

    # ---------------------------------------------------------------------------------------------- data
    def build_dataset(self):
        name, kwargs = one_spec(self._require("dataset"), self.where("dataset"))
        cls = resolve(name, self.where("dataset"))
        kwargs = dict(kwargs)
        if "root" not in kwargs and accepts(cls, "root"):
            if self.get("dataset_root"):
                kwargs["root"] = self.get("dataset_root")
            else:
                root_param = inspect.signature(cls).parameters.get("root")
                if getattr(root_param, "default", None) is inspect.Parameter.empty:
                    raise ConfigError(
                        f"{self.where('dataset')}.{name}: needs its data folder: pass --dataset_root "
                        "/path/to/data (nothing is downloaded)"
                    )
        if accepts(cls, "transform"):
            kwargs["transform"] = None
        return self._build("dataset", {name: kwargs})

    def build_transform(self, which: str):
        spec = (self.get("transforms") or {}).get(which)
        key = f"transforms.{which}"
        if spec is None:
            chain = []
        elif is_object_spec(spec) and next(iter(spec)) == "Compose":
            return self._build(key, spec)
        elif isinstance(spec, dict):
            chain = []
            for name, kwargs in spec.items():
                kwargs = {k: pb_numbers(v) for k, v in (kwargs or {}).items()}
                chain.append(self._build(f"{key}.{name}", {name: kwargs}))
        elif isinstance(spec, list):
            chain = [self._build(f"{key}[{i}]", s) for i, s in enumerate(spec)]
        else:
            raise ConfigError(f"{self.where(key)}: expected a mapping of transforms, got {spec!r}")
        import torchvision.transforms as T

        if not any(isinstance(t, (T.ToTensor, T.PILToTensor)) for t in chain):
            norm = self.get("normalize", IMAGENET_NORMALIZE)
            if norm and len(norm.get("mean", [])) == 3:
                chain.insert(0, ToRGB())  # grayscale datasets (glyphs, Fashion-MNIST) meet RGB trunks
            chain.append(T.ToTensor())
            if norm:
                chain.append(T.Normalize(**norm))
        return T.Compose(chain)

    # ---------------------------------------------------------------------------------------------- models
    # etc.
    def build_models(self, sample: torch.Tensor, num_classes: Optional[int] = None) -> Dict[str, torch.nn.Module]:
        """Trunk, embedder (``MLP`` sizes get the trunk width) and any other configured model.

        ``num_classes`` (the fold's training classes) is filled into model specs that take it and lack it
        (e.g. ``TemplateMatchingBlock``).
        """
        models_cfg = self._require("models")
        if "trunk" not in models_cfg:
            raise ConfigError(f"{self.where('models')}: missing key 'trunk'")
        if num_classes is not None:
            models_cfg = {
                k: self._fill(v, {"num_classes": int(num_classes)}, f"models.{k}") for k, v in models_cfg.items()
            }
        trunk = self._build_trunk(models_cfg["trunk"], "models.trunk").to(self.device)
        with torch.no_grad():
            was_training = trunk.training
            trunk.eval()
            out = trunk(sample[None].to(self.device))
            trunk.train(was_training)
        if out.ndim != 2:
            raise ConfigError(
                f"{self.where('models.trunk')}: the trunk must output "
                f"[N, D] vectors, got shape {tuple(out.shape)}; "
                "end it with a pooling layer, e.g. [..., AdaptiveAvgPool2d: [1], Flatten: {}]"
            )
        models = {"trunk": trunk}
        spec = models_cfg.get("embedder")
        if spec is None:
            models["embedder"] = torch.nn.Identity()
        else:
            name, kwargs = one_spec(spec, self.where("models.embedder"))
            cls = resolve(name, self.where("models.embedder"))
            kwargs = dict(kwargs)
            if "input_size" not in kwargs and "input_size" in getattr(inspect.signature(cls), "parameters", {}):
                kwargs["input_size"] = int(out.shape[1])
            models["embedder"] = self._build("models.embedder", {name: kwargs}).to(self.device)
        for k, spec in models_cfg.items():
            if k not in models:
                models[k] = self._build(f"models.{k}", spec).to(self.device)
        with torch.no_grad():
            was_training = models["embedder"].training
            models["embedder"].eval()
            self.embedding_size = int(models["embedder"](out).shape[1])
            models["embedder"].train(was_training)
        return models

    def _function_spec(self, spec):
        """``(name, function)`` for a powerful-benchmarker lower-case model-function spec ``{resnet50: {...}}``
        whose name resolves, else ``None`` (a plain mapping such as ``{layer_sizes: [...]}``)."""
        if not (isinstance(spec, dict) and len(spec) == 1):
            return None
        name, args = next(iter(spec.items()))
        if not (isinstance(name, str) and name[:1].islower() and (args is None or isinstance(args, dict))):
            return None
        try:
            return name, resolve(name, "config")
        except ConfigError:
            return None

    def _build_trunk(self, spec, key):
        """Like ``build``, plus powerful-benchmarker's lower-case model functions (``{resnet50: {..}}``,
        ``{mobilenet_v2_features: {pretrained: true}}``, also nested as arguments, e.g.
        ``{template_matching_trunk: {model: {mobilenet_v2_imagenet: {}}}}``) and lists / ``Sequential`` of such
        entries."""
        if isinstance(spec, list):
            return torch.nn.Sequential(*[self._build_trunk(s, f"{key}[{i}]") for i, s in enumerate(spec)])
        if isinstance(spec, dict) and len(spec) == 1:
            name, args = next(iter(spec.items()))
            if name == "Sequential" and isinstance(args, list):
                return self._build_trunk(args, f"{key}.Sequential")
            if isinstance(name, str) and name[:1].islower():
                fn = resolve(name, self.where(key))
                kwargs = {
                    k: self._build_trunk(v, f"{key}.{name}.{k}")
                    if self._function_spec(v)
                    else build(v, f"{key}.{name}.{k}")
                    for k, v in (args or {}).items()
                }
                try:
                    return fn(**kwargs)
                except (TypeError, ValueError, FileNotFoundError) as e:
                    raise ConfigError(f"{self.where(key)}.{name}: bad arguments: {str(e).splitlines()[0]}") from e
        return self._build(key, spec)

    def _fill(self, spec, fills, key):
        """Insert ``num_classes`` / ``embedding_size`` into nested specs (classes, or lower-case model functions)
        whose signature names them and that lack them."""
        function = self._function_spec(spec)
        if is_object_spec(spec) or function is not None:
            name, args = next(iter(spec.items()))
            if args is None or isinstance(args, dict):
                cls = function[1] if function is not None else resolve(name, self.where(key))
                try:
                    params = inspect.signature(cls).parameters
                except (TypeError, ValueError):
                    params = {}
                args = {k: self._fill(v, fills, f"{key}.{name}.{k}") for k, v in (args or {}).items()}
                for k, v in fills.items():
                    if k in params and k not in args:
                        args[k] = v
                return {name: args}
            return spec
        if isinstance(spec, list):
            return [self._fill(v, fills, key) for v in spec]
        if isinstance(spec, dict):
            return {k: self._fill(v, fills, f"{key}.{k}") for k, v in spec.items()}
        return spec

    def build_losses(self, models, num_classes: int):
        loss_funcs = {}
        fills = {"num_classes": int(num_classes), "embedding_size": int(self.embedding_size)}
        for k, spec in (self._require("loss_funcs") or {}).items():
            spec = self._fill(spec, fills, f"loss_funcs.{k}")
            loss_funcs[k] = self._build(f"loss_funcs.{k}", spec).to(self.device)
        from ...losses import XMLWrapper

        try:
            trunk = dist_utils.unwrap(models["trunk"])
            XMLWrapper.attach_all(loss_funcs, trunk)
            XMLWrapper.attach_heads(loss_funcs, trunk, dist_utils.unwrap(models["embedder"]))  # target="pooled"
        except ValueError as e:
            raise ConfigError(f"{self.where('loss_funcs')}: {e}") from None
        mining_funcs = {k: self._build(f"mining_funcs.{k}", v) for k, v in (self.get("mining_funcs") or {}).items()}
        return loss_funcs, mining_funcs

    def build_optimizers(self, models, loss_funcs):
        optimizers = {}
        for key, spec in (self.get("optimizers") or {}).items():
            if not str(key).endswith("_optimizer"):
                raise ConfigError(
                    f"{self.where('optimizers.' + str(key))}: optimizer names end in _optimizer, e.g. trunk_optimizer"
                )
            target = key[: -len("_optimizer")]
            owner = models.get(target, loss_funcs.get(target))
            if owner is None:
                raise ConfigError(
                    f"{self.where('optimizers.' + key)}: no model or loss called {target!r} "
                    f"(models: {', '.join(models)}; losses: {', '.join(loss_funcs)})"
                )
            params = [p for p in owner.parameters() if p.requires_grad]
            if not params:
                self.log(f"note: {key} skipped: {target} has no trainable parameters")
                continue
            optimizers[key] = self._build(f"optimizers.{key}", spec, params=params)
        return optimizers

    def build_sampler(self, labels, batch_size):
        spec = self.get("sampler")
        if spec is None:
            if dist_utils.is_active():
                return torch.utils.data.DistributedSampler(
                    range(len(labels)), shuffle=True, seed=int(self.get("seed") or 0)
                )
            return None
        name, kwargs = one_spec(spec, self.where("sampler"))
        cls = resolve(name, self.where("sampler"))
        kwargs = dict(kwargs)
        if accepts(cls, "labels"):
            kwargs.setdefault("labels", labels)
        if accepts(cls, "batch_size") and "batch_size" not in kwargs:
            kwargs["batch_size"] = batch_size
        ipe = self._trainer_kwargs().get("iterations_per_epoch")
        if ipe and accepts(cls, "length_before_new_iter") and "length_before_new_iter" not in kwargs:
            # one epoch's worth of indices (PML's default, 100k, is rebuilt in Python at every epoch)
            kwargs["length_before_new_iter"] = int(ipe) * int(batch_size)
        sampler = self._build("sampler", {name: kwargs})
        if dist_utils.is_active():
            sampler = dist_utils.DistributedBatchSliceSampler(sampler, batch_size)
        return sampler

    def _trainer_kwargs(self) -> Dict[str, Any]:
        return dict(one_spec(self._require("trainer"), self.where("trainer"))[1])

    def build_tester(self, **extra):
        """The config's ``tester`` (PML tester with its ``accuracy_calculator``; powerful-benchmarker's keys, see
        :func:`pml_extensions.runner.pb_keys.build_tester`) on this device; ``extra`` (e.g.
        ``end_of_testing_hook``) is passed on."""
        from ..config import pb_keys

        return pb_keys.build_tester(self.config, self.device, self.sources, **extra)

    # ---------------------------------------------------------------------------------------------- prototypes
    def prototype_init(self, models: Dict[str, torch.nn.Module], dataset, seed: Optional[int] = None) -> bool:
        """Initialise the trunk's HistogramPooling prototypes from data when the config has ``prototype_init``
        (``{method: kmeans|kcenter|random, num_batches: 4, batch_size: 32}``; the XML paper initialises them
        by k-means of the body's local features): ``num_batches`` batches of ``dataset`` (shuffled with a
        generator seeded by ``seed``, default the config's ``seed``) go through the trunk's body (its children
        before the layer), and :meth:`pml_extensions.trunks.HistogramPooling.init_from_data` picks the
        prototypes.

        Returns:
            True when prototypes were initialised, False when the config has no ``prototype_init``.

        Raises:
            ConfigError: unknown keys, a trunk without exactly one HistogramPooling as a direct child of a
            Sequential trunk, or a bad method.
        """
        spec = self.get("prototype_init")
        if not spec:
            return False
        key = "prototype_init"
        if not isinstance(spec, dict):
            raise ConfigError(f"{self.where(key)}: expected a mapping {{method: kmeans, num_batches: 4}}, got {spec!r}")
        unknown = sorted(set(spec) - set(PROTOTYPE_INIT_KEYS))
        if unknown:
            raise ConfigError(f"{self.where(key)}: unknown keys {unknown}; known: {', '.join(PROTOTYPE_INIT_KEYS)}")
        from ...trunks import find_histogram_layers, trunk_body

        trunk = dist_utils.unwrap(models["trunk"])
        layers = find_histogram_layers(trunk)
        if len(layers) != 1:
            raise ConfigError(
                f"{self.where(key)}: needs exactly one HistogramPooling in the trunk, found {len(layers)}"
            )
        seed = int(self.get("seed") or 0) if seed is None else int(seed)
        try:
            body = trunk_body(trunk, layers[0])
            loader = torch.utils.data.DataLoader(
                dataset,
                batch_size=int(spec.get("batch_size", 32)),
                shuffle=True,
                generator=torch.Generator().manual_seed(seed),
            )
            layers[0].init_from_data(
                body,
                loader,
                num_batches=int(spec.get("num_batches", 4)),
                method=spec.get("method", "kmeans"),
                seed=seed,
            )
        except ValueError as e:
            raise ConfigError(f"{self.where(key)}: {str(e).splitlines()[0]}") from None
        return True
