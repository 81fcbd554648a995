#!/usr/bin/env python
"""Template-matching block benchmark (Gorgun, Gurbuz & Alatan, BMVC 2022: Table 1, Fig. 3, Fig. 4; issue 10 item
3).

Paired, multi-seed classification experiments on two offline data sets, model selection on validation data
only:

1. **Table 1** on Fashion-MNIST (official train file split per class into train / validation; official test
   file) and on glyphs (62 characters rendered from every installed font, ``GlyphDataset(split="all")``, split
   per class into train / validation / test images): a small 4-stage ResNet of torchvision BasicBlocks
   (down-sampling in stages 2 and 3 as the paper's RN) as ``baseline``; ``block`` (+ template-matching block
   between stages 3 and 4, λ = 0.5); ``aux_only`` (the block's patch classifier and auxiliary loss, no mixing;
   the paper's "auxiliary loss only" row); ``wider`` (the baseline with every stage widened by the smallest
   factor k/8 that gives at least the block variant's parameter count: the "does it come from the parameters?"
   control, the paper's RN26+block vs RN38 claim).
2. **Fig. 4** (λ sweep) on Fashion-MNIST: the block with ``aux_weight`` λ in ``--lambdas`` (0.5 is ``block``).
3. **Fig. 3** (soft maximizers) on Fashion-MNIST with a 3-stage ResNet: BN-ReLU after every 3×3 conv vs the
   margin-augmented soft-max vs the perturbed maximizer (``--perturbed-samples`` S; the paper uses 600), μ and
   η estimated from the trained BN-ReLU models of the same seeds; batch 8 and 32, the perturbed maximizer at
   batch 8 only (as the paper).

Pairing: within a seed every variant builds the baseline's modules first under ``torch.manual_seed(seed)`` (so
the shared trunk and classifier weights are bit-identical at step 0), then adds its own modules from a
separate seed, and draws its batches from ``torch.Generator().manual_seed(seed)`` (identical batch order).
Training: Adam with a one-cycle learning rate over ``iters`` iterations (not stated in the paper), no
augmentation; the validation accuracy is measured every ``eval_every`` iterations, the checkpoint with the
best validation accuracy is scored on the test images (test data is read once, after training). The baseline's
validation curve is in the results to show whether it has plateaued. Each variant is compared with the baseline of the
same seed: mean paired difference with a 95 % t interval (``benchmarks/bench_stats.py``).

    OMP_NUM_THREADS=1 python benchmarks/template_block.py --size quick   # 200 iterations: a smoke-scale check
    OMP_NUM_THREADS=1 python benchmarks/template_block.py --size medium  # 500 iterations, λ 0 and 0.25 (README)
    python benchmarks/template_block.py --size full --device cuda          # full data, wider nets, S = 600

The three experiments (Table 1 + λ sweep on Fashion-MNIST, Table 1 on glyphs, the soft-maximizer ablation) can
run as parallel processes with ``--skip``/``--tag`` and be joined with ``--merge``; ``benchmarks/reproduce.py``
does so for ``--size medium``. At 200 iterations the baseline has not converged on Fashion-MNIST (the printed
validation curve shows it), so quick results are indicative only.

Writes ``benchmarks/results/template_block.json`` and ``.md`` (the README's ``results:template_block`` block).
"""

import argparse
import copy
import logging
import os
import sys
import time

os.environ.setdefault("TQDM_DISABLE", "1")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import numpy as np  # noqa: E402
import torch  # noqa: E402
from bench_stats import compare, fmt_diff, fmt_ms, summarize_variants, verdict  # noqa: E402
from pytorch_metric_learning import trainers as pml_trainers  # noqa: E402
from torchvision.models.resnet import BasicBlock  # noqa: E402

from pml_extensions.trainers.template_matching_trainer import TemplateMatchingTrainer  # noqa: E402
from pml_extensions.trunks.soft_maximizer_swap import (  # noqa: E402
    estimate_eta,  # noqa: E402
    estimate_mu,
    soft_maximizer_swap,
)
from pml_extensions.trunks.template_matching_inserter import (  # noqa: E402
    insert_template_matching,
    template_matching_blocks,
)
from pml_extensions.utils.atomic_io import atomic_savefig, atomic_write_json, atomic_write_text  # noqa: E402

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
VARIANTS = ("baseline", "block", "aux_only", "wider")
BLOCK_SEED_OFFSET = 100_003  # the block's own modules draw from seed + this (never the shared modules' stream)

