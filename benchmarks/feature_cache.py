"""One training epoch on cached frozen-prefix features divided by one epoch through the full frozen trunk (issue 24).

ImageNet MobileNetV2 (offline weights, ``trunks.MobileNetV2Features(pretrained=True)``) as the trunk
``Sequential(features, AdaptiveAvgPool2d(1), Flatten())`` with a ``Linear(1280, 128)`` embedder, on Open Clip Art
(Debian ``openclipart-png``; the 30 training classes, 4365 images, drawings shrunk to 160 px and cropped to 128 px
with the ``xml_clipart_mobilenet`` config's transforms). For each boundary (default ``0.17``: the prefix is
``features[0..17]`` and the rest is MobileNetV2's last stage, the 1×1 conv 320 -> 1280 with its BatchNorm, plus the
pooling) the script

1. builds the feature cache: V = 4 seeded views of every training image and the plain view of every test image, in
   float16 (``--views``, ``--dtype``), and reports build time and size;
2. times one epoch (``len(train) // batch`` iterations, batch 32 = 8 classes × 4, ContrastiveLoss, Adam) of PML's
   ``MetricLossOnly`` trainer twice per variant, alternating: the rest on ``CachedFeatureDataset``, and
   ``Sequential(FrozenPrefix(prefix), rest)`` on ``SeededViewDataset`` (the very same views and batches). The images
   are already decoded in RAM (the build loaded them), so the uncached epoch is timed at its fastest; the ratio of
   the median epoch times is reported (target ≤ 0.1 at ``0.17``).

The other boundaries (``--boundaries 0.17 0.16 0.13 0``: the first is the full measurement) are timed on every
``--extra-stride``-th training image (all 30 classes; an "epoch" of that subset has the same iterations' cost) with
V = 1 caches (an epoch reads one view per image whatever V is), and without the test images. ``--stride`` subsamples
the first boundary's images the same way (for a quick run). Results: benchmarks/results/feature_cache.json and .md.

    python benchmarks/feature_cache.py [--boundaries 0.17 0.16 0.13 0] [--views 4] [--repeats 2] [--device cpu]
"""

import argparse
import os
import shutil
import statistics
import sys
import time

import numpy as np
import torch
import torchvision.transforms as T
from pytorch_metric_learning import losses, samplers, trainers
from pytorch_metric_learning.utils import common_functions as c_f

from pml_extensions.datasets import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    CachedFeatureDataset,
    FeatureCache,
    OpenClipArt,
    SeededViewDataset,
)
from pml_extensions.trunks import FrozenPrefix, MobileNetV2Features, split_trunk
from pml_extensions.utils.atomic_io import atomic_write_json, atomic_write_text

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_SIDE, SIZE = 160, 128
BOUNDARY_NAMES = {
    "0": "everything frozen (head only)",
    "0.17": "last stage trained (1×1 conv 320→1280)",
    "0.16": "last two blocks trained",
    "0.13": "stride-32 stage trained (features 14-18)",
}


def transforms():
    """The ``xml_clipart_mobilenet`` config's train and eval transforms."""
    norm = [T.ToTensor(), T.Normalize(IMAGENET_MEAN, IMAGENET_STD)]
    train = T.Compose([T.RandomResizedCrop(SIZE, scale=(0.6, 1.0)), T.RandomHorizontalFlip(0.5)] + norm)
    return train, T.Compose([T.Resize(146), T.CenterCrop(SIZE)] + norm)


def trunk(device):
    model = torch.nn.Sequential(
        MobileNetV2Features(pretrained=True), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten()
    ).to(device)
    return model.eval()


