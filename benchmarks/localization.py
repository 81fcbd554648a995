"""Weakly supervised localisation with explanation maps (Zhu, Yang & Chen, TIP 2021, Sec. VI-A/B, Tables I-IV;
issue 10 item 5).

Data: ``CompositeLocalizationDataset`` — Open Clip Art drawings (``--source glyph``: glyph ink) pasted on
scikit-image photos/textures with exact boxes; class-disjoint: the models are fine-tuned on the training
classes and scored on the test classes (the paper's CUB "validation set"). Models: ImageNet MobileNetV2
features -> GMP (the paper's CUB model is GMP-based; ``--pool gap``) -> Linear(1280, 128), fine-tuned with the
Multi-Similarity loss (the paper's recipe) and, for Tables III-IV, with the Triplet loss — paired: within a
seed both start from the same weights and see the same batches. Each test image (query) is paired with its
nearest test image of the same class (cosine); the query's map is scored: min-max -> bilinear resize ->
threshold grid -> largest connected component -> box -> correct when IoU > 0.5 (paper Sec. VI-A).

Every method is scored under both sign conventions, so the table separates the method from the sign:
``signed`` (the map as the method defines it, negative evidence kept) and ``ReLU`` (clamped at 0, Grad-CAM's
convention). Methods: Decomposition, Decomposition+Bias (the first two terms of eq. 5), Grad-CAM (of the
cosine), Grad-CAM (no norm) (of E^q · E^r), and the authors' demo variant (ReLU of each point-to-point term,
then sum; non-negative by construction). RGrad-CAM (Σ_k ∂(E^q·E^r)/∂A · A without averaging the gradient,
``SimilarityGradCAM`` variant ``"rectified"``) equals Decomposition+Bias exactly for a linear head (GMP
included, with GMP ties broken as autograd breaks them, ``gmp_ties="first"``; the default fold shares a tied
maximum, which MobileNetV2's saturated ReLU6 channels produce), so "rectified Grad-CAM" is
ReLU(Decomposition+Bias) up to that tie rule: the benchmark computes it by autograd for the first
``--eval-batch`` queries of every run and reports the largest difference and whether the localisation hits
agree under both tie rules, instead of scoring a near-duplicate row.

Tables: I (accuracy per threshold, MS model), II (best threshold per method, chosen on the test classes as in
the paper, with paired differences vs Decomposition under the same convention), III (MS vs Triplet: P@1 on the
training and on the test classes), IV (best localisation accuracy per method, MS vs Triplet, paired
difference).

    python benchmarks/localization.py --size quick   # 40 test images at 224 px, 30 steps: smoke scale
    python benchmarks/localization.py --size medium  # 60 test images at 256 px, 60 steps
    python benchmarks/localization.py --size full --device cuda    # more images, more fine-tuning

Writes ``benchmarks/results/localization.json`` and ``.md`` (the README's ``results:localization`` block).
"""

import argparse
import os
import sys
import time

import numpy as np
import torch
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_stats import compare, fmt_diff, fmt_ms, summarize_variants, verdict  # noqa: E402

