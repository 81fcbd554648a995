"""Weakly supervised localisation with explanation maps (Zhu et al., TIP 2021, Sec. VI-A, Tables I-II).

Data: CompositeLocalizationDataset — Open Clip Art drawings (or glyph ink, --source glyph) pasted on
scikit-image photos/textures with exact boxes; class-disjoint: the model is fine-tuned on the training classes
and evaluated on the test classes. Model: ImageNet MobileNetV2 features -> GMP (default, as the paper's CUB
model; --pool gap) -> Linear(1280, 128), fine-tuned briefly with the Multi-Similarity loss (the paper's CUB
recipe) on the training composites at --train-size px (the first --freeze blocks frozen, their outputs
cached). Evaluation at --size px (320 -> 10 x 10 feature maps). Each test image (query) is paired with its
nearest test image of the same class (cosine); the query's map is scored: min-max -> bilinear resize ->
threshold grid -> largest connected component -> box -> IoU > 0.5. Reported: best accuracy over thresholds per
method (and its threshold), mean ± std over seeds, plus a centred-box baseline (best box size chosen on the
test set, like the thresholds).

    python benchmarks/localization.py        # --quick default (<= 2 CPU threads, a few minutes per seed)
    python benchmarks/localization.py --n-train 3000 --n-test 1000 --steps 2000 --device cuda  # larger

Writes benchmarks/results/localization.json, localization_example.png and prints markdown tables.
"""

import argparse
import os
import sys
import time

import numpy as np
import torch
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from pml_extensions.explain.activation_decomposition import ActivationDecomposition  # noqa: E402
from pml_extensions.explain.composite_localization_dataset import CompositeLocalizationDataset  # noqa: E402
from pml_extensions.explain.localization_evaluator import LocalizationEvaluator  # noqa: E402
from pml_extensions.explain.overlay import save_pair_overlay, to_display_image  # noqa: E402
from pml_extensions.explain.similarity_grad_cam import SimilarityGradCAM  # noqa: E402
from pml_extensions.utils.atomic_io import atomic_write_json

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
METHODS = (
    "Decomposition",
    "Decomposition+Bias",
    "Decomposition (demo ReLU-then-sum)",
    "Grad-CAM",
    "Grad-CAM (no norm)",
    "RGrad-CAM",
)


def to_tensor_batch(pil_images, size):
    from torchvision.transforms import functional as TF

    out = []
    for im in pil_images:
        if im.size != (size, size):
            im = im.resize((size, size))
        out.append(TF.normalize(TF.to_tensor(im), MEAN, STD))
    return torch.stack(out)


def build(pool: str, dim: int, seed: int):
    from pml_extensions.trunks.pretrained import mobilenet_v2_features

    features = mobilenet_v2_features(pretrained=True)
    pool_layer = nn.AdaptiveMaxPool2d(1) if pool == "gmp" else nn.AdaptiveAvgPool2d(1)
    trunk = nn.Sequential(features, pool_layer, nn.Flatten())
    embedder = nn.Linear(1280, dim)
    return trunk, embedder


def finetune(trunk, embedder, train_set, args, seed, device):
    from pytorch_metric_learning import losses, miners, samplers

    features = trunk[0]
    frozen, tail = features[: args.freeze], nn.Sequential(*features[args.freeze :], trunk[1], trunk[2])
    for p in frozen.parameters():
        p.requires_grad_(False)
    frozen.eval()
    x = to_tensor_batch(train_set.images, args.train_size)
    with torch.no_grad():
        cache = torch.cat([frozen(x[i : i + 32].to(device)) for i in range(0, len(x), 32)])
    labels = torch.as_tensor(train_set.labels)
    sampler = samplers.MPerClassSampler(
        labels, m=4, batch_size=args.batch_size, length_before_new_iter=args.steps * args.batch_size
    )
    loss_fn = losses.MultiSimilarityLoss()
    miner = miners.MultiSimilarityMiner(epsilon=0.1)
    opt = torch.optim.Adam(
        [{"params": tail.parameters(), "lr": args.lr}, {"params": embedder.parameters(), "lr": args.lr * 10}]
    )
    tail.train()
    embedder.train()
    it = iter(sampler)
    losses_seen = []
    for step in range(args.steps):
        idx = torch.tensor([next(it) for _ in range(args.batch_size)])
        emb = embedder(tail(cache[idx]))
        lab = labels[idx].to(device)
        loss = loss_fn(emb, lab, miner(emb, lab))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses_seen.append(float(loss))
    for p in trunk.parameters():
        p.requires_grad_(True)
    trunk.eval()
    embedder.eval()
    return float(np.mean(losses_seen[:10])), float(np.mean(losses_seen[-10:]))


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


