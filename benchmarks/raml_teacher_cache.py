"""What a cached teacher would save in RAML's student step (issue 24, item 4), measured.

The RAML teacher is frozen, so its embeddings of a fixed bank of coupled views could be computed once and read back.
This times the protocol's own student step — :func:`benchmarks.protocols.resolution_distillation.student.
build_student` (the shipped network: ImageNet MobileNetV2 + GeM + 512-D head, ``ResolutionDistillationTrainer``,
``CoupledAugmentationDataset``) — one PML iteration at a time, alternating two variants in one process:

- ``teacher live``: the trainer as it is (data at both resolutions, student forward + backward at the query
  resolution, teacher forward at the database resolution, optimiser and one-cycle steps);
- ``teacher cached``: the same iteration with ``compute_teacher_embeddings`` replaced by a read of precomputed
  embeddings (a bank lookup costs microseconds), i.e. what a teacher cache would leave.

Also timed alone: the teacher's forward on the batch and the loading of one batch (both resolutions). Settings:
``quick`` is the CPU Table 2 size (glyphs, database 48 px, query 24 px, 4 images × 4 coupled views); ``paper`` the
paper's resolutions (Open Clip Art, database 448 px, query 160 px) with 2 images × 8 views per step (the paper's
step is 25 × 8 = 200 views; per-view costs are reported so the paper's schedule can be scaled from them).

    python benchmarks/raml_teacher_cache.py [--settings quick paper] [--steps 5] [--device cpu]

Writes ``benchmarks/results/raml_teacher_cache.json`` and ``.md``.
"""

import argparse
import os
import statistics
import sys
import time

import torch

from pml_extensions.runner.objects.builder import Builder
from pml_extensions.utils.atomic_io import atomic_write_json, atomic_write_text

try:  # the repository's root is on sys.path (PYTHONPATH, pytest)
    from benchmarks import protocols
except ModuleNotFoundError:  # python benchmarks/raml_teacher_cache.py: benchmarks/ is sys.path[0]
    import protocols

protocols.register()
recipe = protocols.resolution_distillation.recipe
build_student = protocols.resolution_distillation.student.build_student

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: setting -> (dataset, dataset settings, database px, query px, images per step, views per image)
SETTINGS = {
    "quick": ("glyphs", {"image_size": 48, "max_test_per_class": 15, "crop_scale": [0.5, 1.0]}, 48, 24, 4, 4),
    "paper": ("openclipart", {"max_classes": 40, "max_side": 512, "crop_scale": [0.25, 1.0]}, 448, 160, 2, 8),
}
PAPER_STEPS, PAPER_VIEWS = 2000, 200  # the paper's student schedule: 2000 steps of 25 images x 8 views
FITS_HOURS = 0.5  # a student that fits the CPU: the whole quick reproduce.py has one hour on 2 cores


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(setting: str, steps: int, device: torch.device) -> dict:
    name, dcfg, db, q, images, views = SETTINGS[setting]
    builder = Builder({}, device=device, log=lambda *a, **k: None)
    train, _ = recipe.load_dataset(name, dcfg, builder)
    models = builder.build_models(spec=recipe.with_pretrained(recipe.resolution_models(512), True))
    teacher = (models["trunk"].eval(), models["embedder"].eval())
    job = {
        "models": recipe.resolution_models(512),
        "num_augmentations": views,
        "lambda_ts": 0.7,
        "lambda_ss": 0.7,
        "lr": 1e-4,
        "student_iterations": 4 * steps + 8,
        "images_per_batch": images,
        "checkpoint_every": 1,
        "num_workers": 0,
    }
    ctx = {"seed": 0, "dcfg": dcfg, "db": db, "train_set": train, "builder": builder}
    trainers = {v: build_student(ctx, q, "full", job, teacher, device=device) for v in ("live", "cached")}
    batch_views = images * views
    bank = torch.randn(batch_views, 512, generator=torch.Generator().manual_seed(0)).to(device)
    bank = torch.nn.functional.normalize(bank, dim=1)
    trainers["cached"].compute_teacher_embeddings = lambda data: bank  # what a teacher cache leaves: a read

    times = {"live": [], "cached": [], "teacher_forward": [], "data": []}
    epochs = {"live": 0, "cached": 0}
    for step in range(steps + 1):  # the first round warms up (not timed)
        for variant in ("live", "cached"):
            trainer = trainers[variant]
            epochs[variant] += 1
            _sync(device)
            start = time.perf_counter()
            trainer.train(start_epoch=epochs[variant], num_epochs=epochs[variant])  # one iteration
            _sync(device)
            if step:
                times[variant].append(time.perf_counter() - start)
        loader = trainers["live"].dataloader
        start = time.perf_counter()
        (student_images, teacher_images, _), _ = next(iter(loader))
        data_seconds = time.perf_counter() - start
        _sync(device)
        start = time.perf_counter()
        trainers["live"].compute_teacher_embeddings(teacher_images)
        _sync(device)
        if step:
            times["data"].append(data_seconds)
            times["teacher_forward"].append(time.perf_counter() - start)
    med = {k: statistics.median(v) for k, v in times.items()}
    per_view_student = med["cached"] / batch_views
    return {
        "setting": setting,
        "dataset": name,
        "database_px": db,
        "query_px": q,
        "views_per_step": batch_views,
        "steps_timed": steps,
        "seconds": times,
        "median": med,
        "saved_fraction": 1.0 - med["cached"] / med["live"],
        "teacher_share": med["teacher_forward"] / med["live"],
        "paper_schedule_hours": {
            "live": med["live"] / batch_views * PAPER_VIEWS * PAPER_STEPS / 3600,
            "cached": per_view_student * PAPER_VIEWS * PAPER_STEPS / 3600,
        },
    }