SIZES = {
    "quick": dict(
        fashion_train_per_class=300,
        fashion_val_per_class=100,
        fashion_test_per_class=100,
        glyph_source="all",
        glyph_split=(0.6, 0.2, 0.2),
        widths=(8, 16, 32, 32),
        blocks=1,
        ablation_widths=(8, 16, 32),
        iters=200,
        ablation_iters=100,
        eval_every=50,
        ablation_eval_every=50,
        batch=32,
        lr=5e-3,
        seeds=(0, 1, 2),
        lambdas=(0.0,),
        perturbed_samples=8,
        ablation_batches=(8,),
    ),
    "medium": dict(
        fashion_train_per_class=300,
        fashion_val_per_class=100,
        fashion_test_per_class=100,
        glyph_source="all",
        glyph_split=(0.6, 0.2, 0.2),
        widths=(8, 16, 32, 32),
        blocks=1,
        ablation_widths=(8, 16, 32),
        iters=500,
        ablation_iters=300,
        eval_every=50,
        ablation_eval_every=100,
        batch=32,
        lr=5e-3,
        seeds=(0, 1, 2),
        lambdas=(0.0, 0.25),
        perturbed_samples=8,
        ablation_batches=(8,),
    ),
    "full": dict(
        fashion_train_per_class=5400,
        fashion_val_per_class=600,
        fashion_test_per_class=None,
        glyph_source="all",
        glyph_split=(0.6, 0.2, 0.2),
        widths=(32, 64, 128, 128),
        blocks=2,
        ablation_widths=(16, 32, 64),
        iters=8000,
        ablation_iters=6000,
        eval_every=250,
        ablation_eval_every=500,
        batch=64,
        lr=2e-3,
        seeds=(0, 1, 2, 3, 4),
        lambdas=(0.0, 0.1, 0.25, 0.75, 0.9),
        perturbed_samples=600,
        ablation_batches=(8, 32),
    ),
}


