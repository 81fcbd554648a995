"""One (variant, seed) unit of the ``paired`` protocol: build, train, select on validation, test once.

Pairing: the global RNGs are re-seeded before each module is built (trunk ``seed``, embedder ``seed + 1``, losses
``seed + 2``; ``HistogramPooling`` prototypes draw from their own generator) and with ``seed + 3`` before training,
so every variant of a seed starts from the same weights for the modules it shares and sees the same batches.
"""

import os
import time
from typing import Any, Callable, Dict, Optional

import numpy as np
import torch

from ....trunks import find_histogram_layers
from ....utils import wiring
from ....utils.atomic_io import atomic_torch_save
from ...errors import ConfigError
from ...experiment import distributed as dist_utils
from ...experiment.checkpoint import Checkpointer, load_weights_into
from ...experiment.folder import seed_everything
from ...objects.builder import Builder
from ...objects.data import dataset_labels, validation_rows, validation_split
from ...objects.feature_cache import FeatureCaches, cache_folder, cache_spec
from ...objects.saved_models import load_models as load_run_models

#: the test rows' metrics, as protocol.METRICS (which this module cannot import: protocol imports it lazily)
METRICS = ("mean_average_precision_at_r", "precision_at_1", "r_precision")


def load_split(
    cfg: Dict[str, Any], split: str, train_transform: bool, builder=None, seed=0, rank=None, world_size=None
):
    """The dataset ``split`` of ``cfg`` (built by ``builder``) with its train or eval transform; with ``feature_cache``
    its cached prefix outputs (part ``train``: ``num_views`` views drawn with ``seed``), built first when missing; with
    ``rank`` / ``world_size`` only that shard is built and ``(folder, complete)`` returned."""
    b = builder if builder is not None else Builder(cfg)
    transform = b.build_transform("train" if train_transform else "eval")
    if cfg.get("feature_cache") is None:
        return b.build_dataset(split, transform=transform)
    if b.frozen is None:
        b.build_models()
    caches = FeatureCaches(b, "", b.log)
    part = "train" if train_transform else ("train_eval" if split == "train" else split)
    source = b.build_dataset(split)
    args = (part, b.frozen, source, transform, caches.spec["num_views"] if train_transform else 1)
    if rank is not None or world_size is not None:
        return caches.build(*args, rank=rank, world_size=world_size)
    cached = caches.dataset(*args, seed=seed)
    from ....explain.explanation_hook import dataset_class_names

    names = dataset_class_names(source)
    if names is not None:  # the cached features keep the images' class names (figures and examples name classes)
        cached.classes = names
    return cached


def resolve_cache_folder(cfg: Dict[str, Any], experiment_folder: str) -> Dict[str, Any]:
    """``cfg`` with ``feature_cache.folder`` made absolute (default ``<experiment_folder>/feature_cache``)."""
    spec = cache_spec(cfg)
    if spec is None:
        return cfg
    return {**cfg, "feature_cache": {**cfg["feature_cache"], "folder": cache_folder(spec, experiment_folder)}}


def hooks(b: Builder, step: str, *args) -> list:
    """What the hooks that the methods register for the unit's step ``step`` return, each called with ``(b, *args)``
    (:func:`pml_extensions.utils.wiring.unit_step`: e.g. a distilling trainer's ``teacher``); a hook's refusal of a
    value as a ConfigError naming the file and key."""
    try:
        return [fn(b, *args) for fn in wiring.unit_steps(step)]
    except wiring.KeyProblem as e:
        raise ConfigError(f"{b.where(e.key)}: {e}") from None


def reference_side(b: Builder, seed: int, split: str, source: str, indices, data=None) -> Optional[wiring.Reference]:
    """The reference side of testing ``split`` (items ``indices`` of the config's split ``source``; ``data``: that
    split, already built) that a method sets (e.g. the ``teacher`` of ``seed``), else None (the tested model on both
    sides)."""
    sides = hooks(b, "reference", seed, split, source, indices, data, load_run_models)
    return next((side for side in sides if side is not None), None)


def build_models(
    cfg: Dict[str, Any],
    seed: int,
    device: torch.device,
    init_set=None,
    builder: Optional[Builder] = None,
    num_classes: Optional[int] = None,
    losses: bool = True,
) -> Dict[str, Any]:
    """Trunk, embedder and losses of one variant, paired by seed (see the module docstring). ``init_set``: the
    training part with the eval transform (probes the trunk, feeds ``prototype_init``); ``losses=False``: no losses."""
    b = builder if builder is not None else Builder(cfg, device=device)
    offsets = {"trunk": 0, "embedder": 1}
    reseed = lambda key: seed_everything(seed + offsets[key]) if key in offsets else None  # noqa: E731
    models = b.build_models(init_set[0][0] if init_set is not None else None, num_classes, before=reseed)
    trunk = models["trunk"]
    frozen = b.frozen  # with feature_cache: the trunk's frozen prefix (the trunk is its rest)
    seed_everything(seed + 2)
    loss_funcs, mining_funcs = b.build_losses(models, num_classes) if losses else ({}, {})
    pools = find_histogram_layers(trunk)
    for pool in pools:  # own generator: the global RNG stays where the variant without prototypes has it
        pool.reset_parameters(torch.Generator().manual_seed(seed))
        pool.to(device)
    init = cfg.get("prototype_init")
    if pools and init:  # variants without HistogramPooling (GAP) share the key and skip it
        if init_set is None:
            raise ConfigError(f"{b.where('prototype_init')}: needs the training images (init_set)")
        spec = {"batch_size": int(cfg["batch_size"]), **(init if isinstance(init, dict) else {})}
        b.init_from_data({"trunk": trunk}, init_set, seed=seed, specs={"prototype_init": spec})
    return {**models, "loss_funcs": loss_funcs, "mining_funcs": mining_funcs, "frozen": frozen}


