"""PILOT (design evidence for issue 24 items 2-4, not a README table): XML vs GAP on cached MobileNetV2 features.

ImageNet MobileNetV2 frozen up to the map HistogramPooling reads (``features.18``: 1280 × 4 × 4 at 128 px) on Open
Clip Art (30 training classes, of which ``--val-classes`` are held out for validation, class-disjoint; 30 test
classes). Features come from the feature cache of ``benchmarks/feature_cache.py`` (boundary ``0.17``, 4 seeded views
of every training image, the plain view of every test image, float16; reused when it is there, built otherwise),
with the frozen ``features.18`` (1×1 conv + BN + ReLU6) applied once to every cached view — the same numbers as a
cache at ``features.18`` up to the float16 rounding of its 320-channel input. The validation classes' plain view is
cached at the same boundary.

Heads trained per seed (paired: the same ``Linear(1280, 64)`` init, the same batches from ``MPerClassSampler`` with
PML's ``c_f.NUMPY_RANDOM`` seeded, the same view draws):

- ``gap``: GAP + Linear, ContrastiveLoss(0, 1);
- ``xml``: HistogramPooling(1280, 64, scale 100, k-means prototypes from the seed's first 8 batches) + Linear,
  XMLWrapper(ContrastiveLoss(0, 1), xml_weight 0.01, ridge 0.05, target "pooled") — the ``xml_clipart_mobilenet``
  config's settings;
- ``lambda0``: ``xml`` with xml_weight 0 (the pooling returns the GAP vector: must equal ``gap`` exactly).

PML ``MetricLossOnly``, Adam (embedder 1e-3, prototypes 1e-4, weight decay 1e-4), batch 32, ``--iterations`` in
``--eval-every`` blocks; validation and test MAP@R (L2-normalised embeddings, PML AccuracyCalculator, k =
max_bin_count) after every block and at iteration 0 (the untrained head). Reported: XML − GAP on test at the final
iteration, at each variant's best-validation checkpoint, and at one schedule length chosen on the mean validation
curve of all seeds and both variants; per-seed sd of each difference and the half-width it projects for n seeds.

    python benchmarks/xml_cached_pilot.py [--seeds 10] [--iterations 1000] [--val-classes 8]
"""

import argparse
import os
import sys
import time

import feature_cache as fcb  # benchmarks/feature_cache.py, beside this script
import numpy as np
import torch
from pytorch_metric_learning import losses, samplers, trainers
from pytorch_metric_learning.utils import common_functions as c_f
from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator
from scipy import stats

from pml_extensions.datasets import CachedFeatureDataset, FeatureCache, OpenClipArt
from pml_extensions.losses import XMLWrapper
from pml_extensions.runner.outputs.results import summarize
from pml_extensions.trunks import HistogramPooling, split_trunk
from pml_extensions.utils.atomic_io import atomic_write_json, atomic_write_text
from pml_extensions.utils.verdicts import compare, wins

VARIANTS = ("gap", "xml", "lambda0")


class DerivedViews(torch.utils.data.Dataset):
    """``head`` applied once to every cached view of ``indices``; items drawn as ``cached`` draws them."""

    def __init__(self, cached: CachedFeatureDataset, indices, head, batch=256):
        self.cached, self.indices = cached, np.asarray(indices)
        self.labels = cached.labels[self.indices]
        rows = []
        with torch.no_grad():
            for start in range(0, len(self.indices), batch):
                x = torch.from_numpy(np.array(cached.features[self.indices[start : start + batch]])).float()
                n, v = x.shape[:2]
                rows.append(head(x.flatten(0, 1)).view(n, v, *head(x[:1, 0]).shape[1:]).half())
        self.features = torch.cat(rows)

    def __len__(self):
        return len(self.indices)

    def set_epoch(self, epoch):
        self.cached.set_epoch(epoch)

    def __getitem__(self, k):
        return self.features[k, self.cached.view_of(int(self.indices[k]))].float(), int(self.labels[k])


def subset(dataset, indices):
    out = OpenClipArt(dataset.split, max_side=fcb.MAX_SIDE)
    out.paths, out.labels = [dataset.paths[i] for i in indices], dataset.labels[indices]
    return out