from pml_extensions.datasets.normalization import IMAGENET_MEAN as MEAN  # noqa: E402
from pml_extensions.datasets.normalization import IMAGENET_STD as STD
from pml_extensions.explain.activation_decomposition import ActivationDecomposition  # noqa: E402
from pml_extensions.explain.composite_localization_dataset import CompositeLocalizationDataset  # noqa: E402
from pml_extensions.explain.localization_evaluator import LocalizationEvaluator  # noqa: E402
from pml_extensions.explain.similarity_grad_cam import SimilarityGradCAM  # noqa: E402
from pml_extensions.utils.atomic_io import atomic_write_json, atomic_write_text  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
METHODS = ("Decomposition", "Decomposition+Bias", "Grad-CAM", "Grad-CAM (no norm)")
DEMO = "Decomposition (demo ReLU-then-sum)"
CONVENTIONS = ("signed", "ReLU")
LOSSES = {"ms": "Multi-Similarity", "triplet": "Triplet"}
SIZES = {
    "quick": dict(n_train=96, n_test=40, steps=30, seeds=(0, 1, 2), size=224, train_size=224),
    "medium": dict(n_train=240, n_test=60, steps=60, seeds=(0, 1, 2), size=256, train_size=224),
    "full": dict(n_train=3000, n_test=1000, steps=2000, seeds=(0, 1, 2, 3, 4), size=448, train_size=224),
}
# The paper's statements (values not in the text we have): Table II ordering and Tables III-IV trends.
PAPER = {
    "table2": (
        'Decomposition ≥ Decomposition+Bias ("the bias term does not help"); the decomposition beats '
        'both Grad-CAMs; Grad-CAM (no norm) ≫ Grad-CAM ("by a large margin"). Paper maps: decomposition '
        "signed, Grad-CAM with its ReLU."
    ),
    "table3": (
        "MS and Triplet: almost the same training accuracy, a big gap on the validation (unseen) classes "
        "in favour of MS."
    ),
    "table4": "Localisation accuracy drops for Triplet, for Decomposition and Decomposition+Bias alike.",
}


def to_tensor_batch(pil_images, size):
    from torchvision.transforms import functional as TF

    out = []
    for im in pil_images:
        if im.size != (size, size):
            im = im.resize((size, size))
        out.append(TF.normalize(TF.to_tensor(im), MEAN, STD))
    return torch.stack(out)


def build(pool: str, dim: int, seed: int):
    """ImageNet MobileNetV2 features -> GMP/GAP -> Linear(1280, dim); the embedder is drawn from ``seed``
    alone,
    so the MS and Triplet models of one seed start from identical weights."""
    from pml_extensions.trunks.pretrained import mobilenet_v2_features

    features = mobilenet_v2_features(pretrained=True)
    pool_layer = nn.AdaptiveMaxPool2d(1) if pool == "gmp" else nn.AdaptiveAvgPool2d(1)
    trunk = nn.Sequential(features, pool_layer, nn.Flatten())
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        embedder = nn.Linear(1280, dim)
    return trunk, embedder


def finetune(trunk, embedder, train_set, args, seed, device, loss="ms", cache=None):
    """Fine-tune the unfrozen tail and the embedder on cached frozen-block features; ``loss``: ``"ms"``
    (Multi-Similarity loss + miner, the paper's CUB recipe) or ``"triplet"`` (PML TripletMarginLoss, margin
    0.1,
    all triplets of the batch). Returns (mean loss of the first 10 steps, of the last 10, the cache)."""
    from pytorch_metric_learning import losses, miners, samplers

    features = trunk[0]
    frozen, tail = features[: args.freeze], nn.Sequential(*features[args.freeze :], trunk[1], trunk[2])
    for p in frozen.parameters():
        p.requires_grad_(False)
    frozen.eval()
    if cache is None:
        x = to_tensor_batch(train_set.images, args.train_size)
        with torch.no_grad():
            cache = torch.cat([frozen(x[i : i + 32].to(device)) for i in range(0, len(x), 32)])
    labels = torch.as_tensor(train_set.labels)
    sampler = samplers.MPerClassSampler(
        labels, m=4, batch_size=args.batch_size, length_before_new_iter=args.steps * args.batch_size
    )
    if loss == "ms":
        loss_fn, miner = losses.MultiSimilarityLoss(), miners.MultiSimilarityMiner(epsilon=0.1)
    elif loss == "triplet":
        loss_fn, miner = losses.TripletMarginLoss(margin=0.1), None
    else:
        raise ValueError(f"loss must be 'ms' or 'triplet', got {loss!r}")
    opt = torch.optim.Adam(
        [{"params": tail.parameters(), "lr": args.lr}, {"params": embedder.parameters(), "lr": args.lr * 10}]
    )
    tail.train()
    embedder.train()
    it = iter(sampler)
    losses_seen = []
    for _ in range(args.steps):
        idx = torch.tensor([next(it) for _ in range(args.batch_size)])
        emb = embedder(tail(cache[idx]))
        lab = labels[idx].to(device)
        loss = loss_fn(emb, lab, miner(emb, lab) if miner is not None else None)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses_seen.append(float(loss))
    for p in trunk.parameters():
        p.requires_grad_(True)
    trunk.eval()
    embedder.eval()
    return float(np.mean(losses_seen[:10])), float(np.mean(losses_seen[-10:])), cache