def networks(models: Dict[str, Any]) -> Dict[str, torch.nn.Module]:
    """The networks of :func:`build_models`' result (trunk, embedder and any other model)."""
    return {k: v for k, v in models.items() if k not in ("loss_funcs", "mining_funcs", "frozen")}


def train_and_select(
    name: str,
    cfg: Dict[str, Any],
    seed: int,
    stage_dir: str,
    device: torch.device,
    log: Callable = print,
    sources: Optional[Dict[str, str]] = None,
    keep_epochs: bool = False,
) -> Dict[str, Any]:
    """Train one variant at one seed, validating every epoch on the validation classes (never the test split;
    ``keep_epochs``: every validated epoch's weights in ``epochs/``): ``{"history", "best_epoch", "models", ...}``."""
    b = Builder(cfg, sources, device, log)
    full_train = load_split(cfg, "train", train_transform=True, builder=b, seed=seed)
    full_eval = load_split(cfg, "train", train_transform=False, builder=b)
    labels = dataset_labels(full_train)
    rows = validation_rows(b.build_dataset("train"))
    if rows:  # a table's validation rows validate; every train row trains
        train_idx = np.arange(len(labels))
        val_data = load_split(cfg, "validation", train_transform=False, builder=b)
        val_set = b.subset(val_data, np.arange(len(val_data)), dataset_labels(val_data))
        val_source, val_idx = "validation", np.arange(len(val_data))
    else:
        v = cfg.get("validation") or {}
        try:
            train_idx, val_idx, _ = validation_split(full_train.labels, v.get("class_fraction", 0.25), v.get("seed", 0))
        except ConfigError as e:
            raise ConfigError(f"{b.sources.get('validation', 'config')}: {e}") from None
        val_set = b.subset(full_eval, val_idx, labels)
        val_source = "train"
    train_set, init_set = b.subset(full_train, train_idx, labels), b.subset(full_eval, train_idx, labels)
    own = [d for d in hooks(b, "train_set", train_idx, labels, seed) if d is not None]
    train_set = own[-1] if own else train_set  # e.g. coupled views of the training images
    num_classes = int(np.max(labels)) + 1  # the labels index the classes (e.g. ProxyAnchorLoss's proxies)
    models = build_models(cfg, seed, device, init_set, builder=b, num_classes=num_classes)
    extra_models, extra_kwargs = {}, {}  # e.g. the student initialised from a teacher, before any resume
    for more_models, more_kwargs in hooks(b, "prepare", models, seed, load_run_models):
        extra_models, extra_kwargs = {**extra_models, **more_models}, {**extra_kwargs, **more_kwargs}
    trunk, embedder, loss_funcs, nets = models["trunk"], models["embedder"], models["loss_funcs"], networks(models)
    batch_size, iterations = int(cfg["batch_size"]), int(cfg["iterations_per_epoch"])
    workers = int(cfg.get("dataloader_num_workers", 0))
    tester = b.build_tester()
    reference = reference_side(b, seed, "val", val_source, val_idx)

    def validate(epoch):
        tester.test({"val": val_set}, epoch, trunk, embedder, **(reference.tester_kwargs() if reference else {}))
        if keep_epochs and dist_utils.is_main():
            path = os.path.join(stage_dir, "epochs", f"epoch_{epoch}.pth")
            atomic_torch_save({k: m.state_dict() for k, m in nets.items()}, path)
        return {"val": _metrics(tester, "val")}

    # checkpoint.pth + logs/ (CSV + SQLite) per epoch: a killed unit resumes after its last finished epoch
    ckpt = Checkpointer(stage_dir, epoch_tables={"accuracies_val"})
    start = time.time()
    best = b.train(
        ckpt,
        nets,
        loss_funcs,
        models["mining_funcs"],
        train_set,
        batch_size,
        batch_where=b.where("batch_size"),
        extra_models=extra_models,
        extra_kwargs={**extra_kwargs, "iterations_per_epoch": iterations, "dataloader_num_workers": workers},
        views=full_train if hasattr(full_train, "set_epoch") else None,
        fresh_seed=seed + 3,  # the same batches and augmentations for every variant of this seed
        num_epochs=int(cfg["num_epochs"]),
        primary=METRICS[0],
        evaluate=validate,
        best_path=os.path.join(stage_dir, "best_models.pth"),
        log=lambda line: log(f"  {line}"),
        name=f"[{name} seed {seed}]",
        where=b.where("accuracy_calculator"),
    ).best
    train_seconds = time.time() - start
    load_weights_into(nets, os.path.join(stage_dir, "best_models.pth"), device)
    history = [{"epoch": int(r["epoch"]), **{m: float(r[m]) for m in METRICS}} for r in ckpt.rows("accuracies_val")]
    xml = {}
    for loss in loss_funcs.values():
        if hasattr(loss, "num_skipped_xml"):
            xml = {"num_skipped_xml": int(loss.num_skipped_xml), "last_xml_loss": float(loss.xml_loss)}
    return {
        "history": history,
        "best_epoch": best["epoch"],
        "best_is_untrained": best["epoch"] == 0,
        "train_seconds": train_seconds,
        "models": {**nets, "frozen": models["frozen"]},
        "xml": xml,
        "num_train_classes": int(len(np.unique(train_set.labels))),
        "num_val_classes": int(len(np.unique(val_set.labels))),
        "validation_rows": bool(rows),  # validated on a table's validation rows (not on held-out train classes)
    }


