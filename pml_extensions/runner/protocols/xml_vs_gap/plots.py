"""Plots of the ``xml_vs_gap`` protocol: validation MAP@R per epoch, mean prototype histogram per unseen class."""

import os

import numpy as np
import torch

from ....trunks import find_histogram_layers, trunk_body
from ....utils.atomic_io import atomic_savefig
from ...objects.builder import Builder
from .unit import load_split, make_loader


@torch.no_grad()
def class_histograms(cfg, models, num_prototypes: int, device, seed: int, batch_size: int = 128):
    """Mean soft histogram per test class ``[C, m]``. A trunk without HistogramPooling gets a post-hoc layer whose
    prototypes are k-means centres of its own training-set local features (same m), so variants compare."""
    builder = Builder(cfg, device=device)
    trunk = models["trunk"].eval()
    pools = find_histogram_layers(trunk)
    if pools:
        pool, body = pools[0], trunk_body(trunk, pools[0])
    else:  # the modules before the global pooling compute the local features (none: a cached prefix's map)
        children = list(trunk.children())
        cut = next((i for i, m in enumerate(children) if isinstance(m, torch.nn.AdaptiveAvgPool2d)), 1)
        body = torch.nn.Sequential(*children[:cut])
        train_eval = load_split(cfg, "train", train_transform=False, builder=builder)
        width = body(train_eval[0][0][None].to(device)).shape[1]
        pool = builder.build(
            "plots.post_hoc_pooling",
            {"HistogramPooling": {"in_channels": int(width), "num_prototypes": num_prototypes}},
        ).to(device)
        pool.init_from_data(body, make_loader(train_eval, batch_size, seed), num_batches=4, seed=seed)
    test_set = load_split(cfg, "test", train_transform=False, builder=builder)
    labels, hists = [], []
    for images, y in torch.utils.data.DataLoader(test_set, batch_size=batch_size):
        hists.append(pool.histograms(body(images.to(device))).cpu())
        labels.append(y)
    labels, hists = torch.cat(labels), torch.cat(hists)
    classes = torch.unique(labels)
    names = getattr(test_set, "classes", None)
    return classes, torch.stack([hists[labels == c].mean(0) for c in classes]), names


def save_plots(units, out_dir, device, seed, num_prototypes):
    """``map_at_r.png`` (validation MAP@R per epoch, one line per variant at ``seed``) and ``prototype_usage.png``.

    Args:
        units: ``[(name, cfg, result, models)]`` for one seed.
    Returns:
        the two paths.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, _, result, _ in units:
        hist = result["history"]
        line = ax.plot(
            [h["epoch"] for h in hist], [h["mean_average_precision_at_r"] for h in hist], marker="o", label=name
        )[0]
        best = [h for h in hist if h["epoch"] == result.get("best_epoch")]
        if best:  # the selected epoch, the one tested
            ax.plot(
                best[0]["epoch"],
                best[0]["mean_average_precision_at_r"],
                marker="*",
                markersize=16,
                color=line.get_color(),
                markeredgecolor="black",
            )
    ax.set_xlabel("epoch (★ the selected epoch, the model tested)")
    ax.set_ylabel(f"MAP@R (validation classes, seed {seed})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    map_path = os.path.join(out_dir, "map_at_r.png")
    atomic_savefig(fig, map_path, dpi=110)
    plt.close(fig)

    shown = 4
    fig, axes = plt.subplots(len(units), shown, figsize=(3 * shown, 2.2 * len(units)), squeeze=False)
    for row, (name, cfg, _, models) in enumerate(units):
        classes, hist, names = class_histograms(cfg, models, num_prototypes, device, seed)
        for col in range(min(shown, len(classes))):
            ax = axes[row][col]
            ax.bar(np.arange(hist.shape[1]), hist[col].numpy(), width=1.0)
            label = names[int(classes[col])] if names is not None else str(int(classes[col]))
            ax.set_title(f"{name}: class '{label}'", fontsize=7)
            ax.set_xticks([])
            ax.set_ylim(0, float(hist.max()) * 1.05)
    fig.suptitle(
        "Mean prototype histogram per unseen class (cf. XML paper Fig. 4); trunks without "
        "HistogramPooling: post-hoc k-means prototypes of their own features",
        fontsize=8,
    )
    fig.tight_layout()
    usage_path = os.path.join(out_dir, "prototype_usage.png")
    atomic_savefig(fig, usage_path, dpi=100)
    plt.close(fig)
    return map_path, usage_path


def save_retrieval(units, out_dir, device, seed, n_queries=4, k=5):
    """``retrieval/<variant>.json`` + thumbnails (:mod:`pml_extensions.runner.outputs.retrieval`): the same seeded
    test queries and their top-k by each variant's selected model at ``seed``, for report.html.

    Args:
        units: ``[(name, cfg, result, models)]`` for one seed (``models["frozen"]``: a cached run's frozen prefix,
            :class:`~pml_extensions.runner.objects.feature_cache.FrozenParts`, or None: then the rest embeds the cached
            test features).
    """
    import json

    from ...objects.data import Subset
    from ...outputs.retrieval import dataset_image, embed, save_retrieval_examples

    loaded = {}  # variants that share the data share one load of the test split
    for name, cfg, result, models in units:
        builder = Builder(cfg, device=device)
        key = json.dumps([cfg.get(k) for k in ("dataset", "dataset_root", "transforms", "normalize")], default=str)
        if key not in loaded:
            images = builder.build_dataset("test")  # untransformed, for the thumbnails
            labels = np.asarray(images.labels)
            view = Subset(images, np.arange(len(labels)), labels, builder.build_transform("eval"))
            loaded[key] = images, view, getattr(images, "classes", None)
        images, test_set, classes = loaded[key]
        if cfg.get("feature_cache") is not None:  # the trunk is the rest: it embeds the cached test features
            builder.frozen = models.get("frozen")
            test_set = load_split(cfg, "test", train_transform=False, builder=builder)
            if not np.array_equal(np.asarray(test_set.labels), np.asarray(images.labels)):
                raise RuntimeError(f"{name}: the cached test split is not in the order of the test images")
        save_retrieval_examples(
            out_dir,
            name,
            embed(models["trunk"], models["embedder"], test_set, device),
            test_set.labels,
            lambda i, images=images: dataset_image(images, i),
            n_queries=n_queries,
            k=k,
            seed=seed,
            class_names=classes,
            note=f"`{name}`, seed {seed}: the model of the selected epoch ({result.get('best_epoch')}), unseen test "
            "classes; the same queries for every variant.",
        )