def run_seed(seed, args, device, example_path=None):
    """One seed; global RNGs (torch, PML's NumPy sampler state) are seeded inside a fork and restored
    afterwards."""
    from pytorch_metric_learning.utils import common_functions as c_f

    saved = c_f.NUMPY_RANDOM
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            c_f.NUMPY_RANDOM = np.random.RandomState(seed)
            return _run_seed(seed, args, device, example_path)
    finally:
        c_f.NUMPY_RANDOM = saved


def _run_seed(seed, args, device, example_path=None):
    t0 = time.time()
    train_set = CompositeLocalizationDataset(
        "train", n_images=args.n_train, image_size=args.train_size, source=args.source, seed=1000 + seed
    )
    test_set = CompositeLocalizationDataset(
        "test", n_images=args.n_test, image_size=args.size, source=args.source, seed=2000 + seed
    )
    trunk, embedder = build(args.pool, args.dim, seed)
    trunk.to(device)
    embedder.to(device)
    loss_start, loss_end = (float("nan"), float("nan"))
    if args.steps > 0:
        loss_start, loss_end = finetune(trunk, embedder, train_set, args, seed, device)
    t_train = time.time() - t0
    dec = ActivationDecomposition(trunk, embedder)
    cam = SimilarityGradCAM(trunk, embedder)
    x = to_tensor_batch(test_set.images, args.size)
    folds = [dec.fold_query(x[i : i + args.eval_batch].to(device)) for i in range(0, len(x), args.eval_batch)]
    cat = lambda name: torch.cat([getattr(f, name) for f in folds])  # noqa: E731
    from pml_extensions.explain.folded_embedding import FoldedEmbedding

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
    maps = {
        "Decomposition": dec.overall_maps(fold, fr)["query"],
        "Decomposition+Bias": dec.overall_maps(fold, fr, bias=True)["query"],
        "Decomposition (demo ReLU-then-sum)": dec.overall_maps(fold, fr, relu_then_sum=True)["query"],
    }
    for name, variant in (("Grad-CAM", "cosine"), ("Grad-CAM (no norm)", "dot"), ("RGrad-CAM", "rectified")):
        parts = []
        for i in range(0, len(x), args.eval_batch):
            q = x[i : i + args.eval_batch].to(device)
            r = x[torch.as_tensor(nn_idx[i : i + args.eval_batch])].to(device)
            parts.append(cam.maps(q, r, variant=variant)["query"])
        maps[name] = torch.cat(parts)
    ev = LocalizationEvaluator()
    sizes = (args.size, args.size)
    res = {name: ev.evaluate(list(m.cpu()), test_set.boxes, sizes) for name, m in maps.items()}
    centre = LocalizationEvaluator.centre_box_accuracy(test_set.boxes, sizes)
    # retrieval sanity: same-class top-1 among test images (precision@1)
    e = torch.nn.functional.normalize(fold.embedding.cpu(), dim=1)
    s = e @ e.t()
    s.fill_diagonal_(-float("inf"))
    p_at_1 = float(np.mean(test_set.labels[s.argmax(1).numpy()] == test_set.labels))
    if example_path is not None:
        n = 0
        pm = dec.point_specific(
            fold[n],
            fr[n],
            [tuple(np.unravel_index(int(torch.argmax(maps["Decomposition"][n])), fold.feature_size))],
            coordinates="feature",
        )
        plain = dec.overall_maps(fold[n], fr[n])
        bias = dec.overall_maps(fold[n], fr[n], bias=True)
        gc = cam.maps(x[n : n + 1].to(device), x[nn_idx[n] : nn_idx[n] + 1].to(device), variant="cosine")
        panels = [
            [
                ("Decomposition (query)", "query", plain["query"][0], None),
                ("Decomposition+Bias (query)", "query", bias["query"][0], None),
                ("Grad-CAM (query)", "query", gc["query"][0], None),
                ("Decomposition (retrieved)", "reference", plain["reference"][0], None),
                ("point-specific (retrieved)", "reference", pm[0, 0], None),
            ]
        ]
        save_pair_overlay(
            example_path,
            to_display_image(x[n], MEAN, STD),
            [to_display_image(x[nn_idx[n]], MEAN, STD)],
            panels,
            title=f"cosine {float(plain['similarity'][0]):.3f}; query box {test_set.boxes[n].tolist()}",
        )
    return {
        "seed": seed,
        "methods": {
            k: {
                "best_accuracy": v["best_accuracy"],
                "best_threshold": v["best_threshold"],
                "accuracy": v["accuracy"].tolist(),
            }
            for k, v in res.items()
        },
        "centre_box": {"best_accuracy": centre["best_accuracy"], "best_fraction": centre["best_fraction"]},
        "thresholds": ev.thresholds.tolist(),
        "precision_at_1": p_at_1,
        "loss_start": loss_start,
        "loss_end": loss_end,
        "feature_size": list(fold.feature_size),
        "seconds": time.time() - t0,
        "train_seconds": t_train,
    }


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="the default reduced size")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--n-train", type=int, default=320)
    p.add_argument("--n-test", type=int, default=80)
    p.add_argument("--size", type=int, default=320, help="evaluation input side (320 -> 10x10 maps)")
    p.add_argument("--train-size", type=int, default=224)
    p.add_argument("--steps", type=int, default=80, help="fine-tuning steps (0: ImageNet weights only)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--freeze", type=int, default=14, help="MobileNetV2 feature blocks kept frozen (of 19)")
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--pool", choices=("gmp", "gap"), default="gmp")
    p.add_argument("--source", choices=("clipart", "glyph"), default="clipart")
    p.add_argument("--eval-batch", type=int, default=20)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=min(2, torch.get_num_threads()))
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    os.makedirs(args.out, exist_ok=True)
    runs = []
    for i, seed in enumerate(args.seeds):
        example = os.path.join(args.out, "localization_example.png") if i == 0 else None
        runs.append(run_seed(seed, args, device, example))
        r = runs[-1]
        print(
            f"seed {seed}: {r['seconds']:.0f}s, loss {r['loss_start']:.3f} -> {r['loss_end']:.3f}, P@1 "
            f"{r['precision_at_1']:.3f}, "
            + ", ".join(f"{k}: {v['best_accuracy']:.3f}" for k, v in r["methods"].items())
            + f", centre box: {r['centre_box']['best_accuracy']:.3f}",
            flush=True,
        )
    names = list(METHODS) + ["centre box"]

    def values(name):
        if name == "centre box":
            return np.array([r["centre_box"]["best_accuracy"] for r in runs])
        return np.array([r["methods"][name]["best_accuracy"] for r in runs])

    print(
        f"\nlocalization ({args.source} composites, {args.n_test} test images at {args.size} px -> "
        f"{runs[0]['feature_size'][0]}x{runs[0]['feature_size'][1]} maps; MobileNetV2 + "
        f"{args.pool.upper()} + "
        f"Linear({args.dim}), {args.steps} fine-tuning steps; mean ± std over seeds {args.seeds})\n"
    )
    print("| method | best accuracy (IoU > 0.5) | best thresholds per seed |")
    print("|---|---|---|")
    for name in names:
        v = values(name)
        thr = [
            r["centre_box"]["best_fraction"] if name == "centre box" else r["methods"][name]["best_threshold"]
            for r in runs
        ]
        label = "centre box (best side fraction)" if name == "centre box" else name
        print(
            f"| {label} | {100 * v.mean():.1f} ± {100 * v.std():.1f} % | "
            f"{', '.join(f'{t:.2f}' for t in thr)} |"
        )
    thr = runs[0]["thresholds"]
    print("\naccuracy (%) per threshold, mean over seeds (Table I layout)\n")
    shown = [i for i, t in enumerate(thr) if abs(t * 20 - round(t * 20)) < 1e-9 and round(t * 20) % 2 == 0]
    print("| method | " + " | ".join(f"{thr[i]:.1f}" for i in shown) + " |")
    print("|---|" + "---|" * len(shown))
    for name in METHODS:
        acc = np.mean([r["methods"][name]["accuracy"] for r in runs], axis=0)
        print(f"| {name} | " + " | ".join(f"{100 * acc[i]:.1f}" for i in shown) + " |")
    print(
        f"\nsame-class precision@1 on the test composites: "
        f"{np.mean([r['precision_at_1'] for r in runs]):.3f}"
    )
    atomic_write_json(os.path.join(args.out, "localization.json"), {"args": vars(args), "runs": runs})
    return runs


if __name__ == "__main__":
    main()