def log(msg):
    print(msg, file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------------------------
# data: preloaded float tensors; the splits use their own fixed RandomState (the same for every seed and
# variant)
def load_fashion(cfg):
    """Fashion-MNIST: train / validation from the official train file (disjoint images, per class), test from
    the official test file. Returns three (x [N, 1, 28, 28] float32 normalised, y [N] int64) pairs."""
    from pml_extensions.datasets import FashionMNIST

    def arrays(ds):
        x = torch.from_numpy(ds.images.astype(np.float32) / 255.0)[:, None]
        return (x - 0.286) / 0.353, torch.from_numpy(ds.labels.astype(np.int64))

    x, y = arrays(FashionMNIST("train", class_disjoint=False))
    rng = np.random.RandomState(1234)
    tr, va = [], []
    for c in range(10):
        idx = rng.permutation(np.flatnonzero(y.numpy() == c))
        n_tr, n_va = cfg["fashion_train_per_class"], cfg["fashion_val_per_class"]
        if n_tr + n_va > len(idx):
            raise ValueError(f"fashion_train_per_class + fashion_val_per_class must be <= {len(idx)}")
        tr.append(idx[:n_tr])
        va.append(idx[n_tr : n_tr + n_va])
    tr, va = np.concatenate(tr), np.concatenate(va)
    test = FashionMNIST("test", class_disjoint=False, max_per_class=cfg["fashion_test_per_class"], seed=0)
    return (x[tr], y[tr]), (x[va], y[va]), arrays(test)


def load_glyphs(cfg):
    """Glyphs of every character from every installed font (32 px), split per class into train / validation /
    test images with a fixed RandomState."""
    from pml_extensions.datasets import GlyphDataset

    ds = GlyphDataset(split="all", image_size=32, source=cfg["glyph_source"])
    x = torch.from_numpy(np.stack([np.asarray(im, dtype=np.float32) / 255.0 for im in ds.images]))[:, None]
    x = (x - 0.85) / 0.3
    y = np.asarray(ds.labels, dtype=np.int64)
    classes = np.unique(y)
    y = np.searchsorted(classes, y)
    rng = np.random.RandomState(4321)
    parts = ([], [], [])
    f_tr, f_va, _ = cfg["glyph_split"]
    for c in range(len(classes)):
        idx = rng.permutation(np.flatnonzero(y == c))
        a, b = int(round(f_tr * len(idx))), int(round((f_tr + f_va) * len(idx)))
        for p, sl in zip(parts, (idx[:a], idx[a:b], idx[b:])):
            p.append(sl)
    yt = torch.from_numpy(y)
    return tuple((x[np.concatenate(p)], yt[np.concatenate(p)]) for p in parts)


# ------------------------------------------------------------------------------------------------------------
class SmallResNet(torch.nn.Module):
    """ResNet of torchvision BasicBlocks for small images: 3×3 stem (stride 1), stages ``layer1..layerS``
    where
    stages 2 and 3 halve the resolution (paper's RN: reduction in stages 2-3), global average pooling ->
    ``[B, widths[-1]]``."""

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
                    down = torch.nn.Sequential(torch.nn.Conv2d(c, w, 1, stride=st, bias=False), torch.nn.BatchNorm2d(w))
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


def count_params(models):
    return sum(p.numel() for m in models.values() for p in m.parameters())


def _base_models(widths, blocks, num_classes, seed):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        trunk = SmallResNet(1, widths, blocks)
        classifier = torch.nn.Linear(trunk.out_channels, num_classes)
    return {"trunk": trunk, "classifier": classifier}


def wider_widths(widths, blocks, num_classes, target_params):
    """Smallest widening ``round(w·k/8)`` (k = 9, 10, ...) of every stage whose baseline has at least
    ``target_params`` parameters (trunk + classifier)."""
    for k in range(9, 65):
        w = tuple(int(round(v * k / 8)) for v in widths)
        if count_params(_base_models(w, blocks, num_classes, 0)) >= target_params:
            return w
    raise ValueError(f"no widening up to 8x reaches {target_params} parameters")


def build_models(variant, seed, widths, blocks, num_classes):
    """Models of one variant for one seed (see the module docstring on pairing).

    ``variant``: ``"baseline"``, ``"block"``, ``"aux_only"`` or ``"wider"``. The first three share the
    baseline's
    trunk and classifier weights bit for bit; the block's own modules are drawn from ``seed +
    BLOCK_SEED_OFFSET``.

    Raises:
        ValueError: unknown variant.
    """
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    if variant == "wider":
        block_params = count_params(build_models("block", seed, widths, blocks, num_classes))
        return _base_models(wider_widths(widths, blocks, num_classes, block_params), blocks, num_classes, seed)
    models = _base_models(widths, blocks, num_classes, seed)
    if variant in ("block", "aux_only"):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed + BLOCK_SEED_OFFSET)
            kwargs = {"mixing": "none"} if variant == "aux_only" else {}
            insert_template_matching(models["trunk"], num_classes, inplace=True, **kwargs)
    return models


def make_sampler(dataset, seed, eval_every, batch):
    """Uniform sampling with replacement from a generator seeded by ``seed`` alone: every variant of a seed
    sees
    the same batches (``eval_every·batch`` indices per PML "epoch")."""
    return torch.utils.data.RandomSampler(
        dataset,
        replacement=True,
        num_samples=eval_every * batch,
        generator=torch.Generator().manual_seed(seed),
    )


@torch.no_grad()
def accuracy(models, x, y, device, bs=1000):
    for m in models.values():
        m.eval()
    correct = 0
    for i in range(0, len(x), bs):
        logits = models["classifier"](models["trunk"](x[i : i + bs].to(device)))
        correct += int((logits.argmax(1).cpu() == y[i : i + bs]).sum())
    return 100.0 * correct / len(x)


