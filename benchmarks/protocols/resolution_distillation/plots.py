"""The resolution-distillation protocol's figure: performance against query FLOPs (RAML, Suma & Tolias, WACV 2023,
Fig. 4 style), ``performance_vs_flops.png`` in the experiment folder."""

import numpy as np

from .evaluation import PRIMARY
from .variants import TABLE2_SETUPS


def plot_performance_vs_flops(results: dict, path: str):
    """Fig. 4 style: MAP@R (mean over seeds) against query MFLOPs, one panel per dataset, one line per setup.
    Atomic write."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from pml_extensions.utils.atomic_io import atomic_savefig

    rows = [r for r in results.get("rows", []) if r.get("student_variant") in (None, "full")]
    datasets = sorted({r["dataset"] for r in rows}) or ["-"]
    fig, axes = plt.subplots(1, len(datasets), figsize=(5.5 * len(datasets), 4.2), squeeze=False)
    for ax, dataset in zip(axes[0], datasets):
        for setup, marker in zip(TABLE2_SETUPS, "vos^D"):
            pts = {}
            for r in rows:
                if r["dataset"] == dataset and r["setup"] == setup:
                    pts.setdefault(r["query_flops"], []).append(r[PRIMARY])
            if pts:
                xs = sorted(pts)
                ax.plot([x / 1e6 for x in xs], [100 * np.mean(pts[x]) for x in xs], marker=marker, label=setup)
        ax.set_xlabel("query MFLOPs per image (torch flop counter)")
        ax.set_ylabel("MAP@R (%)")
        ax.set_title(dataset)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    try:
        atomic_savefig(fig, path, dpi=110)
    finally:
        plt.close(fig)