def build_features(args):
    """(train DerivedViews, val [n, 1280, 4, 4] + labels, test [m, 1280, 4, 4] + labels, cache seconds)."""
    device = torch.device("cpu")
    model = fcb.trunk(device)
    prefix, _ = split_trunk(model, "0.17")
    head = model[0][18].eval()  # frozen features.18 (1×1 conv 320 -> 1280, BN, ReLU6)
    train_tf, eval_tf = fcb.transforms()
    train_set = fcb.every(OpenClipArt("train", max_side=fcb.MAX_SIDE), args.stride)
    test_set = fcb.every(OpenClipArt("test", max_side=fcb.MAX_SIDE), args.stride)
    classes = np.unique(train_set.labels)
    val_classes = np.sort(np.random.default_rng(0).permutation(classes)[: args.val_classes])
    is_val = np.isin(train_set.labels, val_classes)
    folder = os.path.join(args.cache_dir, "0.17")
    kw = dict(dtype="float16", batch_size=64)
    start = time.perf_counter()
    caches = {
        "train": FeatureCache(os.path.join(folder, "train"), prefix, train_set, train_tf, num_views=args.views, **kw),
        "eval": FeatureCache(os.path.join(folder, "eval"), prefix, test_set, eval_tf, num_views=1, **kw),
        "val": FeatureCache(
            os.path.join(folder, f"val{args.val_classes}"),
            prefix,
            subset(train_set, np.flatnonzero(is_val)),
            eval_tf,
            num_views=1,
            **kw,
        ),
    }
    built = {}
    for name, cache in caches.items():
        cache.build(progress=args.progress)
        built[name] = cache.last_build
    cache_seconds = time.perf_counter() - start
    train = DerivedViews(CachedFeatureDataset(caches["train"].folder), np.flatnonzero(~is_val), head)
    plain = {}
    for name in ("val", "eval"):
        data = CachedFeatureDataset(caches[name].folder)
        derived = DerivedViews(data, np.arange(len(data)), head)
        plain[name] = (derived.features[:, 0], torch.from_numpy(derived.labels))
    return train, plain["val"], plain["eval"], {"seconds": cache_seconds, "builds": built}, val_classes.tolist()


def map_at_r(trunk, embedder, features, labels, batch=512):
    with torch.no_grad():
        emb = torch.cat([embedder(trunk(features[i : i + batch].float())) for i in range(0, len(features), batch)])
    emb = torch.nn.functional.normalize(emb, dim=1)
    calc = AccuracyCalculator(include=("mean_average_precision_at_r",), k="max_bin_count")
    return 100.0 * calc.get_accuracy(emb, labels, emb, labels, True)["mean_average_precision_at_r"]