def epoch_seconds(trunk_model, dataset, args, device, seed=0):
    """Wall seconds of one PML MetricLossOnly epoch (``len(dataset) // batch`` iterations)."""
    g = torch.Generator().manual_seed(seed)
    embedder = torch.nn.Linear(1280, 128).to(device)
    with torch.no_grad():
        embedder.weight.copy_(torch.randn(128, 1280, generator=g) * 0.02)
        embedder.bias.zero_()
    params = [p for p in trunk_model.parameters() if p.requires_grad]
    optimizers = {"embedder_optimizer": torch.optim.Adam(embedder.parameters(), lr=1e-3)}
    if params:  # nothing to train in the trunk when everything is frozen
        optimizers["trunk_optimizer"] = torch.optim.Adam(params, lr=1e-4)
    iterations = len(dataset) // args.batch_size
    saved = c_f.NUMPY_RANDOM
    c_f.NUMPY_RANDOM = np.random.RandomState(seed)
    try:
        trainer = trainers.MetricLossOnly(
            {"trunk": trunk_model, "embedder": embedder},
            optimizers,
            batch_size=args.batch_size,
            loss_funcs={"metric_loss": losses.ContrastiveLoss(pos_margin=0.0, neg_margin=1.0)},
            dataset=dataset,
            sampler=samplers.MPerClassSampler(dataset.labels, m=4, length_before_new_iter=len(dataset)),
            iterations_per_epoch=iterations,
            dataloader_num_workers=0,
            data_device=device,
        )
        start = time.perf_counter()
        trainer.train(num_epochs=1)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - start, iterations
    finally:
        c_f.NUMPY_RANDOM = saved


def every(dataset, stride):
    """``dataset`` keeping every ``stride``-th image (its own image cache, so loading is timed again)."""
    if stride == 1:
        return dataset
    out = OpenClipArt(dataset.split, max_side=MAX_SIDE)
    out.paths, out.labels = out.paths[::stride], out.labels[::stride]
    return out


def measure(boundary, views, train_set, test_set, args, device):
    model = trunk(device)
    prefix, rest = split_trunk(model, boundary)
    train_tf, eval_tf = transforms()
    folder = os.path.join(args.cache_dir, boundary)
    common = dict(dtype=args.dtype, batch_size=args.build_batch_size, num_workers=args.workers)
    train_cache = FeatureCache(os.path.join(folder, "train"), prefix, train_set, train_tf, num_views=views, **common)
    start = time.perf_counter()
    train_cache.build(progress=args.progress)
    build = {"train_s": time.perf_counter() - start}
    size = {"train_bytes": train_cache.size_bytes()}
    if test_set is not None:  # the full build: the evaluation images' plain view too
        eval_cache = FeatureCache(os.path.join(folder, "eval"), prefix, test_set, eval_tf, num_views=1, **common)
        start = time.perf_counter()
        eval_cache.build(progress=args.progress)
        build["eval_s"] = time.perf_counter() - start
        size["eval_bytes"] = eval_cache.size_bytes()
        eval_set = eval_cache.open()
        with torch.no_grad():  # the tester's path: the rest alone embeds the cached evaluation view
            x, _ = eval_set[0]
            image = eval_tf(test_set[0][0]).unsqueeze(0).to(device)
            gap = (rest(x.unsqueeze(0).to(device)) - model(image)).abs().max().item()
        build["eval_rest_vs_model_max_abs"] = gap
    cached = CachedFeatureDataset(train_cache.folder, seed=0)
    full = torch.nn.Sequential(FrozenPrefix(prefix), rest)
    uncached = SeededViewDataset(train_set, train_tf, num_views=views, seed=0)
    times = {"cached": [], "full": []}
    for _ in range(args.repeats):
        for name, (m, data) in (("cached", (rest, cached)), ("full", (full, uncached))):
            seconds, iterations = epoch_seconds(m, data, args, device)
            times[name].append(seconds)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {
        "boundary": boundary,
        "train_images": len(train_set),
        "test_images": 0 if test_set is None else len(test_set),
        "what": BOUNDARY_NAMES.get(boundary, ""),
        "num_views": views,
        "feature_shape": list(cached.feature_shape),
        "trainable_trunk_params": sum(p.numel() for p in rest.parameters()),
        "iterations": iterations,
        "cached_epoch_s": med["cached"],
        "full_epoch_s": med["full"],
        "cached_epochs_s": times["cached"],
        "full_epochs_s": times["full"],
        "ratio": med["cached"] / med["full"],
        "build": build,
        "size": size,
    }