def same_class_neighbours(emb: torch.Tensor, labels: np.ndarray) -> np.ndarray:
    e = torch.nn.functional.normalize(emb, dim=1)
    sim = e @ e.t()
    sim.fill_diagonal_(-float("inf"))
    out = []
    for i in range(len(labels)):
        same = torch.as_tensor(labels == labels[i])
        same[i] = False
        cand = sim[i].clone()
        if bool(same.any()):
            cand[~same] = -float("inf")
        out.append(int(torch.argmax(cand)))
    return np.asarray(out)


def compute_maps(dec, cam, x, fold, fr, nn_idx, eval_batch, device, boxes, size, dec_first=None):
    """Signed maps of every method ``[N, h, w]``, and the RGrad-CAM = Decomposition+Bias identity measured by
    autograd on the first ``eval_batch`` pairs (relative max difference after ReLU, and whether the
    localisation hits agree at every threshold), for ``dec`` (GMP ties shared) and for ``dec_first``
    (``gmp_ties="first"``, autograd's tie rule)."""
    maps = {
        "Decomposition": dec.overall_maps(fold, fr)["query"],
        "Decomposition+Bias": dec.overall_maps(fold, fr, bias=True)["query"],
        DEMO: dec.overall_maps(fold, fr, relu_then_sum=True)["query"],
    }
    for name, variant in (("Grad-CAM", "cosine"), ("Grad-CAM (no norm)", "dot")):
        parts = []
        for i in range(0, len(x), eval_batch):
            q = x[i : i + eval_batch].to(device)
            r = x[torch.as_tensor(nn_idx[i : i + eval_batch])].to(device)
            parts.append(cam.maps(q, r, variant=variant, relu=False)["query"])
        maps[name] = torch.cat(parts)
    n = min(eval_batch, len(x))
    q, r = x[:n].to(device), x[torch.as_tensor(nn_idx[:n])].to(device)
    rgc = cam.maps(q, r, variant="rectified", relu=True)["query"]
    ev = LocalizationEvaluator()
    hits_rgc = [ev.correct(m, boxes[i], size) for i, m in enumerate(rgc.cpu())]

    def compare(dot_bias):
        scale = dot_bias.abs().amax().clamp_min(1e-30)
        hits_dec = [ev.correct(m, boxes[i], size) for i, m in enumerate(dot_bias.relu().cpu())]
        return (
            float((rgc - dot_bias.relu()).abs().max() / scale),
            bool(all(np.array_equal(a, b) for a, b in zip(hits_rgc, hits_dec))),
        )

    identity = {"n_pairs": n}
    identity["max_rel_diff_relu"], identity["same_hits_every_threshold"] = compare(
        dec.overall_maps(fold[torch.arange(n)], fr[torch.arange(n)], bias=True, scale="dot")["query"]
    )
    if dec_first is not None:
        identity["max_rel_diff_relu_first"], identity["same_hits_every_threshold_first"] = compare(
            dec_first.overall_maps(q, r, bias=True, scale="dot")["query"]
        )
    return maps, identity


def p_at_1(emb, labels):
    e = torch.nn.functional.normalize(emb.float(), dim=1)
    s = e @ e.t()
    s.fill_diagonal_(-float("inf"))
    return 100.0 * float(np.mean(labels[s.argmax(1).numpy()] == labels))


@torch.no_grad()
def train_embeddings(trunk, embedder, cache, freeze):
    tail = nn.Sequential(*trunk[0][freeze:], trunk[1], trunk[2]).eval()
    embedder.eval()
    return torch.cat([embedder(tail(cache[i : i + 64])) for i in range(0, len(cache), 64)]).cpu()


