"""The RAML experiment as one job: teacher at the database resolution, students at smaller query resolutions,
the four evaluation setups with query FLOPs, a markdown table and a performance-vs-FLOPs plot (paper's Fig. 4).

Source: P. Suma and G. Tolias, WACV 2023, Sec. 5 (protocol: teacher trained with triplet + distance-weighted mining
at the large resolution, student initialised from it and distilled label-free with coupled augmentations; evaluation
on unseen classes, every test image a query against the whole test set with itself excluded; mean of 3 seeds).
Deviations (reduced size, to run on a CPU): ImageNet MobileNetV2 instead of ResNet50, small resolutions, a few
hundred iterations, P = 4 augmentations, capped test sets; :data:`GPU_CONFIG` scales towards the paper's
448 px / P = 8 setting. Every size is a config entry.
"""

import copy
import math
import time
from typing import Dict, Optional

import numpy as np
import torch
import torchvision.transforms as T

from ..datasets.coupled_augmentation_dataset import IMAGENET_MEAN, IMAGENET_STD, CoupledAugmentationDataset
from ..losses.resolution_distillation_loss import ResolutionDistillationLoss
from ..testers.asymmetric_tester import SETUPS, AsymmetricTester
from ..trainers.resolution_distillation_trainer import ResolutionDistillationTrainer
from ..trainers.teacher_recipe import make_teacher_trainer
from ..trunks.pretrained import mobilenet_v2_features
from ..trunks.retrieval_head import RetrievalHead
from .asymmetric_accuracy_calculator import AsymmetricAccuracyCalculator
from .atomic_io import atomic_savefig, atomic_write_json

METRICS = {
    "MAP@R": "mean_average_precision_at_r_level0",
    "mAP (PML)": "mean_average_precision_level0",
    "mAP (trapezoid)": "mean_average_precision_trapezoidal_level0",
    "R@1": "recall_at_1_level0",
}

QUICK_CONFIG = {
    "datasets": {
        "openclipart": {
            "database_resolution": 128,
            "query_resolutions": [64, 96],
            "max_classes": 40,
            "max_test_per_class": 30,
            "crop_scale": [0.25, 1.0],
        },
        "glyphs": {
            "database_resolution": 64,
            "query_resolutions": [24, 32],
            "image_size": 64,
            "max_test_per_class": 30,
            "crop_scale": [0.5, 1.0],
        },
    },
    "seeds": [0, 1, 2],
    "teacher_iterations": 40,
    "teacher_lr": 1e-4,
    "student_iterations": 40,
    "images_per_batch": 8,
    "num_augmentations": 4,
    "lr": 1e-4,
    "lambda_ts": 0.7,
    "lambda_ss": 0.7,
    "embedding_dim": 512,
    "eval_batch_size": 64,
    "device": "cpu",
    "num_workers": 0,
}

GPU_CONFIG = copy.deepcopy(QUICK_CONFIG)
GPU_CONFIG.update(
    {
        "teacher_iterations": 2000,
        "student_iterations": 2000,
        "images_per_batch": 25,
        "num_augmentations": 8,
        "lr": 1.1e-4,
        "eval_batch_size": 256,
        "device": "cuda",
        "num_workers": 8,
    }
)
GPU_CONFIG["datasets"]["openclipart"].update(
    {
        "database_resolution": 448,
        "query_resolutions": [160, 224, 320],
        "max_side": 512,
        "max_test_per_class": None,
    }
)
GPU_CONFIG["datasets"]["glyphs"].update(
    {
        "database_resolution": 128,
        "query_resolutions": [32, 48, 64],
        "image_size": 128,
        "max_test_per_class": None,
    }
)


