"""PILOT timings for the issue 24 plan (items 2-4): seconds per training iteration of each proposed run on cached
inputs, to size the seeds and schedules that fit ``benchmarks/reproduce.py --size quick``. Not a README table.

Each row times one optimizer step (forward, backward, Adam) of the trainable part on a batch of cached features
(random tensors of the cached shape: the cost does not depend on the values), median of ``--repeats`` steps after
``--warmup``, all rows alternating in one process, one torch thread unless ``--threads`` says otherwise:

- item 2, frozen to features.18: GAP + Linear(1280, 64) + ContrastiveLoss, and HistogramPooling(1280, 64) + Linear +
  XMLWrapper, on ``[32, 1280, 4, 4]``;
- item 2, second setting (features.18 trained): the same heads after MobileNetV2's ``features.18`` on
  ``[32, 320, 4, 4]`` (the ``0.17`` cache);
- item 3, template block: MobileNetV2 ``features.14-18`` + GAP + Linear classifier on the ``features.13`` cache
  ``[32, 96, 8, 8]`` (128 px images) and ``[32, 96, 4, 4]`` (64 px), without and with a TemplateMatchingBlock
  before ``features.14`` (its patch classifier's auxiliary loss included);
- item 4, RAML: a student step (MobileNetV2 + GeM + Linear(1280, 512) at the query size, 4 images × 4 coupled
  views, forward + backward) and the teacher's forward at the database size on the same 16 views: what a cached
  teacher saves.

    OMP_NUM_THREADS=1 python benchmarks/cache_plan_timings.py [--repeats 20]
"""

import argparse
import os
import statistics
import sys
import time

import torch
import torchvision
from pytorch_metric_learning import losses

from pml_extensions.losses import XMLWrapper
from pml_extensions.losses.patch_classification_loss import PatchClassificationLoss
from pml_extensions.trunks import (
    GeMPooling,
    HistogramPooling,
    insert_template_matching,
    split_trunk,
    template_matching_blocks,
)
from pml_extensions.utils.atomic_io import atomic_write_json, atomic_write_text

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def gen(seed):
    return torch.Generator().manual_seed(seed)


def metric_step(body, use_xml, shape, batch=32):
    """Closure: one step of ``body`` (or identity) + pooling + Linear(1280, 64) + (XML)Contrastive."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        embedder = torch.nn.Linear(1280, 64)
        pool = HistogramPooling(1280, 64, scale=100.0) if use_xml else torch.nn.AdaptiveAvgPool2d(1)
    inner = losses.ContrastiveLoss(pos_margin=0.0, neg_margin=1.0)
    loss = XMLWrapper(inner, 0.01, 0.05, histogram_layer=pool, target="pooled", head=embedder) if use_xml else inner
    modules = torch.nn.ModuleList([m for m in (body, pool, embedder) if m is not None]).train()
    params = [p for p in modules.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=1e-4)
    x = torch.randn(batch, *shape, generator=gen(1))
    labels = torch.arange(batch // 4).repeat_interleave(4)

    def step():
        opt.zero_grad(set_to_none=True)
        h = x if body is None else body(x)
        loss(embedder(pool(h).flatten(1)), labels).backward()
        opt.step()

    return step


def template_steps(num_classes=22, batch=32, side=8):
    """Closures: one classification step of features.14-18 (+ the template block) on the features.13 cache
    (``side`` × ``side``: 8 at 128 px, 4 at 64 px)."""
    out = {}
    for name, with_block in (("plain last stage", False), ("with template block", True)):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model = torchvision.models.mobilenet_v2(num_classes=num_classes)
            if with_block:
                model = insert_template_matching(model, num_classes, inplace=True, seed=0)
        _, rest = split_trunk(model, "features.13")
        rest.train()
        blocks = template_matching_blocks(model)
        opt = torch.optim.Adam(rest.parameters(), lr=1e-4)
        x = torch.randn(batch, 96, side, side, generator=gen(2))
        labels = torch.arange(batch) % num_classes

        def step(rest=rest, opt=opt, x=x, labels=labels, blocks=blocks):
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.cross_entropy(rest(x), labels)
            for b in blocks:  # the block's auxiliary patch-classification loss (lambda 0.5)
                loss = loss + 0.5 * PatchClassificationLoss()(b.last_class_scores, labels)
            loss.backward()
            opt.step()

        out[name] = (step, sum(p.numel() for p in rest.parameters()))
    return out


def raml_steps(query=24, database=48, views=16):
    """Closures: a student step at ``query`` px and the teacher's forward at ``database`` px."""

    def embedder():
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            return torch.nn.Sequential(
                torchvision.models.mobilenet_v2().features, GeMPooling(), torch.nn.Flatten(), torch.nn.Linear(1280, 512)
            )

    student, teacher = embedder().train(), embedder().eval()
    opt = torch.optim.Adam(student.parameters(), lr=1e-4)
    small = torch.randn(views, 3, query, query, generator=gen(3))
    large = torch.randn(views, 3, database, database, generator=gen(4))
    target = torch.randn(views, 512, generator=gen(5))

    def student_step():
        opt.zero_grad(set_to_none=True)
        (student(small) - target).square().mean().backward()
        opt.step()

    def teacher_forward():
        with torch.no_grad():
            teacher(large)

    return {f"student step at {query} px": student_step, f"teacher forward at {database} px": teacher_forward}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--output", default=os.path.join(ROOT, "benchmarks", "results"))
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    mnv2 = torchvision.models.mobilenet_v2()
    f18 = mnv2.features[18]
    rows = {
        ("2", "GAP head on features.18 cache [1280,4,4]"): metric_step(None, False, (1280, 4, 4)),
        ("2", "XML head on features.18 cache [1280,4,4]"): metric_step(None, True, (1280, 4, 4)),
        ("2", "features.18 + GAP head on 0.17 cache [320,4,4]"): metric_step(f18, False, (320, 4, 4)),
        ("2", "features.18 + XML head on 0.17 cache [320,4,4]"): metric_step(f18, True, (320, 4, 4)),
    }
    for side, px in ((8, 128), (4, 64)):
        for name, (step, _) in template_steps(side=side).items():
            rows[("3", f"features.14-18, {name}, on features.13 cache [96,{side},{side}] ({px} px)")] = step
    for name, step in raml_steps().items():
        rows[("4", f"RAML {name} (16 coupled views)")] = step
    times = {k: [] for k in rows}
    for i in range(args.warmup + args.repeats):
        for k, step in rows.items():
            start = time.perf_counter()
            step()
            if i >= args.warmup:
                times[k].append(time.perf_counter() - start)
    out = [{"item": k[0], "run": k[1], "ms_per_iteration": 1000 * statistics.median(v)} for k, v in times.items()]
    text = (
        f"PILOT `python benchmarks/cache_plan_timings.py` (median of {args.repeats} steps, rows alternating, torch "
        f"threads {args.threads}, 1-min load average {os.getloadavg()[0]:.1f} on a machine shared with other "
        "engineers; planning numbers, not a README claim)\n\n| item | run (batch 32 unless said) | ms / iteration |\n"
        "|---|---|---|\n" + "".join(f"| {r['item']} | {r['run']} | {r['ms_per_iteration']:.1f} |\n" for r in out)
    )
    print(text)
    atomic_write_json(os.path.join(args.output, "cache_plan_timings.json"), {"threads": args.threads, "rows": out})
    atomic_write_text(os.path.join(args.output, "cache_plan_timings.md"), text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
