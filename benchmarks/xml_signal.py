"""Is the XML term informative from the first step? Histogram peakedness, prediction spread and xml_loss over a few
steps of a plain PML loop, for several (ε, prototype init, prototype lr) settings.

Setting (the README's one-liner): ImageNet MobileNetV2 features + ``HistogramPooling(1280, 64)`` + ``Linear(1280,
64)``, ``XMLWrapper(ContrastiveLoss(pos_margin=0, neg_margin=1))``, Adam 1e-4, batch 32 (``MPerClassSampler(m=4)``),
OpenClipArt training classes at 128 px (4 × 4 final map). Every setting starts from the same backbone and embedder
weights and sees the same batches (seeded). Per setting, averaged over the steps:

- ``max_bin``: mean over images of the largest histogram bin (uniform: 1/m = 0.0156; one-hot: 1);
- ``pred_cos``: mean pairwise cosine between the cross-batch predictions Ŷ of one half (1: all the same direction,
  the contrastive loss of the predictions is then a constant);
- ``gram_ratio``: mean diagonal of Z Zᵀ divided by the ridge 0.05 (≪ 1: the ridge dominates the fit and every
  prediction collapses towards the other half's mean embedding);
- ``xml_first`` / ``xml_last``: xml_loss at the first and last step, and its std over the steps.

    python benchmarks/xml_signal.py [--steps 20] [--size quick|full] [--device cpu]

Writes ``benchmarks/results/xml_signal.json`` and ``.md``.
"""

import argparse
import json
import os
import time

import numpy as np
import torch

from pml_extensions import losses, trunks
from pml_extensions.datasets import IMAGENET_MEAN, IMAGENET_STD, get_dataset
from pml_extensions.utils.atomic_io import atomic_write_json, atomic_write_text

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SETTINGS = [
    # name, scale, init, prototype lr
    ("eps10_random (old default)", 10.0, "random", None),
    ("eps10_kmeans", 10.0, "kmeans", None),
    ("eps30_kmeans", 30.0, "kmeans", None),
    ("eps100_kmeans", 100.0, "kmeans", None),
    ("eps30_kmeans_plr1e-2", 30.0, "kmeans", 1e-2),
    # the README's two lines: trunks.use_histogram_pooling's default, k-means of the first 4 training batches' local
    # features (train-mode BatchNorm) inside the loop instead of init_from_data beforehand; steps 1-3 use the
    # seeded random prototypes
    ("eps100_lazy_kmeans (two lines)", 100.0, "lazy_kmeans", None),
]


def pairwise_cos(x):
    x = torch.nn.functional.normalize(x, dim=1)
    c = x @ x.T
    n = len(x)
    return float((c.sum() - c.diagonal().sum()) / (n * (n - 1)))