class _Transformed(torch.utils.data.Dataset):
    """``(transform(RGB image), label)`` for a subset of a PIL dataset; ``labels`` kept."""

    def __init__(self, base, indices, transform):
        self.base, self.indices, self.transform = base, np.asarray(indices, dtype=np.int64), transform
        self.labels = np.asarray(base.labels)[self.indices]

    def __len__(self):
        return len(self.indices)

    def __getitem__(self, i):
        image, label = self.base[int(self.indices[i])]
        image = image.convert("RGB")
        return (image if self.transform is None else self.transform(image)), label


def eval_transform(size: int):
    """Paper code's evaluation transform: shorter side to ``size·8/7``, centre crop ``size``, ImageNet normalisation."""
    return T.Compose(
        [
            T.Resize(int(round(size * 8 / 7))),
            T.CenterCrop(size),
            T.ToTensor(),
            T.Normalize(IMAGENET_MEAN, IMAGENET_STD),
        ]
    )


def cap_per_class(labels, max_per_class: Optional[int], seed: int = 0) -> np.ndarray:
    """Indices keeping at most ``max_per_class`` items of each label (a seeded draw, sorted); all when None."""
    labels = np.asarray(labels)
    if max_per_class is None:
        return np.arange(len(labels))
    rng = np.random.default_rng(seed)
    keep = []
    for label in np.unique(labels):
        idx = np.where(labels == label)[0]
        keep.append(idx if len(idx) <= max_per_class else rng.choice(idx, max_per_class, replace=False))
    return np.sort(np.concatenate(keep))


def load_dataset(name: str, cfg: dict):
    """(train, test) PIL datasets of ``name`` (``openclipart``, ``glyphs``, or ``cub`` / ``cars196`` / ``sop`` /
    ``imagefolder`` with ``cfg["root"]``), class-disjoint."""
    from ..datasets import GlyphDataset, OpenClipArt

    if name == "openclipart":
        kw = {"max_classes": cfg.get("max_classes", 40), "max_side": cfg.get("max_side", 128)}
        return OpenClipArt("train", **kw), OpenClipArt("test", **kw)
    if name == "glyphs":
        kw = {"image_size": cfg.get("image_size", 64), "source": cfg.get("source", "matplotlib")}
        return GlyphDataset("train", **kw), GlyphDataset("test", **kw)
    if name in ("cub", "cars196", "sop", "imagefolder"):
        # PML's CUB / Cars196 / SOP classes (or any ImageFolder tree) from ``root``; nothing is downloaded
        from ..datasets import get_dataset

        root = cfg.get("root")
        return get_dataset(name, "train", root=root), get_dataset(name, "test", root=root)
    raise ValueError(f"unknown dataset {name!r}; valid: 'openclipart', 'glyphs', 'cub', 'cars196', 'sop', 'imagefolder'")


def build_model(embedding_dim: int, pretrained: bool = True):
    return mobilenet_v2_features(pretrained=pretrained), RetrievalHead(1280, embedding_dim)


def train_teacher(train_set, cfg: dict, dataset_cfg: dict, device, seed: int = 0):
    """ImageNet MobileNetV2 + GeM/whitening head fine-tuned briefly at the database resolution (triplet + DWM)."""
    torch.manual_seed(seed)  # the model's random head; the job runs in its own process
    trunk, embedder = build_model(cfg["embedding_dim"])
    trunk, embedder = trunk.to(device), embedder.to(device)
    if cfg["teacher_iterations"] <= 0:
        return trunk, embedder
    size = dataset_cfg["database_resolution"]
    transform = T.Compose(
        [
            T.RandomResizedCrop(size, scale=tuple(dataset_cfg.get("crop_scale", (0.08, 1.0)))),
            T.RandomHorizontalFlip(),
            T.ToTensor(),
            T.Normalize(IMAGENET_MEAN, IMAGENET_STD),
        ]
    )
    data = _Transformed(train_set, np.arange(len(train_set)), transform)
    trainer = make_teacher_trainer(
        trunk,
        embedder,
        data,
        lr=cfg["teacher_lr"],
        iterations_per_epoch=cfg["teacher_iterations"],
        data_device=device,
        dataloader_num_workers=cfg["num_workers"],
    )
    trainer.freeze_trunk_batchnorm = True
    trainer.train(1, 1)
    return trunk.eval(), embedder.eval()


