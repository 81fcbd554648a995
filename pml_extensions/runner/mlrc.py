"""The "Metric Learning Reality Check" (MLRC) protocol on PML 2.x, driven by a merged
powerful-benchmarker config.

Protocol (Musgrave, Belongie & Lim, "A Metric Learning Reality Check", ECCV 2020, Sec. 4;
powerful-benchmarker's ``metric-learning`` branch, rewritten here):

1. Class-disjoint split: the classes (sorted) in ``[test_start_idx, test_start_idx + test_size)``
   (fractions of the class count; default the second half) are the test set; the rest is the train/val pool.
2. ``num_training_partitions`` (default 4) class-disjoint folds of the pool: fold k validates on partition k
   and trains on the others; ``num_training_sets`` of them are trained (default all 4).
3. Each fold trains with the configured PML trainer; every ``save_interval`` epochs
   ``GlobalEmbeddingSpaceTester`` evaluates the validation classes (``eval_primary_metric``, default MAP@R);
   training stops when the primary metric has not improved for more than ``patience`` epochs or after
   ``num_epochs_train``. The best epoch's weights are kept per fold.
4. Test: each fold's best model embeds the test classes; reported are the mean over the folds of the separate
   models' metrics (``separate_<d>D``, "128D" in the paper) and the metrics of the concatenation of the
   L2-normalised embeddings (``concatenated_<k·d>D``, "512D"), both for every metric of
   ``eval_accuracy_calculator`` (MAP@R, P@1 and R-precision in the shipped configs).

Config keys read (powerful-benchmarker names): ``trainer``, ``num_epochs_train``, ``save_interval``,
``patience``, ``check_untrained_accuracy``, ``models`` (``trunk``, ``embedder``), ``loss_funcs``,
``mining_funcs``, ``sampler``, ``optimizers`` (``<model or loss name>_optimizer``), ``transforms`` (``train``,
``eval``), ``eval_*``, ``factories`` (only the default factory names are accepted), ``dataset``,
``dataset_root``, ``test_size``, ``test_start_idx``, ``num_training_partitions``, ``num_training_sets``; ours:
``seed`` (default 0), ``device`` (``auto``), ``normalize`` (mean/std appended after ``ToTensor``; default
ImageNet's, and then PIL images are converted to RGB first, so grayscale datasets meet RGB trunks). Loss specs
whose class takes ``num_classes`` / ``embedding_size`` (ProxyAnchor, ...) get the fold's number of training
classes and the embedder's output width when the config leaves them out; model specs likewise get
``num_classes``. ``test_hooks`` (ours): ``{name: {HookClass: {kwargs}}}`` run once after testing on fold 0's
best model as PML ``end_of_testing_hook``s (e.g. ``ExplanationHook``; see :meth:`MLRCRunner.run_test_hooks`).

Deviations from powerful-benchmarker, by design: a trunk whose output is a feature map must end in a pooling
layer (the configs list it); ``MLP`` layer sizes get the trunk's output width prepended automatically (as
upstream); only ``eval_reference_set: compared_to_self`` is supported; the runner seeds the global
torch/numpy/python RNGs at the start of each fold (``seed + fold``; PML's samplers draw from them) and
restores them on resume — set ``seed: null`` to leave them alone.
"""

import inspect
import json
import math
import os
import random
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np
import torch

from . import distributed as dist_utils
from .checkpoint import (
    Checkpointer,
    atomic_torch_save,
    atomic_write_text,
    load_weights,
    rng_state,
    set_rng_state,
)
from .factory import ConfigError, build, is_object_spec, resolve

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
IMAGENET_NORMALIZE = {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}
REPORT_METRICS = ("mean_average_precision_at_r", "precision_at_1", "r_precision")


