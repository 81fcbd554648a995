"""The XML paper's figure: the mean prototype histogram per unseen class (the trunk's own HistogramPooling, or a
post-hoc one built by the Builder for a GAP trunk; cf. XML paper Fig. 4)."""

import os

import numpy as np
import torch

from pml_extensions.explain.explanation_hook import dataset_class_names
from pml_extensions.runner.objects.builder import Builder
from pml_extensions.runner.protocols.paired.unit import load_split
from pml_extensions.trunks import find_histogram_layers, trunk_body
from pml_extensions.utils.atomic_io import atomic_savefig


@torch.no_grad()
def histogram_view(cfg, trunk, device, seed: int, num_prototypes: int = 64, builder=None, batch_size: int = 128):
    """``(pool, body)``: the trunk's own HistogramPooling and the modules before it, or for a GAP trunk a post-hoc
    ``HistogramPooling(width, num_prototypes)`` (built by ``builder``, default a quiet one of ``cfg``) whose
    prototypes are k-means centres (``seed``) of the local features of 4 training batches in a seeded order (eval
    transform), ``body`` being the trunk's modules before its ``AdaptiveAvgPool2d`` (the first module where it has
    none: a cached prefix's map). The figure and the probes of ``xml_cached.py`` and ``xml_generalization.py`` read
    the histograms this way."""
    pools = find_histogram_layers(trunk)
    if pools:
        return pools[0], trunk_body(trunk, pools[0])
    builder = builder or Builder(cfg, device=device, log=lambda *a, **k: None)
    children = list(trunk.children())
    cut = next((i for i, m in enumerate(children) if isinstance(m, torch.nn.AdaptiveAvgPool2d)), 1)
    body = torch.nn.Sequential(*children[:cut])
    train_eval = load_split(cfg, "train", train_transform=False, builder=builder)
    width = body(train_eval[0][0][None].to(device)).shape[1]
    pool = builder.build(
        "plots.post_hoc_pooling", {"HistogramPooling": {"in_channels": int(width), "num_prototypes": num_prototypes}}
    ).to(device)
    order = torch.Generator().manual_seed(seed)
    loader = torch.utils.data.DataLoader(train_eval, batch_size=batch_size, shuffle=True, generator=order)
    return pool.init_from_data(body, loader, num_batches=4, seed=seed), body


@torch.no_grad()
def class_histograms(cfg, models, num_prototypes: int, device, seed: int, batch_size: int = 128):
    """Mean soft histogram per test class ``[C, m]`` (:func:`histogram_view`: a GAP trunk's post-hoc prototypes have
    the same m, so variants compare)."""
    builder = Builder(cfg, device=device)
    trunk = models["trunk"].eval()
    pool, body = histogram_view(cfg, trunk, device, seed, num_prototypes, builder, batch_size)
    test_set = load_split(cfg, "test", train_transform=False, builder=builder)
    labels, hists = [], []
    for images, y in torch.utils.data.DataLoader(test_set, batch_size=batch_size):
        hists.append(pool.histograms(body(images.to(device))).cpu())
        labels.append(y)
    labels, hists = torch.cat(labels), torch.cat(hists)
    classes = torch.unique(labels)
    names = dataset_class_names(test_set)  # the class names as written (of a wrapped dataset too), else None
    return classes, torch.stack([hists[labels == c].mean(0) for c in classes]), names


def save_prototype_usage(units, out_dir, device, seed, num_prototypes):
    """``prototype_usage.png``: the mean prototype histogram of the first test classes, one row per variant.

    Args:
        units: ``[(name, cfg, result, models)]`` for one seed.
    Returns:
        the path.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = 4
    fig, axes = plt.subplots(len(units), shown, figsize=(3 * shown, 2.2 * len(units)), squeeze=False)
    rows = [(name, *class_histograms(cfg, models, num_prototypes, device, seed)) for name, cfg, _, models in units]
    top = max(float(hist[:shown].max()) for _, _, hist, _ in rows) * 1.05  # one scale for the shown panels
    for row, (name, classes, hist, names) in enumerate(rows):
        for col in range(min(shown, len(classes))):
            ax = axes[row][col]
            ax.bar(np.arange(hist.shape[1]), hist[col].numpy(), width=1.0)
            label = names[int(classes[col])] if names is not None else str(int(classes[col]))
            ax.set_title(f"{name}: class '{label}'", fontsize=7)
            ax.set_xticks([])
            ax.set_ylim(0, top)
            ax.set_xlabel(f"prototype (1 … {hist.shape[1]})", fontsize=7)
            if col == 0:
                ax.set_ylabel("mean share of the\nlocal features", fontsize=7)
    fig.suptitle(
        "Mean prototype histogram per unseen class (cf. XML paper Fig. 4); trunks without "
        "HistogramPooling: post-hoc k-means prototypes of their own features",
        fontsize=8,
    )
    fig.tight_layout()
    usage_path = os.path.join(out_dir, "prototype_usage.png")
    atomic_savefig(fig, usage_path, dpi=100)
    plt.close(fig)
    return usage_path