def markdown(out):
    rows = out["rows"]
    first = rows[0]
    b = first["build"]
    mb = (first["size"]["train_bytes"] + first["size"].get("eval_bytes", 0)) / 2**20
    lines = [
        f"`python benchmarks/feature_cache.py` (device {out['device']}, ImageNet MobileNetV2 on Open Clip Art at "
        f"{SIZE} px, {out['train_images']} training / {out['test_images']} test images, batch {out['batch_size']}, "
        f"PML MetricLossOnly, median of {out['repeats']} epochs per variant alternating in one process, torch "
        f"threads {out['torch_threads']}, on a machine shared with other engineers (1-min load average "
        f"{out['load_average'][0]:.1f} at the start, {out['load_average'][1]:.1f} at the end); target ≤ 0.1 at "
        f"`0.17`)",
        "",
        f"Cache at `{first['boundary']}`: {first['num_views']} views of every training image + the plain view of every "
        f"test image, {out['dtype']}, {mb:.0f} MiB, built in {b['train_s'] + b.get('eval_s', 0):.0f} s "
        f"({b['train_s']:.0f} s train, {b.get('eval_s', 0):.0f} s test); it pays for itself after "
        f"{(b['train_s'] + b.get('eval_s', 0)) / max(first['full_epoch_s'] - first['cached_epoch_s'], 1e-9):.1f} "
        "epochs.",
        "",
        "| frozen up to | trained part of the trunk | cached features | trainable trunk params | images per epoch "
        "| cached epoch (s) | full frozen trunk epoch (s) | ratio |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| `{r['boundary']}` | {r['what']} | {'×'.join(map(str, r['feature_shape']))} | "
            f"{r['trainable_trunk_params']:,} | {r['train_images']} | {r['cached_epoch_s']:.2f} | "
            f"{r['full_epoch_s']:.2f} | "
            f"{r['ratio']:.3f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--boundaries", nargs="+", default=["0.17", "0.16", "0.13", "0"])
    p.add_argument("--views", type=int, default=4)
    p.add_argument("--stride", type=int, default=1, help="first boundary: every STRIDE-th training/test image")
    p.add_argument("--extra-stride", type=int, default=8, help="other boundaries: every STRIDE-th training image")
    p.add_argument("--dtype", default="float16")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--build-batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--cache-dir", default=os.path.join(ROOT, "runs", "feature_cache_benchmark"))
    p.add_argument("--keep-cache", action="store_true", help="keep the caches (default: delete them at the end)")
    p.add_argument("--progress", action="store_true")
    p.add_argument("--output", default=os.path.join(ROOT, "benchmarks", "results"))
    args = p.parse_args(argv)
    device = torch.device(args.device)
    load_start = os.getloadavg()[0]
    train_set = OpenClipArt("train", max_side=MAX_SIDE)
    test_set = OpenClipArt("test", max_side=MAX_SIDE)
    if os.path.isdir(args.cache_dir) and not args.keep_cache:
        shutil.rmtree(args.cache_dir)  # time a fresh build
    rows = []
    for i, boundary in enumerate(args.boundaries):
        if i == 0:
            data = (every(train_set, args.stride), every(test_set, args.stride), args.views)
        else:
            data = (every(train_set, args.extra_stride), None, 1)
        rows.append(measure(boundary, data[2], data[0], data[1], args, device))
        print(rows[-1], flush=True)
    if not args.keep_cache:
        shutil.rmtree(args.cache_dir, ignore_errors=True)
    out = {
        "device": str(device),
        "torch_threads": torch.get_num_threads(),
        "load_average": [load_start, os.getloadavg()[0]],
        "train_images": rows[0]["train_images"],
        "test_images": rows[0]["test_images"],
        "stride": args.stride,
        "extra_stride": args.extra_stride,
        "max_side": MAX_SIDE,
        "image_size": SIZE,
        "batch_size": args.batch_size,
        "repeats": args.repeats,
        "dtype": args.dtype,
        "rows": rows,
    }
    text = markdown(out)
    print(text)
    atomic_write_json(os.path.join(args.output, "feature_cache.json"), out)
    atomic_write_text(os.path.join(args.output, "feature_cache.md"), text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