def train_student(teacher, train_set, cfg: dict, dataset_cfg: dict, query_resolution: int, device, seed: int):
    """Distil a student (initialised from the teacher) at ``query_resolution`` with coupled augmentations."""
    torch.manual_seed(seed)  # sampler order of the DataLoader; the job runs in its own process
    student = build_model(cfg["embedding_dim"], pretrained=False)
    models = {
        "trunk": student[0].to(device),
        "embedder": student[1].to(device),
        "teacher_trunk": teacher[0],
        "teacher_embedder": teacher[1],
    }
    data = CoupledAugmentationDataset(
        train_set,
        query_resolution,
        dataset_cfg["database_resolution"],
        num_augmentations=cfg["num_augmentations"],
        scale=tuple(dataset_cfg.get("crop_scale", (0.08, 1.0))),
        seed=seed,
    )
    loss = ResolutionDistillationLoss(lambda_ts=cfg["lambda_ts"], lambda_ss=cfg["lambda_ss"])
    trainer = ResolutionDistillationTrainer(
        models,
        None,
        cfg["images_per_batch"],
        {"distillation_loss": loss},
        data,
        lr=cfg["lr"],
        iterations_per_epoch=cfg["student_iterations"],
        data_device=device,
        dataloader_num_workers=cfg["num_workers"],
    )
    trainer.train(1, 1)
    return models["trunk"].eval(), models["embedder"].eval()


def run_resolution_job(config: Optional[dict] = None, log=print) -> Dict:
    """Run the whole job; returns ``{"config", "rows": [...], "seconds"}``.

    Each row: dataset, setup, query_resolution, database_resolution, seed, query_flops and the metrics of
    :data:`METRICS` (PML key names). Raises ValueError on an unknown dataset or non-positive resolutions.
    """
    cfg = copy.deepcopy(QUICK_CONFIG if config is None else config)
    device = torch.device(cfg["device"])
    start = time.time()
    rows = []
    for name, dcfg in cfg["datasets"].items():
        db = dcfg["database_resolution"]
        for q in dcfg["query_resolutions"]:
            if not 0 < q < db:
                raise ValueError(f"{name}: query resolution {q} must be in (0, database_resolution={db})")
        train_set, test_set = load_dataset(name, dcfg)
        test_idx = cap_per_class(test_set.labels, dcfg.get("max_test_per_class"), seed=0)
        log(
            f"[{name}] train {len(train_set)} images / {len(np.unique(train_set.labels))} classes, "
            f"test {len(test_idx)} images / {len(np.unique(test_set.labels))} unseen classes"
        )
        teacher = train_teacher(train_set, cfg, dcfg, device)
        log(f"[{name}] teacher ready ({time.time() - start:.0f}s)")
        tester = AsymmetricTester(
            batch_size=cfg["eval_batch_size"],
            dataloader_num_workers=cfg["num_workers"],
            data_device=device,
            accuracy_calculator=AsymmetricAccuracyCalculator(
                include=tuple(k.replace("_level0", "") for k in METRICS.values()), device=device
            ),
        )

        def make_dataset_dict(res):
            return {"test": _Transformed(test_set, test_idx, eval_transform(res))}

        for i, q in enumerate(dcfg["query_resolutions"]):
            setups = ("teacher_symmetric", "teacher_asymmetric") if i == 0 else ("teacher_asymmetric",)
            teacher_only = tester.evaluate_setups(make_dataset_dict, teacher, None, q, db, setups=setups)
            for setup, res in teacher_only.items():
                rows.append(_row(name, setup, q, db, None, res))
            for seed in cfg["seeds"]:
                student = train_student(teacher, train_set, cfg, dcfg, q, device, seed)
                out = tester.evaluate_setups(
                    make_dataset_dict,
                    teacher,
                    student,
                    q,
                    db,
                    setups=("teacher_student_asymmetric", "student_symmetric"),
                )
                for setup, res in out.items():
                    rows.append(_row(name, setup, q, db, seed, res))
                log(
                    f"[{name}] query {q}px seed {seed}: "
                    + ", ".join(f"{s} MAP@R={out[s]['accuracies']['test'][METRICS['MAP@R']]:.4f}" for s in out)
                    + f" ({time.time() - start:.0f}s)"
                )
    return {"config": cfg, "rows": rows, "seconds": time.time() - start}