def train_eval(models, data, seed, cfg, device, iters, batch, aux_weight=0.5, eval_every=None):
    """Train with PML's TrainWithClassifier (TemplateMatchingTrainer when a block is present), validation
    accuracy
    every ``eval_every`` iterations, test accuracy of the best-validation checkpoint.

    Returns: dict(test_accuracy, val_accuracy (best), best_iteration, val_curve [(iteration, accuracy)],
    params,
    seconds) and the trained models (best checkpoint loaded)."""
    (xtr, ytr), (xva, yva), (xte, yte) = data
    t0 = time.time()
    dataset = torch.utils.data.TensorDataset(xtr, ytr)
    ev = eval_every or cfg["eval_every"]
    if iters % ev:
        raise ValueError(f"iters ({iters}) must be a multiple of eval_every ({ev})")
    models = {k: v.to(device) for k, v in models.items()}
    params = count_params(models)
    optimizers = {f"{k}_optimizer": torch.optim.Adam(v.parameters(), lr=cfg["lr"]) for k, v in models.items()}
    schedulers = {
        k.replace("_optimizer", "_scheduler_by_iteration"): torch.optim.lr_scheduler.OneCycleLR(
            o, max_lr=cfg["lr"], total_steps=iters
        )
        for k, o in optimizers.items()
    }
    curve, best = [], {"acc": -1.0, "state": None, "iteration": 0}

    def end_of_epoch_hook(trainer):
        acc = accuracy(trainer.models, xva, yva, device)
        it = trainer.epoch * ev
        curve.append((it, acc))
        if acc > best["acc"]:
            best.update(
                acc=acc,
                iteration=it,
                state={k: copy.deepcopy(m.state_dict()) for k, m in trainer.models.items()},
            )
        for m in trainer.models.values():
            m.train()
        return True

    kwargs = dict(
        models=models,
        optimizers=optimizers,
        batch_size=batch,
        loss_funcs={"classifier_loss": torch.nn.CrossEntropyLoss()},
        dataset=dataset,
        sampler=make_sampler(dataset, seed, ev, batch),
        iterations_per_epoch=ev,
        data_device=device,
        dataloader_num_workers=0,
        lr_schedulers=schedulers,
        end_of_epoch_hook=end_of_epoch_hook,
    )
    if template_matching_blocks(models["trunk"]):
        trainer = TemplateMatchingTrainer(aux_weight=aux_weight, **kwargs)
    else:
        trainer = pml_trainers.TrainWithClassifier(**kwargs)
    trainer.train(num_epochs=iters // ev)
    for k, m in models.items():
        m.load_state_dict(best["state"][k])
    return {
        "test_accuracy": accuracy(models, xte, yte, device),
        "val_accuracy": best["acc"],
        "best_iteration": best["iteration"],
        "val_curve": curve,
        "params": params,
        "seconds": time.time() - t0,
    }, models


def run_ablation(mixing, batch, seed, cfg, data, device, mu=None, eta=None):
    """3-stage ResNet with BN-ReLU (``"bn_relu"``) or the soft maximizers swapped in (paired: the convs are
    the
    BN-ReLU model's weights of the same seed)."""
    models = _base_models(cfg["ablation_widths"], 1, 10, seed)
    if mixing != "bn_relu":
        soft_maximizer_swap(
            models["trunk"],
            mixing,
            mu=mu,
            eta=eta,
            epsilon=1.0,
            num_samples=cfg["perturbed_samples"],
            seed=seed + BLOCK_SEED_OFFSET,
            inplace=True,
        )
    return train_eval(
        models, data, seed, cfg, device, cfg["ablation_iters"], batch, eval_every=cfg["ablation_eval_every"]
    )


# ------------------------------------------------------------------------------------------------------------
@torch.no_grad()
def visual_words(models, xte, device, k, path, seed=0, max_images=1000):
    """k-means (faiss) of the block's soft-maxed per-pixel class scores; one patch per the 16 largest
    clusters."""
    import faiss
    import matplotlib.pyplot as plt

    trunk = models["trunk"].eval()
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


# ------------------------------------------------------------------------------------------------------------
def _metrics(r, keys=("test_accuracy", "val_accuracy", "best_iteration")):
    return {k: r[k] for k in keys}


def table1(name, runs, data, cfg):
    """Summaries, comparisons and markdown for one data set's Table-1 block."""
    variants = summarize_variants({v: {s: _metrics(r) for s, r in runs[v].items()} for v in runs})
    comps = compare(variants, [v for v in runs if v != "baseline"], "baseline", "test_accuracy")
    params = {v: next(iter(runs[v].values()))["params"] for v in runs}
    curves = {v: np.mean([np.array(r["val_curve"])[:, 1] for r in runs[v].values()], axis=0) for v in runs}
    its = [int(i) for i, _ in next(iter(runs["baseline"].values()))["val_curve"]]
    return {
        "variants": variants,
        "comparisons": comps,
        "params": params,
        "mean_val_curve": {v: c.tolist() for v, c in curves.items()},
        "curve_iterations": its,
        "n_train": len(data[0][1]),
        "n_val": len(data[1][1]),
        "n_test": len(data[2][1]),
    }


LABELS = {
    "baseline": "ResNet baseline",
    "block": "+ template-matching block (λ = 0.5)",
    "aux_only": "+ auxiliary patch loss only",
    "wider": "wider baseline (≥ block's parameters)",
}


def claims(out):
    """Markdown lines: each paper claim beside our paired difference and a verdict read from its 95 % CI."""
    rows = []
    for ds, title in (("fashion", "Fashion-MNIST"), ("glyphs", "glyphs")):
        if ds not in out:
            continue
        v = out[ds]["variants"]
        for var, base, claim, kind in (
            ("block", "baseline", "block improves the baseline (Table 1)", "greater"),
            (
                "block",
                "wider",
                "the gain is not from parameters: block beats a baseline with ≥ its parameters "
                "(Table 1, RN26+block vs RN38)",
                "greater",
            ),
            ("block", "aux_only", "block beats the auxiliary loss alone (Table 1)", "greater"),
        ):
            (c,) = compare(v, [var], base, "test_accuracy")
            rows.append(f"| {claim} | {title} | {var} − {base}: {fmt_diff(c)} | {verdict(c, kind)} |")
    if "lambda_sweep" in out:
        v = out["lambda_sweep"]["variants"]
        for lam in sorted((k for k in v if k != "λ=0.5"), key=lambda k: float(k.split("=")[1])):
            (c,) = compare(v, ["λ=0.5"], lam, "test_accuracy")
            rows.append(
                "| λ = 0.5 is best; smaller λ degrades (Fig. 4) | Fashion-MNIST | λ 0.5 − "
                f"{lam.split('=')[1]}: "
                f"{fmt_diff(c)} | {verdict(c, 'greater')} |"
            )
    if "ablation" in out:
        for c in out["ablation"]["comparisons"]:
            rows.append(
                f"| soft maximizers perform on par with BN-ReLU (Fig. 3) | Fashion-MNIST | {c['variant']} − "
                f"{c['baseline']}: {fmt_diff(c)} | {verdict(c, 'on_par')} |"
            )
    if not rows:
        return []
    return (
        [
            "**Paper claims at our scale** (paired difference of test accuracy, points [95 % CI]):",
            "",
            "| paper claim | data | ours | verdict |",
            "|---|---|---|---|",
        ]
        + rows
        + [""]
    )


def markdown(out, cfg):
    L = []
    seeds = cfg["seeds"]
    for ds in ("fashion", "glyphs"):
        if ds not in out:
            continue
        t = out[ds]
        title = "Fashion-MNIST" if ds == "fashion" else f"Glyphs ({t['num_classes']} characters, every installed font)"
        L += [
            f"**{title}**: {t['n_train']} train / {t['n_val']} validation / {t['n_test']} test images; "
            f"4-stage ResNet widths {list(cfg['widths'])} × {cfg['blocks']} BasicBlock(s) per stage, "
            f"{cfg['iters']} "
            f"iterations × batch {cfg['batch']}, checkpoint chosen on validation; test accuracy %, seeds "
            f"{list(seeds)}.",
            "",
            "| variant | params | test accuracy (mean ± std) | paired diff. vs baseline [95 % CI] | wins | "
            "best-val iteration |",
            "|---|---|---|---|---|---|",
        ]
        comps = {c["variant"]: c for c in t["comparisons"]}
        for v, s in t["variants"].items():
            c = comps.get(v)
            L.append(
                f"| {LABELS.get(v, v)} | {t['params'][v]:,} | {fmt_ms(s, 'test_accuracy')} | "
                f"{fmt_diff(c) if c else '—'} | {str(c['wins']) + '/' + str(c['n']) if c else '—'} | "
                f"{s['mean']['best_iteration']:.0f} |"
            )
        cur = t["mean_val_curve"]["baseline"]
        its = t["curve_iterations"]
        q = len(cur) * 3 // 4
        L += [
            "",
            f"Baseline validation accuracy (mean over seeds) at iterations {its[0]}…{its[-1]}: "
            + ", ".join(f"{a:.1f}" for a in cur)
            + f"; gain over the last quarter ({its[q - 1]} → {its[-1]}): {cur[-1] - cur[q - 1]:+.2f} points.",
            "",
        ]
    if "lambda_sweep" in out:
        t = out["lambda_sweep"]
        L += [
            "**λ sweep (paper Fig. 4)**, Fashion-MNIST, block variant with aux_weight λ (0.5 = the row "
            "above); "
            "paired differences vs the baseline.",
            "",
            "| λ | test accuracy | paired diff. vs baseline [95 % CI] |",
            "|---|---|---|",
        ]
        comps = {c["variant"]: c for c in t["comparisons"]}
        for v in sorted(t["variants"], key=lambda n: float(n.split("=")[1])):
            L.append(f"| {v.split('=')[1]} | {fmt_ms(t['variants'][v], 'test_accuracy')} | {fmt_diff(comps[v])} |")
        L.append("")
    if "ablation" in out:
        t = out["ablation"]
        L += [
            f"**Soft maximizers instead of BN-ReLU (paper Fig. 3)**, Fashion-MNIST, 3-stage ResNet widths "
            f"{list(cfg['ablation_widths'])}, {cfg['ablation_iters']} iterations; μ = {t['mu']:.2f}, "
            f"η = {t['eta']:.2f} estimated from the trained BN-ReLU models; ε = 1; perturbed maximizer with "
            f"S = {cfg['perturbed_samples']} samples (paper: 600); test accuracy %, paired diff. vs "
            "BN-ReLU at the "
            "same batch size [95 % CI].",
            "",
            "| mixing | " + " | ".join(f"batch {b}" for b in cfg["ablation_batches"]) + " |",
            "|---|" + "---|" * len(cfg["ablation_batches"]),
        ]
        comps = {c["variant"]: c for c in t["comparisons"]}
        for mixing in ("bn_relu", "softmax", "perturbed"):
            cells = []
            for b in cfg["ablation_batches"]:
                name = f"{mixing}/{b}"
                if name not in t["variants"]:
                    cells.append("—")
                    continue
                cell = fmt_ms(t["variants"][name], "test_accuracy")
                if name in comps:
                    cell += f" ({fmt_diff(comps[name])})"
                cells.append(cell)
            L.append(f"| {mixing} | " + " | ".join(cells) + " |")
        L.append("")
    L += claims(out)
    parts = ""
    if "part_seconds" in out:
        parts = (
            f"; {len(out['part_seconds'])} parts run in parallel, "
            + ", ".join(f"{t / 60:.1f}" for t in out["part_seconds"])
            + " min each"
        )
    L.append(
        f"Size `{out['size']}` on {out['device']}, {out['seconds'] / 60:.1f} min wall "
        f"(torch threads {out['torch_threads']}{parts})."
    )
    return "\n".join(L) + "\n"


def merge_parts(paths, out_dir, tag=""):
    """Combine part results (same size and config, disjoint parts) into one results file and its table.

    Raises:
        ValueError: parts with different size/config, or two parts holding the same experiment.
    """
    import json

    parts = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            parts.append(json.load(f))
    out = {k: parts[0][k] for k in ("size", "config", "device", "torch_threads")}
    for path, part in zip(paths, parts):
        if (part["size"], part["config"]) != (out["size"], out["config"]):
            raise ValueError(f"--merge: {path} has another size/config than {paths[0]}")
        for key in ("fashion", "glyphs", "lambda_sweep", "ablation", "visual_words_png"):
            if key in part:
                if key in out:
                    raise ValueError(f"--merge: two parts hold {key!r}")
                out[key] = part[key]
    out["part_seconds"] = [p["seconds"] for p in parts]
    out["seconds"] = max(out["part_seconds"])
    md = markdown(out, out["config"])
    out["markdown"] = md
    suffix = f"_{tag}" if tag else ""
    atomic_write_json(os.path.join(out_dir, f"template_block{suffix}.json"), out)
    atomic_write_text(os.path.join(out_dir, f"template_block{suffix}.md"), md)
    print(md)
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="quick")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="override the size's seeds")
    parser.add_argument("--skip", nargs="*", default=(), choices=("fashion", "glyphs", "lambda", "ablation"))
    parser.add_argument("--perturbed-samples", type=int, default=None, help="S of the perturbed maximizer")
    parser.add_argument("--lambdas", type=float, nargs="*", default=None, help="aux_weight values of the sweep")
    parser.add_argument("--visual-words", action="store_true", help="also save the k-means visual-words PNG")
    parser.add_argument("--iters", type=int, default=None, help="override the training iterations (all parts)")
    parser.add_argument("--eval-every", type=int, default=None, help="override the validation interval")
    parser.add_argument("--tag", default="", help="suffix of the result file names")
    parser.add_argument("--out", default=RESULTS)
    parser.add_argument("--from-json", default=None, help="re-render the .md from an existing results JSON")
    parser.add_argument(
        "--merge",
        nargs="+",
        default=None,
        help="combine the JSONs of parts run in parallel (--skip/--tag) into --out/template_block[_TAG].json",
    )
    args = parser.parse_args(argv)
    if args.merge:
        return merge_parts(args.merge, args.out, args.tag)
    if args.from_json:
        import json

        with open(args.from_json, encoding="utf-8") as f:
            out = json.load(f)
        md = markdown(out, out["config"])
        out["markdown"] = md
        atomic_write_json(args.from_json, out)
        atomic_write_text(os.path.splitext(args.from_json)[0] + ".md", md)
        print(md)
        return out
    cfg = dict(SIZES[args.size])
    if args.seeds:
        cfg["seeds"] = tuple(args.seeds)
    if args.perturbed_samples is not None:
        if args.perturbed_samples < 1:
            raise ValueError(f"--perturbed-samples must be >= 1, got {args.perturbed_samples}")
        cfg["perturbed_samples"] = args.perturbed_samples
    if args.lambdas is not None:
        bad = [v for v in args.lambdas if not 0 <= v <= 1]
        if bad:
            raise ValueError(f"--lambdas must lie in [0, 1], got {bad}")
        cfg["lambdas"] = tuple(args.lambdas)
    if args.eval_every is not None:
        cfg["eval_every"] = args.eval_every
    if args.iters is not None:
        cfg["iters"] = cfg["ablation_iters"] = args.iters
        cfg["ablation_eval_every"] = cfg["eval_every"]
    for key, ev in (("iters", "eval_every"), ("ablation_iters", "ablation_eval_every")):
        if cfg[ev] < 1 or cfg[key] % cfg[ev]:
            raise ValueError(f"{key} ({cfg[key]}) must be a positive multiple of {ev} ({cfg[ev]})")
    suffix = f"_{args.tag}" if args.tag else ""
    device = torch.device(args.device)
    logging.getLogger("PML").setLevel(logging.ERROR)
    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()
    out = {
        "size": args.size,
        "config": dict(cfg),
        "device": str(device),
        "torch_threads": torch.get_num_threads(),
    }
    seeds = cfg["seeds"]

    fashion = load_fashion(cfg)
    log(f"fashion: {[len(p[1]) for p in fashion]} train/val/test images")

    def table_runs(name, data, num_classes):
        runs = {}
        for v in VARIANTS:
            for seed in seeds:
                models = build_models(v, seed, cfg["widths"], cfg["blocks"], num_classes)
                r, trained = train_eval(models, data, seed, cfg, device, cfg["iters"], cfg["batch"])
                runs.setdefault(v, {})[seed] = r
                log(
                    f"{name} {v} seed {seed}: test {r['test_accuracy']:.2f} val {r['val_accuracy']:.2f} "
                    f"@{r['best_iteration']} ({r['seconds']:.0f}s, {time.time() - t0:.0f}s total)"
                )
                if args.visual_words and name == "fashion" and v == "block" and seed == seeds[0]:
                    png = os.path.join(args.out, f"template_block_visual_words{suffix}.png")
                    visual_words(trained, data[2][0], device, cfg.get("kmeans_k", 32), png)
                    out["visual_words_png"] = png
        t = table1(name, runs, data, cfg)
        t["num_classes"] = num_classes
        t["per_run"] = {
            v: {str(s): {"val_curve": r["val_curve"], "seconds": r["seconds"]} for s, r in rs.items()}
            for v, rs in runs.items()
        }
        return runs, t

    if "fashion" not in args.skip:
        fashion_runs, out["fashion"] = table_runs("fashion", fashion, 10)
    if "glyphs" not in args.skip:
        glyphs = load_glyphs(cfg)
        log(f"glyphs: {[len(p[1]) for p in glyphs]} train/val/test images")
        _, out["glyphs"] = table_runs("glyphs", glyphs, int(glyphs[0][1].max()) + 1)
    if "lambda" not in args.skip and "fashion" not in args.skip:
        runs = {"baseline": fashion_runs["baseline"], "λ=0.5": fashion_runs["block"]}
        for lam in cfg["lambdas"]:
            for seed in seeds:
                models = build_models("block", seed, cfg["widths"], cfg["blocks"], 10)
                r, _ = train_eval(models, fashion, seed, cfg, device, cfg["iters"], cfg["batch"], aux_weight=lam)
                runs.setdefault(f"λ={lam:g}", {})[seed] = r
                log(f"lambda {lam} seed {seed}: test {r['test_accuracy']:.2f} ({r['seconds']:.0f}s)")
        variants = summarize_variants({v: {s: _metrics(r) for s, r in rs.items()} for v, rs in runs.items()})
        out["lambda_sweep"] = {
            "variants": {k: v for k, v in variants.items() if k != "baseline"},
            "comparisons": compare(variants, [k for k in runs if k != "baseline"], "baseline", "test_accuracy"),
        }
    if "ablation" not in args.skip:
        runs, mus, etas = {}, [], []
        probe = [fashion[0][0][i : i + 250] for i in range(0, 1000, 250)]
        for b in cfg["ablation_batches"]:
            for seed in seeds:
                r, trained = run_ablation("bn_relu", b, seed, cfg, fashion, device)
                trunk = trained["trunk"]
                mus.append(estimate_mu(trunk, [p.to(device) for p in probe]))
                etas.append(estimate_eta(trunk, [p.to(device) for p in probe]))
                runs.setdefault(f"bn_relu/{b}", {})[seed] = r
                log(f"ablation bn_relu bs {b} seed {seed}: {r['test_accuracy']:.2f} ({r['seconds']:.0f}s)")
        mu, eta = float(np.mean(mus)), float(np.mean(etas))
        for mixing in ("softmax", "perturbed"):
            for b in cfg["ablation_batches"] if mixing == "softmax" else cfg["ablation_batches"][:1]:
                for seed in seeds:
                    r, _ = run_ablation(mixing, b, seed, cfg, fashion, device, mu=mu, eta=eta)
                    runs.setdefault(f"{mixing}/{b}", {})[seed] = r
                    log(f"ablation {mixing} bs {b} seed {seed}: {r['test_accuracy']:.2f} ({r['seconds']:.0f}s)")
        variants = summarize_variants({v: {s: _metrics(r) for s, r in rs.items()} for v, rs in runs.items()})
        comps = []
        for name in variants:
            m, b = name.split("/")
            if m != "bn_relu":
                comps += compare(variants, [name], f"bn_relu/{b}", "test_accuracy")
        out["ablation"] = {
            "variants": variants,
            "comparisons": comps,
            "mu": mu,
            "eta": eta,
            "mu_per_model": mus,
            "eta_per_model": etas,
        }
    out["seconds"] = time.time() - t0
    md = markdown(out, cfg)
    out["markdown"] = md
    atomic_write_json(os.path.join(args.out, f"template_block{suffix}.json"), out)
    atomic_write_text(os.path.join(args.out, f"template_block{suffix}.md"), md)
    print(md)
    return out


if __name__ == "__main__":
    main()