def markdown(out: dict) -> str:
    rows = out["rows"]
    lines = [
        f"`python benchmarks/raml_teacher_cache.py` (device {out['device']}, torch threads {out['torch_threads']}, "
        f"median of {rows[0]['steps_timed']} PML iterations per variant, alternating in one process, on a machine "
        f"shared with other engineers; the protocol's student: ImageNet MobileNetV2 + GeM + 512-D head, "
        f"ResolutionDistillationTrainer, coupled augmentations, data loaded in the main process)",
        "",
        "| setting | database / query px | views per step | iteration, teacher live (s) | iteration, teacher "
        "cached (s) | saved | teacher forward alone (s) | batch loading, both resolutions (s) | paper schedule "
        f"(2000 × 200 views), live / cached (h at {out['torch_threads']} torch threads) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        m = r["median"]
        lines.append(
            f"| {r['setting']} ({r['dataset']}) | {r['database_px']} / {r['query_px']} | {r['views_per_step']} | "
            f"{m['live']:.3f} | {m['cached']:.3f} | {100 * r['saved_fraction']:.0f} % | {m['teacher_forward']:.3f} | "
            f"{m['data']:.3f} | {r['paper_schedule_hours']['live']:.1f} / {r['paper_schedule_hours']['cached']:.1f} |"
        )
    notes = []
    for r in rows:
        h, saved = r["paper_schedule_hours"], 100 * r["saved_fraction"]
        share = "most" if r["saved_fraction"] > 0.5 else "a minority"
        fits = h["cached"] <= FITS_HOURS
        notes.append(
            f"{r['setting']}: the teacher forward is {share} of an iteration ({saved:.0f} % saved by a cache); at this "
            f"size's per-view time one student's paper schedule (2000 steps × 200 views) would take "
            f"{h['live']:.1f} h live and {h['cached']:.1f} h with the cache at {out['torch_threads']} torch threads"
            + (" — within" if fits else " — beyond")
            + f" a CPU budget of {FITS_HOURS} h per student."
        )
    return "\n".join(lines + [""] + notes) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--settings", nargs="+", choices=list(SETTINGS), default=list(SETTINGS))
    p.add_argument("--steps", type=int, default=5, help="timed iterations per variant (after one warm-up)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    args = p.parse_args(argv)
    device = torch.device(args.device)
    rows = [measure(s, args.steps, device) for s in args.settings]
    out = {"device": str(device), "torch_threads": torch.get_num_threads(), "rows": rows}
    text = markdown(out)
    atomic_write_json(os.path.join(args.out, "raml_teacher_cache.json"), out, indent=1)
    atomic_write_text(os.path.join(args.out, "raml_teacher_cache.md"), text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