def run_seed(seed, args, device, losses):
    """All losses for one seed; the global torch RNG and PML's NumPy sampler state are seeded inside and
    restored afterwards."""
    from pytorch_metric_learning.utils import common_functions as c_f

    from pml_extensions.explain.folded_embedding import FoldedEmbedding

    t0 = time.time()
    train_set = CompositeLocalizationDataset(
        "train", n_images=args.n_train, image_size=args.train_size, source=args.source, seed=1000 + seed
    )
    test_set = CompositeLocalizationDataset(
        "test", n_images=args.n_test, image_size=args.size, source=args.source, seed=2000 + seed
    )
    x = to_tensor_batch(test_set.images, args.size)
    sizes = (args.size, args.size)
    ev = LocalizationEvaluator()
    out, cache = {}, None
    for loss in losses:
        t1 = time.time()
        saved = c_f.NUMPY_RANDOM
        try:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                c_f.NUMPY_RANDOM = np.random.RandomState(seed)  # MPerClassSampler: same batches for every loss
                trunk, embedder = build(args.pool, args.dim, seed)
                trunk.to(device)
                embedder.to(device)
                loss_start, loss_end, cache = finetune(
                    trunk, embedder, train_set, args, seed, device, loss=loss, cache=cache
                )
        finally:
            c_f.NUMPY_RANDOM = saved
        train_p1 = p_at_1(train_embeddings(trunk, embedder, cache, args.freeze), np.asarray(train_set.labels))
        dec = ActivationDecomposition(trunk, embedder)
        dec_first = ActivationDecomposition(trunk, embedder, gmp_ties="first")
        cam = SimilarityGradCAM(trunk, embedder)
        folds = [dec.fold_query(x[i : i + args.eval_batch].to(device)) for i in range(0, len(x), args.eval_batch)]
        cat = lambda name, folds=folds: torch.cat([getattr(f, name) for f in folds])  # noqa: E731
        fold = FoldedEmbedding(
            cat("features"),
            cat("bias"),
            cat("embedding"),
            cat("feature_map"),
            folds[0].image_size,
            folds[0].normalised,
            folds[0].exact,
        )
        nn_idx = same_class_neighbours(fold.embedding.cpu(), test_set.labels)
        fr = fold[torch.as_tensor(nn_idx)]
        maps, identity = compute_maps(
            dec, cam, x, fold, fr, nn_idx, args.eval_batch, device, test_set.boxes, sizes, dec_first
        )
        scores = {}
        for name, m in maps.items():
            for conv in CONVENTIONS:
                if name == DEMO and conv == "ReLU":
                    continue  # non-negative already: the ReLU score is the signed score
                mm = m.relu() if conv == "ReLU" else m
                r = ev.evaluate(list(mm.cpu()), test_set.boxes, sizes)
                scores[f"{name} [{conv}]"] = {
                    "best_accuracy": 100.0 * r["best_accuracy"],
                    "best_threshold": r["best_threshold"],
                    "accuracy": (100.0 * r["accuracy"]).tolist(),
                }
        out[loss] = {
            "scores": scores,
            "identity_rgradcam_vs_relu_decomposition_bias": identity,
            "train_p_at_1": train_p1,
            "test_p_at_1": p_at_1(fold.embedding.cpu(), np.asarray(test_set.labels)),
            "loss_start": loss_start,
            "loss_end": loss_end,
            "seconds": time.time() - t1,
        }
        print(
            f"seed {seed} {loss}: {time.time() - t1:.0f}s, loss {loss_start:.3f} -> {loss_end:.3f}, P@1 "
            "train "
            f"{train_p1:.1f} test {out[loss]['test_p_at_1']:.1f}; "
            + ", ".join(f"{k}: {v['best_accuracy']:.1f}" for k, v in scores.items()),
            flush=True,
        )
    centre = LocalizationEvaluator.centre_box_accuracy(test_set.boxes, sizes)
    return {
        "losses": out,
        "centre_box": {
            "best_accuracy": 100.0 * centre["best_accuracy"],
            "best_fraction": centre["best_fraction"],
        },
        "thresholds": ev.thresholds.tolist(),
        "feature_size": list(fold.feature_size),
        "seconds": time.time() - t0,
    }


