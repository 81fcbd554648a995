"""Deletion / insertion fidelity of similarity maps (issue 13 item 4), 3 seeds, paired against a random map.

For each seed s: a CompositeLocalizationDataset test set (Open Clip Art drawings pasted on scikit-image
photos, class-disjoint from training; seed s), the ImageNet MobileNetV2 features with a GAP or GMP head and a
Linear(1280, 128) embedder initialised from seed s (no fine-tuning: the similarity is the one of ImageNet
features), and
--queries queries each paired with its nearest other image (cosine). Every method explains the same pairs:
Decomposition, Decomposition+Bias (Zhu et al. 2021), Grad-CAM (cosine), Grad-CAM (dot, "no norm"), RGrad-CAM
(rectified), and a uniform random map (seeded control). ``SimilarityFidelity`` removes (deletion) or reveals
(insertion) the query's pixels most-attributed first in --steps steps, replacing them with 0 in the normalised
input space (the ImageNet mean colour), and integrates the cosine similarity to the (fixed) retrieved image.

Reported: mean ± std over seeds of the per-seed mean areas (deletion: lower is better; insertion: higher is
better), and the paired difference method − random over seeds with its 95 % t interval
(:func:`pml_extensions.utils.paired_stats.paired_difference`, the runner's interval). The random map is a control,
not a paper's claim: the ranking line lists the methods whose interval lies on the better side of 0 on both curves,
with no smallest effect and no verdict word.

    python benchmarks/explain_fidelity.py             # 3 seeds x {GAP, GMP}, 16 queries, 160 px, 1 CPU core
    python benchmarks/explain_fidelity.py --device cuda --queries 64 --size 224
    python benchmarks/explain_fidelity.py --from-json    # the .md again from benchmarks/results/explain_fidelity.json

Writes benchmarks/results/explain_fidelity.json (per-seed values) and .md (the table and ranking on docs/benchmarks.md).
"""

import argparse
import os
import time

import numpy as np
import torch
from torch import nn

from pml_extensions.datasets.normalization import IMAGENET_MEAN as MEAN
from pml_extensions.datasets.normalization import IMAGENET_STD as STD
from pml_extensions.explain import (
    ActivationDecomposition,
    CompositeLocalizationDataset,
    RandomExplainer,
    SimilarityFidelity,
    SimilarityGradCAM,
)
from pml_extensions.utils.atomic_io import atomic_write_json, atomic_write_text
from pml_extensions.utils.paired_stats import paired_difference

METHODS = ("Decomposition", "Decomposition+Bias", "Grad-CAM", "Grad-CAM (no norm)", "RGrad-CAM", "random map")


def build(seed: int, device, pool: str):
    from pml_extensions.trunks.pretrained import mobilenet_v2_features

    pooling = nn.AdaptiveAvgPool2d(1) if pool == "gap" else nn.AdaptiveMaxPool2d(1)
    trunk = nn.Sequential(mobilenet_v2_features(pretrained=True), pooling, nn.Flatten())
    embedder = nn.Linear(1280, 128)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        embedder.weight.copy_(torch.randn(embedder.weight.shape, generator=g, device=g.device) / 1280**0.5)
        embedder.bias.copy_(torch.randn(embedder.bias.shape, generator=g, device=g.device) * 0.1)
    return trunk.eval().to(device), embedder.eval().to(device)


def one_seed(seed: int, args, device, pool: str):
    import torchvision.transforms as T

    tf = T.Compose([T.ToTensor(), T.Normalize(MEAN, STD)])
    data = CompositeLocalizationDataset("test", n_images=args.images, image_size=args.size, seed=seed, transform=tf)
    x = torch.stack([data[i][0] for i in range(len(data))]).to(device)
    trunk, embedder = build(seed, device, pool)
    with torch.no_grad():
        e = nn.functional.normalize(embedder(trunk(x)), dim=1)
    sim = e @ e.t()
    sim.fill_diagonal_(-2.0)
    queries = torch.arange(args.queries, device=x.device)
    nearest = sim[queries].argmax(dim=1)
    q, r = x[queries], x[nearest]
    dec = ActivationDecomposition(trunk, embedder)
    cam = SimilarityGradCAM(trunk, embedder)
    maps = {
        "Decomposition": dec.overall_maps(q, r)["query"],
        "Decomposition+Bias": dec.overall_maps(q, r, bias=True)["query"],
        "Grad-CAM": cam.maps(q, r, variant="cosine")["query"],
        "Grad-CAM (no norm)": cam.maps(q, r, variant="dot")["query"],
        "RGrad-CAM": cam.maps(q, r, variant="rectified")["query"],
        "random map": RandomExplainer(seed=seed, map_size=dec.fold_query(q[:1]).feature_size).attribute(q, r)["query"],
    }
    fid = SimilarityFidelity(trunk, embedder, steps=args.steps, baseline="zero", batch_size=args.batch_size)
    out = {}
    for name in METHODS:
        c = fid.curves(q, r, maps[name])
        out[name] = {
            "deletion_area": c["deletion_area"].tolist(),
            "insertion_area": c["insertion_area"].tolist(),
            "deletion_curve_mean": c["deletion"].mean(dim=0).tolist(),
            "insertion_curve_mean": c["insertion"].mean(dim=0).tolist(),
        }
    return out


