"""One self-contained HTML page per experiment: config, metrics table, curves and explanation grids.

Everything is embedded (PNG as base64 ``data:`` URIs), so the file can be mailed or attached to an issue. Read
from the experiment folder written by :class:`pml_extensions.runner.mlrc.MLRCRunner`: ``config.yaml``,
``results.json``, ``fold_*/logs/*.csv`` (record-keeper tables) and, when the explanation hook ran, every PNG
under ``explanations/`` (top-k grids with their maps).
"""

import base64
import csv
import glob
import html
import io
import json
import os
from typing import Dict, List

from .checkpoint import atomic_write_text


def _read_csv(path: str) -> Dict[str, List[float]]:
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    out: Dict[str, List[float]] = {}
    for r in rows:
        for k, v in r.items():
            try:
                out.setdefault(k, []).append(float(v))
            except (TypeError, ValueError):
                out.setdefault(k, []).append(float("nan"))
    return out


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _curves(folder: str, primary: str) -> List[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    images = []
    folds = sorted(glob.glob(os.path.join(folder, "fold_*")))
    for table, x, ys, title in (
        ("loss_histories", "~iteration~", ("total_loss",), "training loss"),
        ("accuracies_val", "~iteration~", (primary,), f"validation {primary}"),
    ):
        fig, ax = plt.subplots(figsize=(6, 3.2))
        drawn = False
        for fold in folds:
            path = os.path.join(fold, "logs", f"{table}.csv")
            if not os.path.exists(path):
                continue
            data = _read_csv(path)
            for y in ys:
                if y in data and x in data:
                    ax.plot(data[x], data[y], label=f"{os.path.basename(fold)}")
                    drawn = True
        if drawn:
            ax.set_xlabel("epoch" if table.startswith("accuracies") else "iteration")
            ax.set_title(title)
            ax.legend(fontsize=7)
            images.append(_png(fig))
        plt.close(fig)
    return images


def write_report(folder: str) -> str:
    """Write ``<folder>/report.html`` and return its path.

    Raises:
        FileNotFoundError: if ``folder`` does not exist.
    """
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"{folder}: no such experiment folder")
    results = {}
    if os.path.exists(os.path.join(folder, "results.json")):
        with open(os.path.join(folder, "results.json"), encoding="utf-8") as f:
            results = json.load(f)
    config_text = ""
    if os.path.exists(os.path.join(folder, "config.yaml")):
        with open(os.path.join(folder, "config.yaml"), encoding="utf-8") as f:
            config_text = f.read()
    primary = results.get("primary_metric", "mean_average_precision_at_r")
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>MLRC report</title>",
        "<style>body{font-family:sans-serif;max-width:1000px;margin:auto}table{border-collapse:collapse}"
        "td,th{border:1px solid #999;padding:3px 8px;text-align:right}pre{background:#f4f4f4;padding:8px;"
        "overflow:auto;max-height:400px}</style></head><body>",
        f"<h1>MLRC report: {html.escape(os.path.basename(os.path.abspath(folder)))}</h1>",
    ]
    test = {k: v for k, v in results.get("test", {}).items() if k != "per_model"}
    if test:
        metrics = sorted({m for v in test.values() for m in v})
        parts.append("<h2>Test metrics</h2><table><tr><th>embedding</th>")
        parts += [f"<th>{html.escape(m)}</th>" for m in metrics]
        parts.append("</tr>")
        for key, vals in test.items():
            parts.append(f"<tr><th>{html.escape(key)}</th>")
            parts += [f"<td>{vals.get(m, float('nan')):.4f}</td>" for m in metrics]
            parts.append("</tr>")
        parts.append("</table>")
    folds = results.get("folds", [])
    if folds:
        parts.append(
            "<h2>Folds</h2><table><tr><th>fold</th><th>best "
            f"epoch</th><th>best val {html.escape(primary)}</th></tr>"
        )
        for k, fr in enumerate(folds):
            best = fr.get("best_val_" + primary, float("nan"))
            parts.append(f"<tr><td>{k}</td><td>{fr.get('best_epoch')}</td><td>{best:.4f}</td></tr>")
        parts.append("</table>")
    curves = _curves(folder, primary)
    if curves:
        parts.append("<h2>Curves</h2>")
        parts += [f"<img src='{c}'>" for c in curves]
    grids = sorted(glob.glob(os.path.join(folder, "explanations", "**", "*.png"), recursive=True))
    if grids:
        parts.append("<h2>Explanations (top-k grids with maps)</h2>")
        for g in grids:
            with open(g, "rb") as f:
                data = base64.b64encode(f.read()).decode("ascii")
            parts.append(
                f"<figure><img src='data:image/png;base64,{data}' style='max-width:100%'>"
                f"<figcaption>{html.escape(os.path.relpath(g, folder))}</figcaption></figure>"
            )
    parts.append(f"<h2>Config</h2><pre>{html.escape(config_text)}</pre></body></html>")
    path = os.path.join(folder, "report.html")
    atomic_write_text(path, "\n".join(parts))
    return path