def ordering(variants, names):
    return " > ".join(
        f"{n} ({variants[n]['mean']['best_accuracy']:.1f})"
        for n in sorted(names, key=lambda n: -variants[n]["mean"]["best_accuracy"])
    )


def analyse(runs, seeds, losses):
    """Summaries and paired comparisons (the issue-10 layout) per loss, plus MS vs Triplet."""
    res = {}
    for loss in losses:
        per = {}
        for s in seeds:
            for k, v in runs[s]["losses"][loss]["scores"].items():
                per.setdefault(k, {})[s] = {"best_accuracy": v["best_accuracy"]}
        per["centre box"] = {s: {"best_accuracy": runs[s]["centre_box"]["best_accuracy"]} for s in seeds}
        variants = summarize_variants(per)
        comps = []
        for conv in CONVENTIONS:
            base = f"Decomposition [{conv}]"
            names = [k for k in variants if k.endswith(f"[{conv}]") and k != base]
            comps += compare(variants, names, base, "best_accuracy")
        # the sign convention itself: ReLU vs signed, per method
        for m in METHODS:
            comps += compare(variants, [f"{m} [ReLU]"], f"{m} [signed]", "best_accuracy")
        res[loss] = {"variants": variants, "comparisons": comps}
    if "ms" in losses and "triplet" in losses:
        per = {}
        for loss in ("ms", "triplet"):
            for s in seeds:
                r = runs[s]["losses"][loss]
                row = {"train_p_at_1": r["train_p_at_1"], "test_p_at_1": r["test_p_at_1"]}
                row.update({k: v["best_accuracy"] for k, v in r["scores"].items()})
                per.setdefault(loss, {})[s] = row
        variants = summarize_variants(per)
        metrics = ["train_p_at_1", "test_p_at_1"] + list(runs[seeds[0]]["losses"]["ms"]["scores"])
        comps = [c for m in metrics for c in compare(variants, ["triplet"], "ms", m)]
        res["ms_vs_triplet"] = {"variants": variants, "comparisons": comps}
    return res


def claims(res, main):
    """Markdown lines: each paper claim beside our paired difference and a verdict read from its 95 % CI."""
    v = res[main]["variants"]
    rows = []
    for a, b, claim, kind in (
        ("Decomposition [signed]", "Grad-CAM [ReLU]", "Decomposition beats Grad-CAM (Table II)", "greater"),
        (
            "Decomposition [signed]",
            "Grad-CAM (no norm) [ReLU]",
            "Decomposition beats Grad-CAM (no norm) (Table II)",
            "greater",
        ),
        (
            "Decomposition [ReLU]",
            "Grad-CAM [ReLU]",
            "same, both maps with ReLU (method without the sign)",
            "greater",
        ),
        ("Decomposition [ReLU]", "Grad-CAM (no norm) [ReLU]", "same, both maps with ReLU", "greater"),
        (
            "Grad-CAM (no norm) [ReLU]",
            "Grad-CAM [ReLU]",
            "no norm improves Grad-CAM by a large margin (Table II)",
            "greater",
        ),
        (
            "Decomposition+Bias [signed]",
            "Decomposition [signed]",
            "the bias term does not help (Table II)",
            "on_par",
        ),
    ):
        (c,) = compare(v, [a], b, "best_accuracy")
        rows.append(f"| {claim} | {a} − {b}: {fmt_diff(c, 1)} | {verdict(c, kind)} |")
    if "ms_vs_triplet" in res:
        t = res["ms_vs_triplet"]["variants"]
        for metric, claim, kind in (
            ("train_p_at_1", "MS and Triplet: almost the same training accuracy (Table III)", "on_par"),
            ("test_p_at_1", "MS generalises better to unseen classes (Table III)", "greater"),
            ("Decomposition [signed]", "MS localises better than Triplet (Table IV)", "greater"),
            ("Decomposition+Bias [signed]", "same with Decomposition+Bias (Table IV)", "greater"),
        ):
            (c,) = compare(t, ["ms"], "triplet", metric)
            rows.append(f"| {claim} | MS − Triplet, {metric}: {fmt_diff(c, 1)} | {verdict(c, kind)} |")
    return (
        [
            "**Paper claims at our scale** (paired differences, points [95 % CI]; an interval that "
            "includes 0 "
            "shows no difference at this size, it does not prove equality):",
            "",
            "| paper claim | ours | verdict |",
            "|---|---|---|",
        ]
        + rows
        + [""]
    )