# --------------------------------------------------------------------------------------------------------------------
# The split
def mlrc_class_splits(
    labels: Sequence[int],
    test_size: float = 0.5,
    test_start_idx: float = 0.5,
    num_training_partitions: int = 4,
) -> Dict[str, Any]:
    """Class-disjoint MLRC split.

    Args:
        labels: ``[N]`` integer class labels of the whole dataset.
        test_size, test_start_idx: fractions of the (sorted) class list; the test classes are
            ``classes[⌊start·C⌋ : ⌊(start + size)·C⌋]``. Default: the second half (with an odd count the test
            half gets the extra class).
        num_training_partitions: number of class-disjoint folds of the remaining classes (contiguous blocks of
        the sorted list, sizes differing by at most one).

    Returns:
        ``{"test": [classes], "trainval": [classes], "folds": [{"train": [classes], "val": [classes]},
        ...]}``.

    Raises:
        ValueError: on fractions outside [0, 1], fewer than 2 test classes, or fewer pool classes than 2 per
        fold.
    """
    classes = sorted(int(c) for c in np.unique(np.asarray(labels)))
    c = len(classes)
    if not (0 <= test_size <= 1 and 0 <= test_start_idx <= 1):
        raise ValueError(
            f"test_size and test_start_idx must be fractions in [0, 1], got {test_size}, {test_start_idx}"
        )
    start = int(math.floor(test_start_idx * c + 1e-9))
    stop = min(c, int(math.floor((test_start_idx + test_size) * c + 1e-9)))
    test = classes[start:stop]
    pool = classes[:start] + classes[stop:]
    if len(test) < 2:
        raise ValueError(f"the test split needs at least 2 classes, got {len(test)} of {c}")
    if num_training_partitions < 2 or len(pool) < 2 * num_training_partitions:
        raise ValueError(
            f"num_training_partitions must be >= 2 with >= 2 classes each; got {num_training_partitions} "
            f"partitions for {len(pool)} train/val classes"
        )
    parts = [list(map(int, p)) for p in np.array_split(np.asarray(pool), num_training_partitions)]
    folds = [
        {"train": [x for j, p in enumerate(parts) if j != k for x in p], "val": parts[k]}
        for k in range(num_training_partitions)
    ]
    return {"test": test, "trainval": pool, "folds": folds}


def ensemble_metrics(embeddings: List[torch.Tensor], labels: torch.Tensor, calculator) -> Dict[str, Any]:
    """MLRC test numbers from the k models' embeddings of the same test items.

    Args:
        embeddings: k tensors ``[N, d]`` (float), one per fold model, rows aligned.
        labels: ``[N]`` integer labels.
        calculator: a PML ``AccuracyCalculator`` (queries compared to themselves).

    Returns:
        ``{"separate_<d>D": mean over the k models of each metric, "concatenated_<k·d>D": metrics of
        ``cat([normalize(e) for e in embeddings], dim=1)``, "per_model": [k dicts]}`` — MLRC's "128D" and
        "512D".

    Raises:
        ValueError: on an empty list or embeddings with different shapes.
    """
    if not embeddings:
        raise ValueError("embeddings must hold at least one [N, d] tensor")
    if any(e.shape != embeddings[0].shape or e.ndim != 2 for e in embeddings):
        raise ValueError(
            f"embeddings must all be [N, d] with the same shape, got {[tuple(e.shape) for e in embeddings]}"
        )
    normalized = [torch.nn.functional.normalize(e.float(), dim=1) for e in embeddings]
    per_model = [{m: float(v) for m, v in calculator.get_accuracy(e, labels).items()} for e in normalized]
    d = embeddings[0].shape[1]
    separate = {m: float(np.mean([p[m] for p in per_model])) for m in per_model[0]}
    concat = torch.cat(normalized, dim=1)
    concatenated = {m: float(v) for m, v in calculator.get_accuracy(concat, labels).items()}
    return {
        f"separate_{d}D": separate,
        f"concatenated_{concat.shape[1]}D": concatenated,
        "per_model": per_model,
    }


# --------------------------------------------------------------------------------------------------------------------
class _Subset(torch.utils.data.Dataset):
    """Items ``indices`` of ``dataset`` with ``transform`` applied to the image; ``labels`` kept for
    samplers."""

    def __init__(self, dataset, indices, labels, transform):
        self.dataset = dataset
        self.indices = np.asarray(indices, dtype=np.int64)
        self.labels = np.asarray(labels)[self.indices]
        self.transform = transform

    def __len__(self):
        return len(self.indices)

    def __getitem__(self, i):
        item = self.dataset[int(self.indices[i])]
        image, label = item[0], item[1]
        if self.transform is not None:
            image = self.transform(image)
        return image, int(label)


