"""Time of one training step with HistogramPooling + XMLWrapper divided by the same step with GAP + the plain loss.

MobileNetV2 (ImageNet weights when the offline package is installed), 96-px RGB input, batch 32 (8 classes × 4),
embedder Linear(1280 → 128), ContrastiveLoss, SGD. The two steps alternate in one process; the ratio of their
medians is reported (target ≤ 1.03). Results: benchmarks/results/xml_overhead.json and .md (the README block).

    python benchmarks/xml_overhead.py [--repeats 30] [--image-size 96] [--batch-size 32] [--prototypes 64 128]
"""

import argparse
import os
import statistics
import sys
import time

import torch

from pml_extensions import losses, trunks
from pml_extensions.utils.atomic_io import atomic_write_json, atomic_write_text


def build(use_xml: bool, num_prototypes: int, device):
    torch.manual_seed(0)
    try:
        body = trunks.mobilenet_v2_features(pretrained=True)
    except FileNotFoundError:
        body = trunks.mobilenet_v2_features(pretrained=False)
    if use_xml:
        pool = trunks.HistogramPooling(1280, num_prototypes)
        trunk = torch.nn.Sequential(body, pool)
        loss = losses.XMLWrapper(losses.ContrastiveLoss(), histogram_layer=pool)
    else:
        trunk = torch.nn.Sequential(body, torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten())
        loss = losses.ContrastiveLoss()
    embedder = torch.nn.Linear(1280, 128)
    trunk.to(device).train()
    embedder.to(device)
    opt = torch.optim.SGD(list(trunk.parameters()) + list(embedder.parameters()), lr=1e-4)
    return trunk, embedder, loss, opt


def step(models, images, labels):
    trunk, embedder, loss, opt = models
    opt.zero_grad(set_to_none=True)
    out = loss(embedder(trunk(images)), labels)
    out.backward()
    opt.step()
    if images.is_cuda:
        torch.cuda.synchronize()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--image-size", type=int, default=96)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--prototypes", type=int, nargs="+", default=[64, 128])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--output", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = p.parse_args(argv)
    device = torch.device(args.device)
    g = torch.Generator().manual_seed(0)
    images = torch.randn(args.batch_size, 3, args.image_size, args.image_size, generator=g, device=g.device).to(device)
    labels = torch.arange(args.batch_size // 4, device=device).repeat_interleave(4)
    rows = []
    for m in args.prototypes:
        variants = {"gap": build(False, m, device), "xml": build(True, m, device)}
        times = {k: [] for k in variants}
        for i in range(args.warmup + args.repeats):
            for name, models in variants.items():
                start = time.perf_counter()
                step(models, images, labels)
                if i >= args.warmup:
                    times[name].append(time.perf_counter() - start)
        med = {k: statistics.median(v) for k, v in times.items()}
        rows.append({"prototypes": m, "gap_s": med["gap"], "xml_s": med["xml"], "ratio": med["xml"] / med["gap"]})
    text = (
        f"`python benchmarks/xml_overhead.py` (device {device}, MobileNetV2 at {args.image_size} px, batch "
        f"{args.batch_size}, median of {args.repeats} steps, the two variants alternating in one process, torch "
        f"threads {torch.get_num_threads()}, 1-min load average {os.getloadavg()[0]:.1f} at the end; "
        "target ≤ 1.03)\n\n"
        "| prototypes m | GAP + Contrastive step (s) | HistogramPooling + XMLWrapper step (s) | ratio |\n"
        "|---|---|---|---|\n"
        + "".join(f"| {r['prototypes']} | {r['gap_s']:.4f} | {r['xml_s']:.4f} | {r['ratio']:.3f} |\n" for r in rows)
    )
    print(text)
    atomic_write_json(
        os.path.join(args.output, "xml_overhead.json"),
        {
            "device": str(device),
            "image_size": args.image_size,
            "batch_size": args.batch_size,
            "repeats": args.repeats,
            "torch_threads": torch.get_num_threads(),
            "rows": rows,
        },
    )
    atomic_write_text(os.path.join(args.output, "xml_overhead.md"), text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