def summarise(per_seed):
    seeds = sorted(per_seed)
    summary = {}
    for name in METHODS:
        row = {}
        for curve in ("deletion_area", "insertion_area"):
            vals = np.array([np.mean(per_seed[s][name][curve]) for s in seeds])
            rnd = np.array([np.mean(per_seed[s]["random map"][curve]) for s in seeds])
            d = vals - rnd
            n = len(d)
            lo, hi = (
                paired_difference(dict(enumerate(vals)), dict(enumerate(rnd)))["ci"] if n > 1 else [float("nan")] * 2
            )
            row[curve] = {
                "mean": float(vals.mean()),
                "std": float(vals.std(ddof=1)) if n > 1 else 0.0,
                "per_seed": vals.tolist(),
                "diff_vs_random": {
                    "mean": float(d.mean()),
                    "std": float(d.std(ddof=1)) if n > 1 else 0.0,
                    "ci95": [float(lo), float(hi)],
                },
            }
        summary[name] = row
    return summary


def render(summaries, args, seconds):
    lines = [
        f"`python benchmarks/explain_fidelity.py --queries {args.queries} --steps {args.steps} --images "
        f"{args.images}` ({len(args.seeds)} seeds, {args.queries} query/top-1 pairs per seed, "
        f"{args.size} px composites, ImageNet MobileNetV2 + GAP or GMP + seeded Linear(1280, 128), "
        f"{args.steps} steps, removed pixels set to the ImageNet mean; {seconds:.0f} s). Areas under the "
        "cosine-similarity "
        "curves (mean ± std over seeds); Δ = method − random map, paired by seed, 95 % t interval:",
    ]
    for pool, summary in summaries.items():
        lines += ["", f"**{pool.upper()} head**", ""] + _table(summary)
    return "\n".join(lines) + "\n"


def _diff(entry) -> str:
    diff = entry["diff_vs_random"]
    return f"{diff['mean']:+.4f} [{diff['ci95'][0]:+.4f}, {diff['ci95'][1]:+.4f}]"


def _table(summary):
    lines = [
        "| method | deletion area ↓ | Δ deletion vs random [95 % CI] | insertion area ↑ "
        "| Δ insertion vs random [95 % CI] |",
        "|---|---|---|---|---|",
    ]
    for name in METHODS:
        d, i = summary[name]["deletion_area"], summary[name]["insertion_area"]
        if name == "random map":
            dd = di = "—"
        else:
            dd, di = _diff(d), _diff(i)
        lines.append(f"| {name} | {d['mean']:.4f} ± {d['std']:.4f} | {dd} | {i['mean']:.4f} ± {i['std']:.4f} | {di} |")
    methods = [m for m in METHODS if m != "random map"]
    rank_del = sorted(methods + ["random map"], key=lambda m: summary[m]["deletion_area"]["mean"])
    rank_ins = sorted(methods + ["random map"], key=lambda m: -summary[m]["insertion_area"]["mean"])
    beats = [
        m
        for m in methods
        if summary[m]["deletion_area"]["diff_vs_random"]["ci95"][1] < 0
        and summary[m]["insertion_area"]["diff_vs_random"]["ci95"][0] > 0
    ]  # NaN (1 seed) never passes
    fails = [m for m in methods if m not in beats]
    lines += [
        "",
        "Ranking by deletion area (best first): " + " > ".join(rank_del) + ".",
        "Ranking by insertion area (best first): " + " > ".join(rank_ins) + ".",
        "Interval on the better side of 0 on both curves (below the random map's deletion area, above its insertion "
        "area): " + (", ".join(beats) if beats else "none") + ".",
        "Not on both: " + (", ".join(fails) if fails else "none") + ".",
    ]
    return lines


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--queries", type=int, default=16)
    p.add_argument("--images", type=int, default=48)
    p.add_argument("--size", type=int, default=160)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--pools", nargs="+", default=["gap", "gmp"], choices=["gap", "gmp"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    p.add_argument("--from-json", action="store_true", help="render the .md again from the saved .json, no run")
    args = p.parse_args(argv)
    if args.from_json:
        import json

        with open(os.path.join(args.out, "explain_fidelity.json"), encoding="utf-8") as f:
            saved = json.load(f)
        md = render(saved["summary"], argparse.Namespace(**saved["args"]), saved["seconds"])
        atomic_write_text(os.path.join(args.out, "explain_fidelity.md"), md)
        print(md)
        return saved["summary"]
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    start = time.time()
    per_seed, summaries = {}, {}
    for pool in args.pools:
        per_seed[pool] = {}
        for s in args.seeds:
            per_seed[pool][s] = one_seed(s, args, device, pool)
            print(
                f"{pool} seed {s}: "
                + ", ".join(
                    f"{m} del {np.mean(per_seed[pool][s][m]['deletion_area']):.4f} ins "
                    f"{np.mean(per_seed[pool][s][m]['insertion_area']):.4f}"
                    for m in METHODS
                ),
                flush=True,
            )
        summaries[pool] = summarise(per_seed[pool])
    seconds = time.time() - start
    md = render(summaries, args, seconds)
    print(md)
    name = "explain_fidelity" if device.type == "cpu" else f"explain_fidelity_{device.type}"
    os.makedirs(args.out, exist_ok=True)
    atomic_write_json(
        os.path.join(args.out, name + ".json"),
        {
            "args": vars(args),
            "seconds": seconds,
            "summary": summaries,
            "per_seed": {p: {str(k): v for k, v in d.items()} for p, d in per_seed.items()},
        },
    )
    atomic_write_text(os.path.join(args.out, name + ".md"), md)
    return summaries


if __name__ == "__main__":
    main()