class _ToRGB:
    """PIL images to mode RGB (other inputs unchanged)."""

    def __call__(self, image):
        convert = getattr(image, "convert", None)
        return convert("RGB") if convert is not None and getattr(image, "mode", "RGB") != "RGB" else image

    def __repr__(self):
        return "ToRGB()"


def _module_generators(modules: Dict[str, torch.nn.Module]) -> Dict[str, torch.Generator]:
    """Private ``torch.Generator`` attributes of the modules (e.g. ``XMLWrapper.generator``), by path, so a
    checkpoint also restores the losses' own random streams."""
    out = {}
    for key, module in modules.items():
        for path, m in dist_utils.unwrap(module).named_modules():
            for attr, value in vars(m).items():
                if isinstance(value, torch.Generator) and value.device.type == "cpu":
                    out[f"{key}.{path}.{attr}" if path else f"{key}.{attr}"] = value
    return out


def _dataset_labels(dataset) -> np.ndarray:
    labels = getattr(dataset, "labels", None)
    if labels is None:
        labels = getattr(dataset, "targets", None)
    if labels is None:
        labels = [dataset[i][1] for i in range(len(dataset))]
    return np.asarray(labels).astype(np.int64).reshape(-1)


def _accepts(cls, name: str) -> bool:
    try:
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind == p.VAR_KEYWORD for p in params.values())


def _one_spec(spec, where):
    if not is_object_spec(spec):
        raise ConfigError(f"{where}: expected {{ClassName: {{kwargs}}}}, got {spec!r}")
    name, kwargs = next(iter(spec.items()))
    if kwargs is None:
        kwargs = {}
    if not isinstance(kwargs, dict):
        raise ConfigError(f"{where}.{name}: expected keyword arguments (a mapping), got {kwargs!r}")
    return name, kwargs


def _numbers(value):
    """powerful-benchmarker writes transform ranges as ``"0.16 1"``: turn such strings into number lists."""
    if isinstance(value, str):
        parts = value.split()
        try:
            nums = [float(p) if any(ch in p for ch in ".e") else int(p) for p in parts]
        except ValueError:
            return value
        return nums if len(nums) > 1 else nums[0]
    return value


