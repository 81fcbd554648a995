#!/usr/bin/env python
"""Template-matching block benchmark (Gorgun, Gurbuz & Alatan, BMVC 2022; issue 3, items 5 and 6).

Three experiments on offline real data, each over several seeds (mean ± std):

1. Fashion-MNIST classification (10 classes, official train/test files, subsampled in ``--size quick``): a
   small 4-stage ResNet (torchvision BasicBlocks; down-sampling in stages 2 and 3 as in the paper's RN) as
   baseline, + template-matching block between stages 3 and 4 (λ = 0.5), and + auxiliary patch loss only.
2. Glyph deep metric learning on unseen classes (``pml_extensions.datasets.GlyphDataset``: train on 31
   characters, test MAP@R / P@1 on the other 31; Multi-Similarity loss): the same three variants; the block's
   31 train-class scores act as templates at test time.
3. Soft-maximizer ablation (paper Sec. 4.1, Fig. 3) on Fashion-MNIST with a 3-stage ResNet: BN-ReLU after
   every 3×3 conv vs the margin-augmented soft-max vs the perturbed maximizer, μ and η estimated from the
   trained BN-ReLU model, at batch 8 and 32 (the perturbed maximizer at batch 8 only, as in the paper).

Training recipe (not stated in the paper's text): Adam with a one-cycle learning-rate schedule, no
augmentation, λ = 0.5 (paper), window w/2 × h/2 (paper).

Beyond the paper (paper Fig. 7): k-means "visual words" of the block's class-score vectors on Fashion-MNIST
test images; the 16 patches nearest to the 16 largest clusters with their top classes, saved as a PNG.

    OMP_NUM_THREADS=1 python benchmarks/template_block.py       # --size quick: minutes on 2 CPU cores
    python benchmarks/template_block.py --size full --device cuda  # larger nets, full data, S = 600

Outputs: a markdown table on stdout, ``benchmarks/results/template_block.json`` and
``benchmarks/results/template_block_visual_words.png``.
"""

import argparse
import logging
import os
import sys
import time

os.environ.setdefault("TQDM_DISABLE", "1")

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import numpy as np  # noqa: E402
import torch  # noqa: E402
from pytorch_metric_learning import losses as pml_losses  # noqa: E402
from pytorch_metric_learning import samplers as pml_samplers  # noqa: E402
from pytorch_metric_learning import trainers as pml_trainers  # noqa: E402
from pytorch_metric_learning.utils import common_functions as pml_cf  # noqa: E402
from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator  # noqa: E402
from torchvision.models.resnet import BasicBlock  # noqa: E402

from pml_extensions.trainers.template_matching_trainer import TemplateMatchingTrainer  # noqa: E402
from pml_extensions.trunks.soft_maximizer_swap import estimate_eta  # noqa: E402
from pml_extensions.trunks.soft_maximizer_swap import estimate_mu, soft_maximizer_swap  # noqa: E402
from pml_extensions.trunks.template_matching_inserter import (  # noqa: E402
    insert_template_matching,
    template_matching_blocks,
)
from pml_extensions.utils.atomic_io import atomic_savefig, atomic_write_json  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
FASHION_CLASSES = [
    "T-shirt",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Boot",
]

SIZES = {
    "quick": dict(
        fashion_train_per_class=400,
        fashion_test_per_class=100,
        widths=(8, 16, 32, 32),
        blocks=1,
        ablation_widths=(8, 16, 32),
        iters=200,
        glyph_iters=200,
        batch=32,
        lr=5e-3,
        seeds=(0, 1, 2),
        perturbed_samples=8,
        kmeans_k=32,
        glyph_source="matplotlib",
    ),
    "full": dict(
        fashion_train_per_class=None,
        fashion_test_per_class=None,
        widths=(64, 128, 256, 256),
        blocks=2,
        ablation_widths=(16, 32, 64),
        iters=6000,
        glyph_iters=3000,
        batch=32,
        lr=2e-3,
        seeds=(0, 1, 2),
        perturbed_samples=600,
        kmeans_k=100,
        glyph_source="all",
    ),
}