def evaluate(
    cfg: Dict[str, Any],
    models: Dict[str, torch.nn.Module],
    device: torch.device,
    split: str = "test",
    sources: Optional[Dict[str, str]] = None,
    seed: int = 0,
) -> Dict[str, float]:
    """Metrics of the (selected) trunk + embedder on one split (with ``feature_cache``: on the cached features of
    ``models["frozen"]``; against the reference side a method sets for ``seed``, e.g. a ``teacher``'s)."""
    b = Builder(cfg, sources, device)
    b.frozen = models.get("frozen")
    dataset = load_split(cfg, split, train_transform=False, builder=b)
    tester = b.build_tester()
    reference = reference_side(b, seed, split, split, np.arange(len(dataset)))
    tester.test(
        {split: dataset}, -1, models["trunk"], models["embedder"], **(reference.tester_kwargs() if reference else {})
    )
    return _metrics(tester, split)


def _metrics(tester, split: str) -> Dict[str, float]:
    return {m: float(tester.all_accuracies[split][f"{m}_level0"]) for m in METRICS}


def load_models(cfg, stage_dir, device, path: Optional[str] = None):
    """A finished unit's trunk + embedder (+ ``frozen``) with the weights of ``path``, else ``selected_models.pth``
    (the tested epoch), else ``best_models.pth`` (the best validation epoch)."""
    models = build_models({**cfg, "prototype_init": None}, 0, device, losses=False)
    selected = os.path.join(stage_dir, "selected_models.pth")
    path = path or (selected if os.path.exists(selected) else os.path.join(stage_dir, "best_models.pth"))
    load_weights_into(networks(models), path, device)
    return models


def test_classes_words(dataset: Any) -> str:
    """What the test split holds, in words: unseen classes, or (``class_overlap: allowed``) classes also trained on."""
    kwargs = dataset.get("kwargs") if isinstance(dataset, dict) and "name" in dataset else None
    if kwargs is None and isinstance(dataset, dict) and len(dataset) == 1:  # {DatasetClass: kwargs}
        kwargs = next(iter(dataset.values()))
    if isinstance(kwargs, dict) and kwargs.get("class_overlap") == "allowed":
        return "test rows of classes also trained on (class_overlap: allowed, same-class retrieval)"
    return "unseen test classes"


def save_retrieval(name, cfg, stage_dir, experiment_folder, device, seed, epoch, n_queries=4, k=5):
    """``retrieval/<variant>.json`` + thumbnails for report.html: the same seeded test queries and their top-k by the
    unit's tested model (against the reference side a method sets, e.g. a ``teacher``'s references)."""
    from ...outputs.retrieval import dataset_image, embed, save_retrieval_examples

    models = load_models(cfg, stage_dir, device)
    builder = Builder(cfg, device=device)
    images = builder.build_dataset("test")  # untransformed, for the thumbnails
    builder.frozen = models.get("frozen")
    view = load_split(cfg, "test", train_transform=False, builder=builder)
    if not np.array_equal(np.asarray(view.labels), np.asarray(dataset_labels(images))):
        raise RuntimeError(f"{name}: the test view is not in the order of the test images")
    reference = reference_side(builder, seed, "test", "test", np.arange(len(images)), images)
    references, against = None, ""
    if reference is not None:  # e.g. the teacher embeds the references, with transforms.reference
        references = embed(reference.trunk, reference.embedder, reference.datasets["test"], device)
        against = f" against {reference.words}"
    image = lambda i: dataset_image(images, i)  # noqa: E731
    save_retrieval_examples(
        experiment_folder,
        name,
        embed(models["trunk"], models["embedder"], view, device),
        view.labels,
        image,
        reference_embeddings=references,
        reference_labels=None if references is None else view.labels,
        reference_image=None if references is None else image,
        n_queries=n_queries,
        k=k,
        seed=seed,
        class_names=getattr(images, "classes", None),
        note=f"`{name}`, seed {seed}: the model of the tested epoch ({epoch}){against}, "
        f"{test_classes_words(cfg.get('dataset'))}; the same queries for every variant.",
    )