class MLRCRunner:
    """Run one experiment of the MLRC protocol (see the module docstring) from a merged config.

    Args:
        config: the merged dict from :func:`pml_extensions.runner.config_loader.load_config`.
        experiment_folder: output folder; rerunning with the same folder resumes (finished folds are skipped,
            the running fold continues from its last checkpoint).
        sources: top-level key -> file, to name the file in error messages.
        log: a print-like function.

    ``run() -> dict`` returns (and writes atomically to ``results.json``) the per-fold validation summary and
    the test metrics ``{"separate_<d>D": {...}, "concatenated_<D>D": {...}}``; it also writes ``report.html``.

    Raises:
        ConfigError: one line naming the file and key for unknown classes, bad keywords and invalid values.
    """

    def __init__(
        self,
        config: Dict[str, Any],
        experiment_folder: str,
        sources: Optional[Dict[str, str]] = None,
        log: Callable[[str], None] = print,
    ):
        self.config = config
        self.folder = experiment_folder
        self.sources = sources or {}
        self.log = log if dist_utils.is_main() else (lambda *a, **k: None)
        self.device = self._device()
        self._check_factories()
        from .registry import discover

        discover()  # pml_extensions classes not re-exported yet are still nameable in configs

    # ---------------------------------------------------------------------------------------------- config
    # helpers
    def where(self, key: str) -> str:
        return f"{self.sources.get(key.split('.')[0], 'config')}: {key}"

    def get(self, key: str, default: Any = None) -> Any:
        return self.config.get(key, default)

    def _device(self) -> torch.device:
        name = self.get("device", "auto") or "auto"
        if name == "auto":
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        else:
            try:
                device = torch.device(name)
            except (RuntimeError, TypeError) as e:
                raise ConfigError(f"{self.where('device')}: {e}") from None
        return dist_utils.device_for_rank(device)

    def _check_factories(self):
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
        name, kwargs = _one_spec(self._require("dataset"), self.where("dataset"))
        cls = resolve(name, self.where("dataset"))
        kwargs = dict(kwargs)
        if "root" not in kwargs and _accepts(cls, "root"):
            if self.get("dataset_root"):
                kwargs["root"] = self.get("dataset_root")
            else:
                root_param = inspect.signature(cls).parameters.get("root")
                if getattr(root_param, "default", None) is inspect.Parameter.empty:
                    raise ConfigError(
                        f"{self.where('dataset')}.{name}: needs its data folder: pass --dataset_root "
                        "/path/to/data (nothing is downloaded)"
                    )
        if _accepts(cls, "transform"):
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
                kwargs = {k: _numbers(v) for k, v in (kwargs or {}).items()}
                chain.append(self._build(f"{key}.{name}", {name: kwargs}))
        elif isinstance(spec, list):
            chain = [self._build(f"{key}[{i}]", s) for i, s in enumerate(spec)]
        else:
            raise ConfigError(f"{self.where(key)}: expected a mapping of transforms, got {spec!r}")
        import torchvision.transforms as T

        if not any(isinstance(t, (T.ToTensor, T.PILToTensor)) for t in chain):
            norm = self.get("normalize", IMAGENET_NORMALIZE)
            if norm and len(norm.get("mean", [])) == 3:
                chain.insert(0, _ToRGB())  # grayscale datasets (glyphs, Fashion-MNIST) meet RGB trunks
            chain.append(T.ToTensor())
            if norm:
                chain.append(T.Normalize(**norm))
        return T.Compose(chain)

    # ---------------------------------------------------------------------------------------------- models
    # etc.
    def build_models(
        self, sample: torch.Tensor, num_classes: Optional[int] = None
    ) -> Dict[str, torch.nn.Module]:
        """Trunk, embedder (``MLP`` sizes get the trunk width) and any other configured model.

        ``num_classes`` (the fold's training classes) is filled into model specs that take it and lack it
        (e.g. ``TemplateMatchingBlock``).
        """
        models_cfg = self._require("models")
        if "trunk" not in models_cfg:
            raise ConfigError(f"{self.where('models')}: missing key 'trunk'")
        if num_classes is not None:
            models_cfg = {
                k: self._fill(v, {"num_classes": int(num_classes)}, f"models.{k}")
                for k, v in models_cfg.items()
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
            name, kwargs = _one_spec(spec, self.where("models.embedder"))
            cls = resolve(name, self.where("models.embedder"))
            kwargs = dict(kwargs)
            if "input_size" not in kwargs and "input_size" in getattr(
                inspect.signature(cls), "parameters", {}
            ):
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

    def _build_trunk(self, spec, key):
        """Like ``build``, plus powerful-benchmarker's lower-case model functions (``{resnet50: {..}}``,
        ``{mobilenet_v2_features: {pretrained: true}}``) and lists / ``Sequential`` of such entries."""
        if isinstance(spec, list):
            return torch.nn.Sequential(*[self._build_trunk(s, f"{key}[{i}]") for i, s in enumerate(spec)])
        if isinstance(spec, dict) and len(spec) == 1:
            name, args = next(iter(spec.items()))
            if name == "Sequential" and isinstance(args, list):
                return self._build_trunk(args, f"{key}.Sequential")
            if isinstance(name, str) and name[:1].islower():
                fn = resolve(name, self.where(key))
                try:
                    return fn(**(args or {}))
                except (TypeError, ValueError, FileNotFoundError) as e:
                    raise ConfigError(
                        f"{self.where(key)}.{name}: bad arguments: {str(e).splitlines()[0]}"
                    ) from e
        return self._build(key, spec)

    def _fill(self, spec, fills, key):
        """Insert ``num_classes`` / ``embedding_size`` into nested specs whose class takes them but lacks
        them."""
        if is_object_spec(spec):
            name, args = next(iter(spec.items()))
            if args is None or isinstance(args, dict):
                cls = resolve(name, self.where(key))
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
        try:
            from .main_job import attach_histogram_layer

            attach_histogram_layer(loss_funcs, dist_utils.unwrap(models["trunk"]))
        except ConfigError as e:
            raise ConfigError(f"{self.where('loss_funcs')}: {e}") from None
        except ImportError:
            pass
        mining_funcs = {
            k: self._build(f"mining_funcs.{k}", v) for k, v in (self.get("mining_funcs") or {}).items()
        }
        return loss_funcs, mining_funcs

    def build_optimizers(self, models, loss_funcs):
        optimizers = {}
        for key, spec in (self.get("optimizers") or {}).items():
            if not str(key).endswith("_optimizer"):
                raise ConfigError(
                    f"{self.where('optimizers.' + str(key))}: optimizer "
                    "names end in _optimizer, e.g. trunk_optimizer"
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
        name, kwargs = _one_spec(spec, self.where("sampler"))
        cls = resolve(name, self.where("sampler"))
        kwargs = dict(kwargs)
        if _accepts(cls, "labels"):
            kwargs.setdefault("labels", labels)
        if _accepts(cls, "batch_size") and "batch_size" not in kwargs:
            kwargs["batch_size"] = batch_size
        ipe = self._trainer_kwargs().get("iterations_per_epoch")
        if ipe and _accepts(cls, "length_before_new_iter") and "length_before_new_iter" not in kwargs:
            # one epoch's worth of indices (PML's default, 100k, is rebuilt in Python at every epoch)
            kwargs["length_before_new_iter"] = int(ipe) * int(batch_size)
        sampler = self._build("sampler", {name: kwargs})
        if dist_utils.is_active():
            sampler = dist_utils.DistributedBatchSliceSampler(sampler, batch_size)
        return sampler

    def _trainer_kwargs(self) -> Dict[str, Any]:
        return dict(_one_spec(self._require("trainer"), self.where("trainer"))[1])

    def build_accuracy_calculator(self):
        spec = self.get("eval_accuracy_calculator") or {"AccuracyCalculator": {"k": "max_bin_count"}}
        name, kwargs = _one_spec(spec, self.where("eval_accuracy_calculator"))
        kwargs = dict(kwargs)
        kwargs.setdefault("device", torch.device("cpu"))
        return self._build("eval_accuracy_calculator", {name: kwargs})

    def build_tester(self):
        reference = self.get("eval_reference_set", "compared_to_self")
        if reference not in (None, "compared_to_self"):
            raise ConfigError(
                f"{self.where('eval_reference_set')}: only 'compared_to_self' is supported, got {reference!r}"
            )
        from pytorch_metric_learning.testers import GlobalEmbeddingSpaceTester

        return GlobalEmbeddingSpaceTester(
            normalize_embeddings=bool(self.get("eval_normalize_embeddings", True)),
            use_trunk_output=bool(self.get("eval_use_trunk_output", False)),
            batch_size=int(self.get("eval_batch_size", 32)),
            dataloader_num_workers=int(self.get("eval_dataloader_num_workers", 0)),
            data_device=self.device,
            accuracy_calculator=self.build_accuracy_calculator(),
        )

    # ----------------------------------------------------------------------------------------------
    # evaluation
    def primary_metric(self) -> str:
        return self.get("eval_primary_metric", "mean_average_precision_at_r")

    def evaluate(self, tester, dataset, models) -> Dict[str, float]:
        trunk, embedder = models["trunk"], models["embedder"]
        modes = (trunk.training, embedder.training)
        emb, labels = tester.get_all_embeddings(
            dataset, dist_utils.unwrap(trunk), dist_utils.unwrap(embedder)
        )
        trunk.train(modes[0])
        embedder.train(modes[1])
        acc = tester.accuracy_calculator.get_accuracy(emb, labels[:, 0])
        return {k: float(v) for k, v in acc.items() if isinstance(v, (int, float))}

    # ---------------------------------------------------------------------------------------------- one fold
    def _seed(self, fold: int):
        seed = self.get("seed", 0)
        if seed is None:
            return
        s = int(seed) + fold
        torch.manual_seed(s)
        np.random.seed(s)
        random.seed(s)

    def train_fold(self, fold: int, base, labels, split, transforms) -> Dict[str, Any]:
        fold_dir = os.path.join(self.folder, f"fold_{fold}")
        ckpt = Checkpointer(fold_dir, epoch_tables={"accuracies_val"})
        train_idx = np.nonzero(np.isin(labels, split["train"]))[0]
        val_idx = np.nonzero(np.isin(labels, split["val"]))[0]
        train_ds = _Subset(base, train_idx, labels, transforms["train"])
        val_ds = _Subset(base, val_idx, labels, transforms["eval"])

        trainer_name, trainer_kwargs = _one_spec(self._require("trainer"), self.where("trainer"))
        trainer_kwargs = dict(trainer_kwargs)
        global_batch = int(trainer_kwargs.get("batch_size", 32))
        if global_batch % dist_utils.world_size():
            raise ConfigError(
                f"{self.where('trainer')}: batch_size {global_batch} is "
                f"not divisible by {dist_utils.world_size()} processes"
            )
        trainer_kwargs["batch_size"] = global_batch // dist_utils.world_size()

        self._seed(fold)
        models = self.build_models(val_ds[0][0], len(split["train"]))
        loss_funcs, mining_funcs = self.build_losses(models, len(split["train"]))
        optimizers = self.build_optimizers(models, loss_funcs)
        sampler = self.build_sampler(train_ds.labels, global_batch)
        tester = self.build_tester()

        state = ckpt.resume()
        best = {"metric": -math.inf, "epoch": -1}
        start_epoch, finished = 1, False
        if state is not None:
            for k, m in models.items():
                m.load_state_dict(state["models"][k])
            for k, o in optimizers.items():
                o.load_state_dict(state["optimizers"][k])
            for k, l in loss_funcs.items():
                l.load_state_dict(state["loss_funcs"][k])
            best = {"metric": float(state["best_metric"]), "epoch": int(state["best_epoch"])}
            start_epoch, finished = int(state["epoch"]) + 1, bool(state["finished"])
            set_rng_state(state["rng"])
            for k, g in _module_generators(loss_funcs).items():
                if k in state.get("generators", {}):
                    g.set_state(state["generators"][k])
            self.log(
                f"fold {fold}: resuming after epoch {state['epoch']} "
                f"(best {best['metric']:.4f} at {best['epoch']})"
            )

        wrapped_models = dist_utils.wrap_models(models, self.device)
        wrapped_losses = dist_utils.wrap_losses(loss_funcs)
        rk = ckpt.record_keeper
        primary = self.primary_metric()
        best_path = os.path.join(fold_dir, "best.pth")

        def state_dict(epoch, global_iteration, finished_flag):
            return {
                "epoch": int(epoch),
                "global_iteration": int(global_iteration),
                "models": {k: m.state_dict() for k, m in models.items()},
                "optimizers": {k: o.state_dict() for k, o in optimizers.items()},
                "loss_funcs": {k: l.state_dict() for k, l in loss_funcs.items()},
                "best_metric": float(best["metric"]),
                "best_epoch": int(best["epoch"]),
                "finished": bool(finished_flag),
                "rng": rng_state(),
                "generators": {k: g.get_state() for k, g in _module_generators(loss_funcs).items()},
            }

        def validate(epoch):
            acc = self.evaluate(tester, val_ds, models)
            if primary not in acc:
                raise ConfigError(
                    f"{self.where('eval_primary_metric')}: {primary!r} "
                    f"is not computed; available: {', '.join(acc)}"
                )
            if dist_utils.is_main():
                rk.update_records({"accuracies_val": dict(acc, epoch=epoch)}, epoch)
            improved = acc[primary] > best["metric"]
            if improved:
                best.update(metric=acc[primary], epoch=epoch)
                if dist_utils.is_main():
                    atomic_torch_save({k: m.state_dict() for k, m in models.items()}, best_path)
            self.log(
                f"fold {fold} epoch {epoch}: val {primary}={acc[primary]:.4f}"
                + (" (best)" if improved else "")
            )
            return acc

        def commit(epoch, gi, finished_flag):
            if dist_utils.is_main():
                ckpt.commit(state_dict(epoch, gi, finished_flag))
            dist_utils.barrier()

        if state is None:
            if self.get("check_untrained_accuracy", True):
                validate(0)
            commit(0, 0, False)

        num_epochs = self.get("num_epochs_train", 1000)
        if isinstance(num_epochs, bool) or not isinstance(num_epochs, int) or num_epochs < 1:
            raise ConfigError(f"config_general: num_epochs_train must be a positive integer, got {num_epochs!r}")
        patience = self.get("patience", 9)
        save_interval = max(1, int(self.get("save_interval", 1)))
        if not finished and start_epoch <= num_epochs:

            def end_of_iteration(trainer):
                if dist_utils.is_main():
                    gi = trainer.get_global_iteration() + 1
                    # DistributedLossWrapper returns world_size x the loss (PML's convention): log the loss
                    # itself
                    w = dist_utils.world_size()
                    rk.update_records(
                        {"loss_histories": {k: v / w for k, v in trainer.loss_tracker.losses.items()}}, gi
                    )
                    rk.update_records(
                        {k: dist_utils.unwrap(v) for k, v in loss_funcs.items()},
                        gi,
                        recursive_types=[torch.nn.Module],
                    )

            trainer = self._build(
                "trainer",
                {trainer_name: trainer_kwargs},
                models=wrapped_models,
                optimizers=optimizers,
                loss_funcs=wrapped_losses,
                mining_funcs=mining_funcs,
                dataset=train_ds,
                dataset_labels=train_ds.labels,
                sampler=sampler,
                data_device=self.device,
                end_of_iteration_hook=end_of_iteration,
                end_of_epoch_hook=lambda trainer: True,
            )
            for epoch in range(start_epoch, num_epochs + 1):
                # A fresh sampler per epoch: PML's MPerClassSampler reorders its own label list in place,
                # state that a
                # checkpoint would not hold; rebuilt from the (checkpointed) RNG, a resumed epoch draws the
                # same batches.
                trainer.sampler = self.build_sampler(train_ds.labels, global_batch)
                trainer.train(start_epoch=epoch, num_epochs=epoch)
                gi = trainer.iterations_per_epoch * epoch
                if epoch % save_interval == 0 or epoch == num_epochs:
                    validate(epoch)
                stop = epoch == num_epochs or (patience is not None and epoch - best["epoch"] > int(patience))
                commit(epoch, gi, stop)
                if stop:
                    break
        return {
            "best_val_" + primary: best["metric"],
            "best_epoch": best["epoch"],
            "best_path": best_path,
            "val_classes": split["val"],
            "train_classes": split["train"],
        }

    # ---------------------------------------------------------------------------------------------- test
    def test(self, base, labels, classes, transforms, fold_results) -> Dict[str, Dict[str, float]]:
        test_idx = np.nonzero(np.isin(labels, classes))[0]
        test_ds = _Subset(base, test_idx, labels, transforms["eval"])
        tester = self.build_tester()
        calc = tester.accuracy_calculator
        embeddings, y = [], None
        for k, fr in enumerate(fold_results):
            if not os.path.exists(fr["best_path"]):
                raise ConfigError(
                    f"{self.where('check_untrained_accuracy')}: fold {k} has no evaluated model to test"
                )
            self._seed(k)
            models = self.build_models(test_ds[0][0], len(fr["train_classes"]))
            for name, sd in load_weights(fr["best_path"], self.device).items():
                models[name].load_state_dict(sd)
            emb, lab = tester.get_all_embeddings(test_ds, models["trunk"], models["embedder"])
            embeddings.append(emb)
            y = lab[:, 0]
            if k == 0 and dist_utils.is_main():
                self.run_test_hooks(test_ds, models)
        return ensemble_metrics(embeddings, y, calc)

    def run_test_hooks(self, test_ds, models) -> None:
        """Run the config's ``test_hooks`` (ours; e.g. ``{explanations: {ExplanationHook: {n_queries: 4}}}``)
        once on the test split with fold 0's best model, as PML ``end_of_testing_hook``s. Arguments the hook
        takes and the config leaves out are filled: ``trunk``, ``embedder``, ``dataset_dict``
        (``{"test": ...}``) and ``output_dir`` (``<experiment>/explanations``, which the report embeds)."""
        specs = self.get("test_hooks") or {}
        if not specs:
            return
        from pytorch_metric_learning.testers import GlobalEmbeddingSpaceTester

        fills = {
            "trunk": models["trunk"],
            "embedder": models["embedder"],
            "dataset_dict": {"test": test_ds},
            "output_dir": os.path.join(self.folder, "explanations"),
        }
        for key, spec in specs.items():
            name, kwargs = _one_spec(spec, self.where(f"test_hooks.{key}"))
            cls = resolve(name, self.where(f"test_hooks.{key}"))
            extra = {k: v for k, v in fills.items() if k not in (kwargs or {}) and _accepts(cls, k)}
            hook = self._build(f"test_hooks.{key}", {name: kwargs}, **extra)
            call = getattr(hook, "end_of_testing_hook", hook)
            tester = GlobalEmbeddingSpaceTester(
                normalize_embeddings=bool(self.get("eval_normalize_embeddings", True)),
                batch_size=int(self.get("eval_batch_size", 32)),
                dataloader_num_workers=int(self.get("eval_dataloader_num_workers", 0)),
                data_device=self.device,
                accuracy_calculator=self.build_accuracy_calculator(),
                end_of_testing_hook=call,
            )
            tester.test({"test": test_ds}, 0, models["trunk"], models["embedder"])

    # ---------------------------------------------------------------------------------------------- all
    def run(self) -> Dict[str, Any]:
        t0 = time.time()
        os.makedirs(self.folder, exist_ok=True)
        if dist_utils.is_main():
            import yaml

            atomic_write_text(
                os.path.join(self.folder, "config.yaml"), yaml.safe_dump(self.config, sort_keys=False)
            )
        base = self.build_dataset()
        labels = _dataset_labels(base)
        try:
            splits = mlrc_class_splits(
                labels,
                float(self.get("test_size", 0.5)),
                float(self.get("test_start_idx", 0.5)),
                int(self.get("num_training_partitions", 4)),
            )
        except ValueError as e:
            raise ConfigError(f"{self.where('num_training_partitions')}: {e}") from None
        num_sets = int(self.get("num_training_sets", len(splits["folds"])))
        if not 1 <= num_sets <= len(splits["folds"]):
            raise ConfigError(
                f"{self.where('num_training_sets')}: must be in [1, {len(splits['folds'])}], got {num_sets}"
            )
        transforms = {"train": self.build_transform("train"), "eval": self.build_transform("eval")}
        self.log(
            f"{len(labels)} items, {len(np.unique(labels))} classes; test "
            f"classes {splits['test'][0]}..{splits['test'][-1]}; {num_sets} folds"
        )
        fold_results = [
            self.train_fold(k, base, labels, splits["folds"][k], transforms) for k in range(num_sets)
        ]
        test = self.test(base, labels, splits["test"], transforms, fold_results)
        results = {
            "experiment_folder": os.path.abspath(self.folder),
            "primary_metric": self.primary_metric(),
            "folds": fold_results,
            "test": test,
            "test_classes": splits["test"],
            "seconds": time.time() - t0,
        }
        if dist_utils.is_main():
            atomic_write_text(os.path.join(self.folder, "results.json"), json.dumps(results, indent=2))
            try:
                from .report import write_report

                write_report(self.folder)
            except ImportError:
                pass
        dist_utils.barrier()
        return results