def markdown(out, args, seeds, losses):
    res, runs = out["analysis"], out["runs"]
    fs = runs[seeds[0]]["feature_size"]
    main = "ms" if "ms" in losses else losses[0]
    L = [
        f"Setup: {args.source} composites, {args.n_test} test images of unseen classes at {args.size} px -> "
        f"{fs[0]}×{fs[1]} maps; ImageNet MobileNetV2 + {args.pool.upper()} + Linear({args.dim}), "
        f"{args.steps} "
        f"fine-tuning steps on {args.n_train} training composites; seeds {list(seeds)}; accuracy = % of "
        "queries "
        "whose box has IoU > 0.5.",
        "",
        f"**Table I layout** — accuracy (%) per threshold, {LOSSES[main]} model, mean over seeds:",
        "",
    ]
    thr = runs[seeds[0]]["thresholds"]
    shown = [i for i, t in enumerate(thr) if round(t * 100) % 10 == 0]
    L += [
        "| method | convention | " + " | ".join(f"{thr[i]:.1f}" for i in shown) + " |",
        "|---|---|" + "---|" * len(shown),
    ]
    keys = list(runs[seeds[0]]["losses"][main]["scores"])
    for k in keys:
        acc = np.mean([runs[s]["losses"][main]["scores"][k]["accuracy"] for s in seeds], axis=0)
        name, conv = k[:-1].split(" [")
        L.append(f"| {name} | {conv} | " + " | ".join(f"{acc[i]:.1f}" for i in shown) + " |")
    v = res[main]["variants"]
    comps = {(c["variant"], c["baseline"]): c for c in res[main]["comparisons"]}
    L += [
        "",
        f"**Table II layout** — best accuracy over thresholds (%), {LOSSES[main]} model, mean ± std over "
        "seeds; "
        "paired difference vs Decomposition under the same convention, and ReLU minus signed per method "
        "[95 % CI]:",
        "",
        "| method | signed | ReLU | vs Decomposition (signed) | vs Decomposition (ReLU) | ReLU − signed |",
        "|---|---|---|---|---|---|",
    ]
    for m in METHODS + (DEMO,):
        s_key, r_key = f"{m} [signed]", f"{m} [ReLU]"
        cells = [
            fmt_ms(v[s_key], "best_accuracy", 1),
            fmt_ms(v[r_key], "best_accuracy", 1) if r_key in v else "(= signed)",
        ]
        for key, conv in ((s_key, "signed"), (r_key, "ReLU")):
            c = comps.get((key, f"Decomposition [{conv}]"))
            cells.append(fmt_diff(c, 1) if c else "—")
        c = comps.get((r_key, s_key))
        cells.append(fmt_diff(c, 1) if c else "—")
        L.append(f"| {m} | " + " | ".join(cells) + " |")
    L.append(f"| centre box (best side fraction) | {fmt_ms(v['centre box'], 'best_accuracy', 1)} | | | | |")
    ident = [runs[s]["losses"][lo]["identity_rgradcam_vs_relu_decomposition_bias"] for s in seeds for lo in losses]

    def yes(key):
        return "yes" if all(i[key] for i in ident) else "no"

    same_first = "max_rel_diff_relu_first" in ident[0]
    L += [
        "",
        "Rectified Grad-CAM (RGrad-CAM with its ReLU, by autograd) vs ReLU(Decomposition+Bias) on the first "
        f"{ident[0]['n_pairs']} pairs of every run, the decomposition with GMP ties shared (the default, the "
        f"rows above): max |difference| / max |map| = {max(i['max_rel_diff_relu'] for i in ident):.1e}, "
        f"localisation hits identical at every threshold: {yes('same_hits_every_threshold')}"
        + (
            f'; with ties broken as autograd breaks them (`gmp_ties="first"`): '
            f"{max(i['max_rel_diff_relu_first'] for i in ident):.1e}, hits identical: "
            f"{yes('same_hits_every_threshold_first')}"
            if same_first
            else ""
        )
        + ". MobileNetV2's last features are ReLU6 outputs: a channel saturated at 6 at several positions ties "
        "in GMP, where autograd credits the first position and the default fold shares the maximum equally; "
        + (
            "so the Decomposition+Bias [ReLU] row is rectified Grad-CAM up to that tie rule."
            if same_first and yes("same_hits_every_threshold_first") == "yes"
            else "the identity is not exact here."
        ),
        "",
        f"Ours, signed: {ordering(v, [f'{m} [signed]' for m in METHODS])}.",
        f"Ours, ReLU: {ordering(v, [f'{m} [ReLU]' for m in METHODS])}.",
        "Ours, the paper's conventions (decomposition signed, Grad-CAM ReLU): "
        + ordering(
            v,
            [
                "Decomposition [signed]",
                "Decomposition+Bias [signed]",
                "Grad-CAM [ReLU]",
                "Grad-CAM (no norm) [ReLU]",
            ],
        )
        + ".",
        f"Paper (Table II, CUB): {PAPER['table2']}",
    ]
    if "ms_vs_triplet" in res:
        t = res["ms_vs_triplet"]
        tv = t["variants"]
        tc = {c["metric"]: c for c in t["comparisons"]}
        L += [
            "",
            "**Tables III–IV layout** — Multi-Similarity vs Triplet (same initial weights and batches per "
            "seed); "
            "P@1 (%) and best localisation accuracy (%), mean ± std; paired difference Triplet − MS [95 % "
            "CI]:",
            "",
            "| metric | Multi-Similarity | Triplet | Triplet − MS |",
            "|---|---|---|---|",
        ]
        rows = ["train_p_at_1", "test_p_at_1"] + [
            f"{m} [{c}]" for m in ("Decomposition", "Decomposition+Bias", "Grad-CAM (no norm)") for c in CONVENTIONS
        ]
        labels = {
            "train_p_at_1": "P@1 training classes (Table III)",
            "test_p_at_1": "P@1 unseen classes (Table III)",
        }
        for r in rows:
            L.append(
                f"| {labels.get(r, r)} | {fmt_ms(tv['ms'], r, 1)} | {fmt_ms(tv['triplet'], r, 1)} | "
                f"{fmt_diff(tc[r], 1)} |"
            )
        L += ["", f"Paper (Table III): {PAPER['table3']} Paper (Table IV): {PAPER['table4']}"]
    L += [""] + claims(res, main)
    parts = ""
    if "part_seconds" in out:
        parts = (
            f"; {len(out['part_seconds'])} per-seed parts run in parallel, "
            + ", ".join(f"{t / 60:.1f}" for t in out["part_seconds"])
            + " min each"
        )
    L += [f"Size `{out['size']}` on {out['device']}, {out['seconds'] / 60:.1f} min wall{parts}."]
    return "\n".join(L) + "\n"