def log(msg):
    print(msg, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------------------------------------
# data (preloaded tensors; the PML trainers get TensorDatasets)
def load_fashion(split, per_class, seed=0):
    from pml_extensions.datasets import FashionMNIST

    ds = FashionMNIST(split, class_disjoint=False, max_per_class=per_class, seed=seed)
    x = torch.from_numpy(ds.images.astype(np.float32) / 255.0)[:, None]
    return (x - 0.286) / 0.353, torch.from_numpy(ds.labels)


def load_glyphs(split, source):
    from pml_extensions.datasets import GlyphDataset

    ds = GlyphDataset(split=split, image_size=32, source=source)
    x = torch.from_numpy(np.stack([np.asarray(im, dtype=np.float32) / 255.0 for im in ds.images]))[:, None]
    return (x - 0.85) / 0.3, torch.from_numpy(ds.labels)


# ----------------------------------------------------------------------------------------------------------------
class SmallResNet(torch.nn.Module):
    """ResNet of torchvision BasicBlocks for small images: 3×3 stem (stride 1), stages ``layer1..layerS``
    where stages 2 and 3 halve the resolution (paper's RN: reduction in stages 2-3), global average pooling ->
    [B, w_S].
    """

    def __init__(self, in_channels, widths, blocks=1):
        super().__init__()
        self.stem = torch.nn.Sequential(
            torch.nn.Conv2d(in_channels, widths[0], 3, padding=1, bias=False),
            torch.nn.BatchNorm2d(widths[0]),
            torch.nn.ReLU(inplace=True),
        )
        c = widths[0]
        for s, w in enumerate(widths):
            stride = 2 if s in (1, 2) else 1
            layers = []
            for b in range(blocks):
                st = stride if b == 0 else 1
                down = None
                if st != 1 or c != w:
                    down = torch.nn.Sequential(
                        torch.nn.Conv2d(c, w, 1, stride=st, bias=False), torch.nn.BatchNorm2d(w)
                    )
                layers.append(BasicBlock(c, w, stride=st, downsample=down))
                c = w
            setattr(self, f"layer{s + 1}", torch.nn.Sequential(*layers))
        self.num_stages = len(widths)
        self.out_channels = c

    def features(self, x):
        x = self.stem(x)
        for s in range(self.num_stages):
            x = getattr(self, f"layer{s + 1}")(x)
        return x

    def forward(self, x):
        return self.features(x).mean(dim=(2, 3))


def make_trunk(variant, in_channels, widths, blocks, num_classes):
    trunk = SmallResNet(in_channels, widths, blocks)
    if variant == "block":
        insert_template_matching(trunk, num_classes, inplace=True)
    elif variant == "aux_only":
        insert_template_matching(trunk, num_classes, inplace=True, mixing="none")
    return trunk


def train(models, loss_funcs, data, iters, batch, lr, seed, device, sampler=None):
    x, y = data
    dataset = torch.utils.data.TensorDataset(x, y)
    if sampler is None:
        sampler = torch.utils.data.RandomSampler(
            dataset,
            replacement=True,
            num_samples=iters * batch,
            generator=torch.Generator().manual_seed(seed),
        )
    models = {k: v.to(device) for k, v in models.items()}
    optimizers = {
        f"{k}_optimizer": torch.optim.Adam(v.parameters(), lr=lr)
        for k, v in models.items()
        if any(True for _ in v.parameters())
    }
    # one-cycle schedule per optimizer, stepped by PML after every iteration
    schedulers = {
        k.replace("_optimizer", "_scheduler_by_iteration"): torch.optim.lr_scheduler.OneCycleLR(
            o, max_lr=lr, total_steps=iters
        )
        for k, o in optimizers.items()
    }
    has_block = bool(template_matching_blocks(models["trunk"]))
    cls = TemplateMatchingTrainer if has_block else pml_trainers.TrainWithClassifier
    trainer = cls(
        models=models,
        optimizers=optimizers,
        batch_size=batch,
        loss_funcs=loss_funcs,
        dataset=dataset,
        sampler=sampler,
        iterations_per_epoch=iters,
        data_device=device,
        dataloader_num_workers=0,
        lr_schedulers=schedulers,
    )
    trainer.train(num_epochs=1)
    return trainer


@torch.no_grad()
def embed(models, x, device, head=None, bs=500):
    for m in models.values():
        m.eval()
    outs = []
    for i in range(0, len(x), bs):
        h = models["trunk"](x[i : i + bs].to(device))
        outs.append((models[head](h) if head else h).cpu())
    return torch.cat(outs)


def count_params(models):
    return sum(p.numel() for m in models.values() for p in m.parameters())


# ----------------------------------------------------------------------------------------------------------------
def run_fashion(variant, seed, cfg, fashion, device):
    (xtr, ytr), (xte, yte) = fashion
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        trunk = make_trunk(variant, 1, cfg["widths"], cfg["blocks"], 10)
        models = {"trunk": trunk, "classifier": torch.nn.Linear(trunk.out_channels, 10)}
        trainer = train(
            models,
            {"classifier_loss": torch.nn.CrossEntropyLoss()},
            (xtr, ytr),
            cfg["iters"],
            cfg["batch"],
            cfg["lr"],
            seed,
            device,
        )
    logits = embed(trainer.models, xte, device, head="classifier")
    return {
        "accuracy": float((logits.argmax(1) == yte).float().mean() * 100),
        "params": count_params(models),
    }, trainer


def run_glyph(variant, seed, cfg, glyphs, device):
    (xtr, ytr), (xte, yte) = glyphs
    np_state = pml_cf.NUMPY_RANDOM
    pml_cf.NUMPY_RANDOM = np.random.RandomState(seed)  # MPerClassSampler's shuffles, restored below
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            trunk = make_trunk(variant, 1, cfg["widths"], cfg["blocks"], int(ytr.max()) + 1)
            models = {"trunk": trunk, "embedder": torch.nn.Linear(trunk.out_channels, 64)}
            sampler = pml_samplers.MPerClassSampler(
                ytr.numpy(),
                m=4,
                batch_size=cfg["batch"],
                length_before_new_iter=cfg["glyph_iters"] * cfg["batch"],
            )
            trainer = train(
                models,
                {"metric_loss": pml_losses.MultiSimilarityLoss()},
                (xtr, ytr),
                cfg["glyph_iters"],
                cfg["batch"],
                cfg["lr"],
                seed,
                device,
                sampler=sampler,
            )
    finally:
        pml_cf.NUMPY_RANDOM = np_state
    emb = torch.nn.functional.normalize(embed(trainer.models, xte, device, head="embedder"), dim=1)
    acc = AccuracyCalculator(include=("mean_average_precision_at_r", "precision_at_1"), k="max_bin_count")
    res = acc.get_accuracy(emb, yte, emb, yte, ref_includes_query=True)
    return {
        "map_at_r": res["mean_average_precision_at_r"] * 100,
        "p_at_1": res["precision_at_1"] * 100,
        "params": count_params(models),
    }


def run_ablation(mixing, batch, seed, cfg, fashion, device, mu=None, eta=None):
    (xtr, ytr), (xte, yte) = fashion
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        trunk = SmallResNet(1, cfg["ablation_widths"], 1)
        if mixing != "bn_relu":
            trunk = soft_maximizer_swap(
                trunk,
                mixing,
                mu=mu,
                eta=eta,
                epsilon=1.0,
                num_samples=cfg["perturbed_samples"],
                seed=seed * 100,
                inplace=True,
            )
        models = {"trunk": trunk, "classifier": torch.nn.Linear(trunk.out_channels, 10)}
        trainer = train(
            models,
            {"classifier_loss": torch.nn.CrossEntropyLoss()},
            (xtr, ytr),
            cfg["iters"],
            batch,
            cfg["lr"],
            seed,
            device,
        )
    logits = embed(trainer.models, xte, device, head="classifier")
    return {"accuracy": float((logits.argmax(1) == yte).float().mean() * 100)}, trainer


# ----------------------------------------------------------------------------------------------------------------
@torch.no_grad()
def visual_words(trainer, xte, yte, device, k, path, seed=0, max_images=1000):
    """k-means (faiss) of the block's soft-maxed per-pixel class scores; one patch per the 16 largest
    clusters."""
    import faiss
    import matplotlib.pyplot as plt

    trunk = trainer.models["trunk"].eval()
    block = template_matching_blocks(trunk)[0]
    x = xte[:max_images]
    trunk(x.to(device))
    probs = torch.softmax(block.last_class_scores, dim=1).cpu()  # [N, c, h, w]
    n, c, h, w = probs.shape
    vecs = probs.permute(0, 2, 3, 1).reshape(-1, c).numpy().astype(np.float32)
    km = faiss.Kmeans(c, k, niter=25, seed=seed, verbose=False)
    km.train(vecs)
    _, assign = km.index.search(vecs, 1)
    sizes = np.bincount(assign[:, 0], minlength=k)
    order = np.argsort(-sizes)[:16]
    index = faiss.IndexFlatL2(c)
    index.add(vecs)
    _, nearest = index.search(km.centroids[order], 1)
    stride = x.shape[-1] / w
    kh, kw = block.window_for(h, w)
    fig, axes = plt.subplots(4, 4, figsize=(8, 9))
    for ax, cluster, v in zip(axes.flat, order, nearest[:, 0]):
        img, pix = divmod(int(v), h * w)
        i, j = divmod(pix, w)
        # image region under the pooled window (rows i - (kh-1)//2 .. i + kh//2 of the map) plus one map cell
        r0 = int(max(0, (i - (kh - 1) // 2 - 1) * stride))
        r1 = int(min(x.shape[-2], (i + kh // 2 + 2) * stride))
        c0 = int(max(0, (j - (kw - 1) // 2 - 1) * stride))
        c1 = int(min(x.shape[-1], (j + kw // 2 + 2) * stride))
        ax.imshow(x[img, 0].numpy(), cmap="gray")
        ax.add_patch(plt.Rectangle((c0 - 0.5, r0 - 0.5), c1 - c0, r1 - r0, fill=False, ec="red", lw=1.5))
        top = np.argsort(-vecs[v])[:2]
        ax.set_title(
            "\n".join(f"{FASHION_CLASSES[t]} {vecs[v][t]:.2f}" for t in top) + f"\n(n={sizes[cluster]})",
            fontsize=7,
        )
        ax.axis("off")
    fig.suptitle(
        f"Visual words: k-means (k={k}) of block class scores, nearest patch to the 16 largest clusters",
        fontsize=8,
    )
    fig.tight_layout()
    try:
        atomic_savefig(fig, path, dpi=110)
    finally:
        plt.close(fig)


def mean_std(values):
    a = np.asarray(values, dtype=float)
    return f"{a.mean():.2f} ± {a.std(ddof=1) if len(a) > 1 else 0.0:.2f}"


def write_json(obj, path):
    atomic_write_json(path, obj)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="quick")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seeds", type=int, nargs="*", default=None, help="override the seeds")
    parser.add_argument("--skip", nargs="*", default=(), choices=("fashion", "glyph", "ablation"))
    parser.add_argument(
        "--iters", type=int, default=None, help="override the training iterations (all parts)"
    )
    parser.add_argument("--tag", default="", help="suffix of the result file names")
    args = parser.parse_args(argv)
    cfg = dict(SIZES[args.size])
    if args.seeds:
        cfg["seeds"] = tuple(args.seeds)
    if args.iters:
        cfg["iters"] = cfg["glyph_iters"] = args.iters
    suffix = f"_{args.tag}" if args.tag else ""
    device = torch.device(args.device)
    logging.getLogger("PML").setLevel(logging.ERROR)
    os.makedirs(RESULTS, exist_ok=True)
    t0, c0 = time.time(), time.process_time()
    out = {"size": args.size, "config": {k: v for k, v in cfg.items()}, "device": str(device)}
    lines = []

    fashion = (
        load_fashion("train", cfg["fashion_train_per_class"]),
        load_fashion("test", cfg["fashion_test_per_class"]),
    )
    log(f"fashion: {len(fashion[0][1])} train / {len(fashion[1][1])} test images")

    if "fashion" not in args.skip:
        res = {}
        for variant in ("baseline", "block", "aux_only"):
            for seed in cfg["seeds"]:
                t = time.time()
                r, trainer = run_fashion(variant, seed, cfg, fashion, device)
                res.setdefault(variant, []).append(r)
                log(f"fashion {variant} seed {seed}: {r} ({time.time() - t:.0f}s)")
                if variant == "block" and seed == cfg["seeds"][0]:
                    png = os.path.join(RESULTS, f"template_block_visual_words{suffix}.png")
                    visual_words(trainer, fashion[1][0], fashion[1][1], device, cfg["kmeans_k"], png)
                    out["visual_words_png"] = png
        out["fashion"] = res
        lines += [
            f"**Fashion-MNIST classification** ({len(fashion[0][1])} train / {len(fashion[1][1])} test "
            f"images, 4-stage ResNet widths {cfg['widths']}, {cfg['iters']} iterations × batch "
            f"{cfg['batch']}, "
            f"{len(cfg['seeds'])} seeds; test accuracy %)",
            "",
            "| variant | accuracy | params |",
            "|---|---|---|",
        ]
        for variant, rows in res.items():
            lines.append(f"| {variant} | {mean_std([r['accuracy'] for r in rows])} | {rows[0]['params']} |")
        lines.append("")

    if "glyph" not in args.skip:
        glyphs = (load_glyphs("train", cfg["glyph_source"]), load_glyphs("test", cfg["glyph_source"]))
        log(f"glyphs: {len(glyphs[0][1])} train / {len(glyphs[1][1])} test images")
        res = {}
        for variant in ("baseline", "block", "aux_only"):
            for seed in cfg["seeds"]:
                t = time.time()
                r = run_glyph(variant, seed, cfg, glyphs, device)
                res.setdefault(variant, []).append(r)
                log(f"glyph {variant} seed {seed}: {r} ({time.time() - t:.0f}s)")
        out["glyph"] = res
        lines += [
            f"**Glyphs, unseen classes** (train 31 classes / {len(glyphs[0][1])} images, test the other 31 / "
            f"{len(glyphs[1][1])} images; Multi-Similarity loss, {cfg['glyph_iters']} iterations; %)",
            "",
            "| variant | MAP@R | P@1 |",
            "|---|---|---|",
        ]
        for variant, rows in res.items():
            lines.append(
                f"| {variant} | {mean_std([r['map_at_r'] for r in rows])} | "
                f"{mean_std([r['p_at_1'] for r in rows])} |"
            )
        lines.append("")

    if "ablation" not in args.skip:
        res = {}
        mus, etas = [], []
        for batch in (8, 32):
            for seed in cfg["seeds"]:
                t = time.time()
                r, trainer = run_ablation("bn_relu", batch, seed, cfg, fashion, device)
                probe = [fashion[0][0][i : i + 250] for i in range(0, 1000, 250)]
                r["mu"] = estimate_mu(trainer.models["trunk"], probe)
                r["eta"] = estimate_eta(trainer.models["trunk"], probe)
                mus.append(r["mu"])
                etas.append(r["eta"])
                res.setdefault(f"bn_relu/{batch}", []).append(r)
                log(f"ablation bn_relu bs {batch} seed {seed}: {r} ({time.time() - t:.0f}s)")
        mu, eta = float(np.mean(mus)), float(np.mean(etas))
        out["estimated_mu"], out["estimated_eta"] = mu, eta
        for mixing, batches in (("softmax", (8, 32)), ("perturbed", (8,))):
            for batch in batches:
                for seed in cfg["seeds"]:
                    t = time.time()
                    r, _ = run_ablation(mixing, batch, seed, cfg, fashion, device, mu=mu, eta=eta)
                    res.setdefault(f"{mixing}/{batch}", []).append(r)
                    log(f"ablation {mixing} bs {batch} seed {seed}: {r} ({time.time() - t:.0f}s)")
        out["ablation"] = res
        lines += [
            f"**Soft maximizers instead of BN-ReLU** (3-stage ResNet widths {cfg['ablation_widths']}, "
            f"Fashion-MNIST, {cfg['iters']} iterations; μ = {mu:.2f}, η = {eta:.2f} estimated from the "
            "trained BN-ReLU models; "
            f"ε = 1; perturbed maximizer with S = {cfg['perturbed_samples']} samples; test accuracy %)",
            "",
            "| mixing | batch 8 | batch 32 |",
            "|---|---|---|",
        ]
        for mixing in ("bn_relu", "softmax", "perturbed"):
            cells = [
                mean_std([r["accuracy"] for r in res[f"{mixing}/{b}"]]) if f"{mixing}/{b}" in res else "—"
                for b in (8, 32)
            ]
            lines.append(f"| {mixing} | {cells[0]} | {cells[1]} |")
        lines.append("")

    out["seconds"], out["cpu_seconds"] = time.time() - t0, time.process_time() - c0
    lines.append(
        f"Total time {out['seconds']:.0f} s wall, {out['cpu_seconds']:.0f} s process CPU on {device} "
        f"({args.size}, torch threads {torch.get_num_threads()})."
    )
    out["markdown"] = "\n".join(lines)
    write_json(out, os.path.join(RESULTS, f"template_block{suffix}.json"))
    print(out["markdown"])


if __name__ == "__main__":
    main()