def run(variant, seed, train, val, test, args):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed + 1)
        embedder = torch.nn.Linear(1280, 64)
    inner = losses.ContrastiveLoss(pos_margin=0.0, neg_margin=1.0)
    optimizers = {"embedder_optimizer": torch.optim.Adam(embedder.parameters(), lr=1e-3, weight_decay=1e-4)}
    if variant == "gap":
        trunk, loss = torch.nn.Sequential(torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten()), inner
    else:
        trunk = HistogramPooling(1280, 64, scale=100.0, seed=seed)
        g = torch.Generator().manual_seed(seed)
        first = torch.randperm(len(train), generator=g)[: 8 * args.batch_size]
        trunk.init_prototypes(torch.stack([train[int(i)][0] for i in first]), method="kmeans", seed=seed)
        weight = 0.01 if variant == "xml" else 0.0
        loss = XMLWrapper(
            inner, xml_weight=weight, ridge=0.05, histogram_layer=trunk, seed=seed, target="pooled", head=embedder
        )
        optimizers["trunk_optimizer"] = torch.optim.Adam(trunk.parameters(), lr=1e-4, weight_decay=1e-4)
    curve = {"iteration": [0], "val": [map_at_r(trunk, embedder, *val)], "test": [map_at_r(trunk, embedder, *test)]}

    def end_of_epoch(trainer):
        train.set_epoch(trainer.epoch)
        trunk.eval()
        curve["iteration"].append(trainer.epoch * args.eval_every)
        curve["val"].append(map_at_r(trunk, embedder, *val))
        curve["test"].append(map_at_r(trunk, embedder, *test))
        trunk.train()

    train.set_epoch(0)
    saved = c_f.NUMPY_RANDOM
    c_f.NUMPY_RANDOM = np.random.RandomState(seed + 3)
    start = time.perf_counter()
    try:
        trainers.MetricLossOnly(
            {"trunk": trunk, "embedder": embedder},
            optimizers,
            batch_size=args.batch_size,
            loss_funcs={"metric_loss": loss},
            dataset=train,
            sampler=samplers.MPerClassSampler(train.labels, m=4, length_before_new_iter=len(train)),
            iterations_per_epoch=args.eval_every,
            dataloader_num_workers=0,
            data_device=torch.device("cpu"),
            end_of_epoch_hook=end_of_epoch,
        ).train(num_epochs=args.iterations // args.eval_every)
    finally:
        c_f.NUMPY_RANDOM = saved
    curve["seconds"] = time.perf_counter() - start
    return curve


def half_width(sd, n):
    return float(stats.t.ppf(0.975, n - 1) * sd / np.sqrt(n))


def analyse(curves, seeds):
    def at(variant, pick):
        return {s: curves[variant][s]["test"][pick(variant, s)] for s in seeds}

    last = lambda v, s: -1  # noqa: E731
    best = lambda v, s: int(np.argmax(curves[v][s]["val"]))  # noqa: E731
    mean_val = np.mean([curves[v][s]["val"] for v in ("gap", "xml") for s in seeds], axis=0)
    fixed_index = int(np.argmax(mean_val))
    fixed = lambda v, s: fixed_index  # noqa: E731
    out = {"fixed_iteration": curves["gap"][seeds[0]]["iteration"][fixed_index], "comparisons": {}}
    for name, pick in (("final", last), ("best_val_per_seed", best), ("fixed_on_mean_val", fixed)):
        per_seed = {v: {s: {"map": x} for s, x in at(v, pick).items()} for v in ("xml", "gap")}
        d = compare(summarize(per_seed)["variants"], "xml", "gap", "map")  # the runner's paired statistics
        d.update(std_difference=d["std"], wins=wins(d))  # the names this file's results always had
        d["gap_mean"] = float(np.mean(list(at("gap", pick).values())))
        d["xml_mean"] = float(np.mean(list(at("xml", pick).values())))
        d["half_width"] = (d["ci95"][1] - d["ci95"][0]) / 2
        d["projected_half_width"] = {n: half_width(d["std_difference"], n) for n in (10, 20, 30)}
        out["comparisons"][name] = d
    out["untrained_test"] = float(np.mean([curves["gap"][s]["test"][0] for s in seeds]))
    out["lambda0_minus_gap_max_abs"] = max(
        abs(a - b) for s in seeds for a, b in zip(curves["lambda0"][s]["test"], curves["gap"][s]["test"])
    )
    out["seconds_per_run"] = {v: float(np.mean([curves[v][s]["seconds"] for s in seeds])) for v in VARIANTS}
    return out


def markdown(out):
    a = out["analysis"]
    lines = [
        f"PILOT `python benchmarks/xml_cached_pilot.py` ({len(out['seeds'])} paired seeds, {out['iterations']} "
        f"iterations, MobileNetV2 frozen to features.18 on Open Clip Art, {out['val_classes']} validation classes, "
        f"machine shared with other engineers; design evidence, not a README claim)",
        "",
        f"Untrained head (iteration 0) test MAP@R {a['untrained_test']:.2f}; λ = 0 − GAP max |Δ| "
        f"{a['lambda0_minus_gap_max_abs']:.2g}; seconds per run: "
        + ", ".join(f"{k} {v:.0f}" for k, v in a["seconds_per_run"].items())
        + f"; caches {out['cache']['seconds']:.0f} s in this call.",
        "",
        "| selection | GAP test MAP@R | XML test MAP@R | XML − GAP [95 % CI] | sd of Δ | XML wins | "
        "projected ± for n = 20 |",
        "|---|---|---|---|---|---|---|",
    ]
    names = {
        "final": "final iteration",
        "best_val_per_seed": "best validation checkpoint (per seed, per variant)",
        "fixed_on_mean_val": f"iteration {a['fixed_iteration']} chosen on the mean validation curve",
    }
    for key, d in a["comparisons"].items():
        lo, hi = d["ci95"]
        lines.append(
            f"| {names[key]} | {d['gap_mean']:.2f} | {d['xml_mean']:.2f} | {d['mean_difference']:+.2f} "
            f"[{lo:+.2f}, {hi:+.2f}] | {d['std_difference']:.2f} | {d['wins']}/{d['n']} | "
            f"±{d['projected_half_width'][20]:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--iterations", type=int, default=1000)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--val-classes", type=int, default=8)
    p.add_argument("--views", type=int, default=4)
    p.add_argument("--stride", type=int, default=1, help="every STRIDE-th image only (a smoke test)")
    p.add_argument("--cache-dir", default=os.path.join(fcb.ROOT, "runs", "feature_cache_benchmark"))
    p.add_argument("--progress", action="store_true")
    p.add_argument("--output", default=os.path.join(fcb.ROOT, "benchmarks", "results"))
    args = p.parse_args(argv)
    train, val, test, cache, val_classes = build_features(args)
    seeds = list(range(args.seeds))
    curves = {v: {} for v in VARIANTS}
    for seed in seeds:
        for variant in VARIANTS:
            curves[variant][seed] = run(variant, seed, train, val, test, args)
            print(variant, seed, f"{curves[variant][seed]['test'][-1]:.2f}", flush=True)
    out = {
        "seeds": seeds,
        "iterations": args.iterations,
        "eval_every": args.eval_every,
        "val_classes": args.val_classes,
        "val_class_ids": val_classes,
        "train_images": len(train),
        "val_images": len(val[1]),
        "test_images": len(test[1]),
        "torch_threads": torch.get_num_threads(),
        "cache": cache,
        "curves": {v: {str(s): c for s, c in per.items()} for v, per in curves.items()},
        "analysis": analyse(curves, seeds),
    }
    text = markdown(out)
    print(text)
    atomic_write_json(os.path.join(args.output, "xml_cached_pilot.json"), out)
    atomic_write_text(os.path.join(args.output, "xml_cached_pilot.md"), text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
