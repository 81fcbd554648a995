"""Peak memory of one RAML distillation step: teacher under no_grad (ours) vs. teacher inside autograd (paper code).

One step = student forward at the query size + teacher forward at the database size + ResolutionDistillationLoss +
backward + AdamW step, on B images × P augmentations (MobileNetV2 features + GeM/whitening head, 512-D).

- ``no_grad``: :class:`ResolutionDistillationTrainer` as is (frozen teacher, ``torch.no_grad``, eval mode).
- ``autograd``: the same step with the teacher's parameters trainable and its forward inside autograd, as in
  ``pavelsuma/raml`` ``train.py`` (the graph through the teacher is built and back-propagated; its ``.grad`` fills).

CPU: each variant runs in a fresh subprocess (``MALLOC_MMAP_THRESHOLD_=65536`` so freed tensors go back to the OS)
and the step's peak is ``ru_maxrss`` after the step minus the resident size just before it (models, optimiser and
batch already allocated). CUDA (``--device cuda``): ``torch.cuda.max_memory_allocated`` minus the allocation before
the step. Target: ratio no_grad / autograd <= 0.6.

    python benchmarks/distill_memory.py            # --quick: 2 images × 8 augmentations, 112 -> 224 px
    python benchmarks/distill_memory.py --images 8 --device cuda
"""

import argparse
import json
import os
import resource
import subprocess
import sys

from pml_extensions.utils.atomic_io import atomic_write_json, atomic_write_text

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def run_step(variant, images, augs, query_size, database_size, device):
    import torch

    from pml_extensions.losses.resolution_distillation_loss import ResolutionDistillationLoss
    from pml_extensions.trainers.resolution_distillation_trainer import ResolutionDistillationTrainer
    from pml_extensions.trunks.pretrained import mobilenet_v2_features
    from pml_extensions.trunks.retrieval_head import RetrievalHead

    torch.manual_seed(0)
    device = torch.device(device)
    models = {
        "trunk": mobilenet_v2_features(pretrained=False).to(device),
        "embedder": RetrievalHead(1280, 512).to(device),
        "teacher_trunk": mobilenet_v2_features(pretrained=False).to(device),
        "teacher_embedder": RetrievalHead(1280, 512).to(device),
    }

    class PaperCodeTrainer(ResolutionDistillationTrainer):
        """Teacher inside autograd with trainable parameters, as the paper's code."""

        def set_to_train(self):
            super().set_to_train()
            for m in self.teacher_modules():
                m.requires_grad_(True)

        def compute_teacher_embeddings(self, data):
            t_trunk, t_embedder = self.teacher_modules()
            return t_embedder(t_trunk(data.to(self.data_device)))

    cls = ResolutionDistillationTrainer if variant == "no_grad" else PaperCodeTrainer
    trainer = cls(
        models,
        None,
        images,
        # the paper-code arm keeps the graph into the teacher rows (the loss detaches them by default)
        {"distillation_loss": ResolutionDistillationLoss(detach_ref_emb=variant == "no_grad")},
        dataset=None,
        data_device=device,
        dataloader_num_workers=0,
    )
    trainer.set_to_train()
    n = images * augs
    g = torch.Generator().manual_seed(0)
    batch = (
        (
            torch.rand(n, 3, query_size, query_size, generator=g, device=g.device).to(device),
            torch.rand(n, 3, database_size, database_size, generator=g, device=g.device).to(device),
            torch.zeros(n, dtype=torch.long, device=device),
        ),
        torch.arange(images, device=device).repeat_interleave(augs),
    )
    # the optimiser state (AdamW moments) is allocated lazily at the first step: allocate it before measuring
    for opt in trainer.optimizers.values():
        for group in opt.param_groups:
            for p in group["params"]:
                p.grad = torch.zeros_like(p)
        opt.step()
        opt.zero_grad()

    def step():
        trainer.zero_grad()
        trainer.losses = {"distillation_loss": 0, "total_loss": 0}
        trainer.calculate_loss(batch)
        trainer.losses["distillation_loss"].backward()
        for opt in trainer.optimizers.values():
            opt.step()

    if device.type == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        step()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base
    base = rss_bytes()
    step()
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base


def measure(variant, args):
    if args.device != "cpu":
        return run_step(variant, args.images, args.augs, args.query_size, args.database_size, args.device)
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--child",
        variant,
        "--images",
        str(args.images),
        "--augs",
        str(args.augs),
        "--query-size",
        str(args.query_size),
        "--database-size",
        str(args.database_size),
    ]
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    return int(json.loads(out.strip().splitlines()[-1])["peak_bytes"])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="default size (2 images × 8 augmentations, 112 -> 224)")
    p.add_argument("--images", type=int, default=2)
    p.add_argument("--augs", type=int, default=8)
    p.add_argument("--query-size", type=int, default=112)
    p.add_argument("--database-size", type=int, default=224)
    p.add_argument("--device", default="cpu")
    p.add_argument("--repeats", type=int, default=1, help="measurements per variant (the median is kept)")
    p.add_argument("--child", choices=["no_grad", "autograd"], help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for name in ("images", "augs", "query_size", "database_size", "repeats"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be positive")
    if args.child:
        peak = run_step(args.child, args.images, args.augs, args.query_size, args.database_size, "cpu")
        print(json.dumps({"peak_bytes": int(peak)}))
        return None
    peaks = {}
    for variant in ("no_grad", "autograd"):
        values = sorted(measure(variant, args) for _ in range(args.repeats))
        peaks[variant] = values[len(values) // 2]
    ratio = peaks["no_grad"] / peaks["autograd"]
    result = {
        "device": args.device,
        "images": args.images,
        "augmentations": args.augs,
        "query_size": args.query_size,
        "database_size": args.database_size,
        "peak_mib_no_grad": peaks["no_grad"] / 2**20,
        "peak_mib_autograd": peaks["autograd"] / 2**20,
        "ratio": ratio,
        "target": 0.6,
        "meets_target": ratio <= 0.6,
    }
    text = (
        f"`python benchmarks/distill_memory.py --repeats {args.repeats}` ({args.images} images × {args.augs} "
        f"augmentations, {args.query_size} → {args.database_size} px, MobileNetV2 + GeM head, peak RSS of one "
        f"training step in a fresh process, median of {args.repeats}; target ratio ≤ 0.6)\n\n"
        "| device | peak, frozen teacher under no_grad (MiB) | peak, teacher inside autograd as the official code "
        "(MiB) | ratio |\n|---|---|---|---|\n"
        f"| {args.device} | {result['peak_mib_no_grad']:.1f} | {result['peak_mib_autograd']:.1f} | {ratio:.3f} |\n"
    )
    print(text)
    atomic_write_json(os.path.join(RESULTS, f"distill_memory_{args.device}.json"), result)
    atomic_write_text(os.path.join(RESULTS, f"distill_memory_{args.device}.md"), text)
    return result


if __name__ == "__main__":
    main()