def run_setting(name, scale, init, proto_lr, data, backbone_state, embedder_state, args):
    from pytorch_metric_learning.samplers import MPerClassSampler
    from pytorch_metric_learning.utils import common_functions as c_f

    torch.manual_seed(0)
    body = trunks.MobileNetV2Features(pretrained=True)
    body.load_state_dict(backbone_state)
    lazy = init == "lazy_kmeans"
    pool = trunks.HistogramPooling(1280, 64, scale=scale, seed=0, lazy_init="kmeans" if lazy else None)
    embedder = torch.nn.Linear(1280, 64)
    embedder.load_state_dict(embedder_state)
    body, pool, embedder = body.to(args.device), pool.to(args.device), embedder.to(args.device)
    if init not in ("random", "lazy_kmeans"):
        loader = torch.utils.data.DataLoader(
            data, batch_size=32, shuffle=True, generator=torch.Generator().manual_seed(0)
        )
        pool.init_from_data(body, loader, num_batches=4, method=init, seed=0)
    trunk = torch.nn.Sequential(body, pool)
    loss_func = losses.XMLWrapper(losses.ContrastiveLoss(pos_margin=0.0, neg_margin=1.0), histogram_layer=pool)
    groups = [{"params": list(body.parameters()) + list(embedder.parameters())}]
    groups.append({"params": [pool.prototype_conv.weight], **({"lr": proto_lr} if proto_lr else {})})
    opt = torch.optim.Adam(groups, lr=1e-4)
    c_f.NUMPY_RANDOM = np.random.RandomState(0)
    torch.manual_seed(1)
    sampler = MPerClassSampler(data.labels, m=4, batch_size=32, length_before_new_iter=32 * args.steps)
    loader = torch.utils.data.DataLoader(data, batch_size=32, sampler=sampler, drop_last=True)
    rows = []
    trunk.train()
    embedder.train()
    for images, labels in loader:
        emb = embedder(trunk(images.to(args.device)))
        z = pool.last_histograms
        loss = loss_func(emb, labels.to(args.device))
        with torch.no_grad():
            halves = __import__("pml_extensions.utils.class_split", fromlist=["x"]).class_disjoint_split(
                labels, torch.Generator().manual_seed(len(rows))
            )
            pred1, _ = loss_func.cross_predictions(emb.detach(), z.detach(), halves)
            rows.append(
                {
                    "max_bin": float(z.max(dim=1).values.mean()),
                    "pred_cos": pairwise_cos(pred1),
                    "emb_cos": pairwise_cos(emb.detach()),
                    "gram_ratio": float((z * z).sum(1).mean() / 0.05),
                    "xml_loss": float(loss_func.xml_loss),
                }
            )
        opt.zero_grad()
        loss.backward()
        opt.step()
    xml = [r["xml_loss"] for r in rows]
    return {
        "setting": name,
        "scale": scale,
        "init": init,
        "prototype_lr": proto_lr,
        **{k: float(np.mean([r[k] for r in rows])) for k in ("max_bin", "pred_cos", "emb_cos", "gram_ratio")},
        "xml_first": xml[0],
        "xml_last": xml[-1],
        "xml_std": float(np.std(xml)),
        "xml_curve": xml,
    }


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", choices=("quick", "full"), default="quick")
    p.add_argument("--steps", type=int)
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    args = p.parse_args(argv)
    args.steps = args.steps or (20 if args.size == "quick" else 100)
    from torchvision import transforms as T

    tf = T.Compose([T.Resize((128, 128)), T.ToTensor(), T.Normalize(IMAGENET_MEAN, IMAGENET_STD)])
    data = get_dataset("openclipart", "train", tf)
    torch.manual_seed(0)
    backbone_state = trunks.MobileNetV2Features(pretrained=True).state_dict()
    embedder_state = torch.nn.Linear(1280, 64).state_dict()
    start = time.time()
    results = []
    for setting in SETTINGS:
        r = run_setting(*setting, data, backbone_state, embedder_state, args)
        print(json.dumps({k: v for k, v in r.items() if k != "xml_curve"}))
        results.append(r)
    lines = [
        f"MobileNetV2 (ImageNet) + HistogramPooling(1280, 64) + Linear(1280, 64), XMLWrapper(ContrastiveLoss), Adam "
        f"1e-4, batch 32, OpenClipArt 128 px, {args.steps} steps, same weights and batches for every row "
        f"(`python benchmarks/xml_signal.py --size {args.size}`). Uniform histogram: max bin 1/64 = 0.0156.",
        "",
        "| setting | ε | init | prototype lr | mean max bin | pred. cosine | ‖z‖²/ridge "
        "| xml_loss first → last (std) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['setting']} | {r['scale']:g} | {r['init']} | {r['prototype_lr'] or '1e-4'} | {r['max_bin']:.3f} | "
            f"{r['pred_cos']:.4f} | {r['gram_ratio']:.2f} | {r['xml_first']:.3f} → {r['xml_last']:.3f} "
            f"({r['xml_std']:.3f}) |"
        )
    os.makedirs(args.out, exist_ok=True)
    atomic_write_json(
        os.path.join(args.out, "xml_signal.json"),
        {"steps": args.steps, "seconds": time.time() - start, "settings": results},
        indent=2,
    )
    atomic_write_text(os.path.join(args.out, "xml_signal.md"), "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