def _row(name, setup, q, db, seed, res):
    acc = res["accuracies"]["test"]
    row = {
        "dataset": name,
        "setup": setup,
        "query_resolution": res["query_resolution"],
        "database_resolution": db,
        "reference_resolution": res["reference_resolution"],
        "seed": seed,
        "query_flops": res["query_flops"],
    }
    row.update({label: float(acc[key]) for label, key in METRICS.items()})
    return row


def summarize(rows) -> list:
    """Mean and std over seeds for every (dataset, setup, query resolution)."""
    groups = {}
    for r in rows:
        groups.setdefault((r["dataset"], SETUPS.index(r["setup"]), r["query_resolution"]), []).append(r)
    out = []
    for (dataset, s, q), rs in sorted(groups.items()):
        item = {
            "dataset": dataset,
            "setup": SETUPS[s],
            "query_resolution": q,
            "database_resolution": rs[0]["database_resolution"],
            "query_flops": rs[0]["query_flops"],
            "reference_resolution": rs[0]["reference_resolution"],
            "num_seeds": len(rs),
        }
        for label in METRICS:
            vals = np.array([r[label] for r in rs])
            item[label] = float(vals.mean())
            item[label + " std"] = float(vals.std())
        out.append(item)
    return out


def markdown_table(summary) -> str:
    head = "| dataset | setup | query px | reference px | query MFLOPs | " + " | ".join(METRICS) + " |"
    lines = [head, "|" + "---|" * (5 + len(METRICS))]
    for s in summary:
        q_db, ref = s["query_resolution"], s["reference_resolution"]
        metrics = " | ".join(
            f"{100 * s[m]:.2f}" + (f" ± {100 * s[m + ' std']:.2f}" if s["num_seeds"] > 1 else "") for m in METRICS
        )
        lines.append(f"| {s['dataset']} | {s['setup']} | {q_db} | {ref} | {s['query_flops'] / 1e6:.1f} | {metrics} |")
    return "\n".join(lines)


def plot_performance_vs_flops(summary, path: str, metric: str = "MAP@R"):
    """Fig. 4 style: ``metric`` against query MFLOPs, one panel per dataset, one line per setup. Atomic write."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    datasets = sorted({s["dataset"] for s in summary})
    fig, axes = plt.subplots(1, len(datasets), figsize=(5.5 * len(datasets), 4.2), squeeze=False)
    markers = dict(zip(SETUPS, "os^D"))
    for ax, dataset in zip(axes[0], datasets):
        for setup in SETUPS:
            pts = sorted(
                {(s["query_flops"], s[metric]) for s in summary if s["dataset"] == dataset and s["setup"] == setup}
            )
            if pts:
                ax.plot([p[0] / 1e6 for p in pts], [100 * p[1] for p in pts], marker=markers[setup], label=setup)
        ax.set_xlabel("query MFLOPs per image (torch flop counter)")
        ax.set_ylabel(f"{metric} (%)")
        ax.set_title(dataset)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    try:
        atomic_savefig(fig, path, dpi=120)
    finally:
        plt.close(fig)


def save_json(obj, path: str):
    atomic_write_json(
        path, obj, default=lambda o: o if not isinstance(o, float) or math.isfinite(o) else None
    )