def merge_parts(paths, out_dir, tag=""):
    """Combine per-seed parts (same arguments apart from the seeds) into one results file and its tables.

    Raises:
        ValueError: parts with other arguments, or a seed in two parts.
    """
    import json

    parts = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            parts.append(json.load(f))
    ignore = ("seeds", "tag", "out", "merge", "from_json")
    ref = {k: v for k, v in parts[0]["args"].items() if k not in ignore}
    runs = {}
    for path, part in zip(paths, parts):
        if {k: v for k, v in part["args"].items() if k not in ignore} != ref:
            raise ValueError(f"--merge: {path} was run with other arguments than {paths[0]}")
        for s in part["seeds"]:
            if s in runs:
                raise ValueError(f"--merge: seed {s} is in two parts")
            runs[s] = part["runs"][str(s)]
    seeds = sorted(runs)
    args = argparse.Namespace(**parts[0]["args"])
    args.seeds = seeds
    out = {
        "size": parts[0]["size"],
        "device": parts[0]["device"],
        "args": vars(args),
        "seeds": seeds,
        "paper": PAPER,
        "runs": runs,
        "part_seconds": [p["seconds"] for p in parts],
    }
    out["seconds"] = max(out["part_seconds"])
    out["analysis"] = analyse(runs, seeds, args.losses)
    md = markdown(out, args, seeds, args.losses)
    out["markdown"] = md
    suffix = f"_{tag}" if tag else ""
    atomic_write_json(os.path.join(out_dir, f"localization{suffix}.json"), out)
    atomic_write_text(os.path.join(out_dir, f"localization{suffix}.md"), md)
    print(md)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", choices=sorted(SIZES), default="quick")
    p.add_argument("--seeds", type=int, nargs="+", default=None, help="override the size's seeds")
    p.add_argument("--losses", nargs="+", choices=sorted(LOSSES), default=["ms", "triplet"])
    p.add_argument("--n-train", type=int, default=None)
    p.add_argument("--n-test", type=int, default=None)
    p.add_argument("--steps", type=int, default=None, help="fine-tuning steps (0: ImageNet weights only)")
    p.add_argument("--image-size", type=int, default=None, help="evaluation input side (320 -> 10x10 maps)")
    p.add_argument("--train-size", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--freeze", type=int, default=14, help="MobileNetV2 feature blocks kept frozen (of 19)")
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--pool", choices=("gmp", "gap"), default="gmp")
    p.add_argument("--source", choices=("clipart", "glyph"), default="clipart")
    p.add_argument("--eval-batch", type=int, default=20)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--tag", default="", help="suffix of the result file names")
    p.add_argument("--out", default=RESULTS)
    p.add_argument("--from-json", default=None, help="re-render the .md from an existing results JSON")
    p.add_argument(
        "--merge",
        nargs="+",
        default=None,
        help="combine the JSONs of per-seed parts run in parallel into --out/localization[_TAG].json",
    )
    args = p.parse_args(argv)
    if args.merge:
        return merge_parts(args.merge, args.out, args.tag)
    if args.from_json:
        import json

        with open(args.from_json, encoding="utf-8") as f:
            out = json.load(f)
        seeds = out["seeds"]
        out["runs"] = {s: out["runs"][str(s)] for s in seeds}
        losses = out["args"]["losses"]
        out["analysis"] = analyse(out["runs"], seeds, losses)
        md = markdown(out, argparse.Namespace(**out["args"]), seeds, losses)
        out["markdown"] = md
        atomic_write_json(args.from_json, out)
        atomic_write_text(os.path.splitext(args.from_json)[0] + ".md", md)
        print(md)
        return out
    cfg = SIZES[args.size]
    for key in ("n_train", "n_test", "steps", "train_size"):
        if getattr(args, key) is None:
            setattr(args, key, cfg[key])
    args.size_name = args.size
    args.size = args.image_size or cfg["size"]
    seeds = tuple(args.seeds or cfg["seeds"])
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()
    runs = {s: run_seed(s, args, device, args.losses) for s in seeds}
    out = {
        "size": args.size_name,
        "device": str(device),
        "args": vars(args),
        "seeds": list(seeds),
        "paper": PAPER,
        "runs": runs,
    }
    out["analysis"] = analyse(runs, seeds, args.losses)
    out["seconds"] = time.time() - t0
    md = markdown(out, args, seeds, args.losses)
    out["markdown"] = md
    suffix = f"_{args.tag}" if args.tag else ""
    atomic_write_json(os.path.join(args.out, f"localization{suffix}.json"), out)
    atomic_write_text(os.path.join(args.out, f"localization{suffix}.md"), md)
    print(md)
    return out


if __name__ == "__main__":
    main()
