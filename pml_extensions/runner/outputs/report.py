"""One self-contained HTML page per experiment, for every protocol: the command line, the dataset, the metrics,
smoothed loss curves, the ``xml_loss`` curve, validation curves, figures, explanation grids and the config.

Everything is embedded (PNG as base64 ``data:`` URIs), so the file can be mailed or attached to an issue. Read
from the experiment folder (layout: :mod:`pml_extensions.runner.experiment.folder`): ``config.yaml``, ``command.txt``,
``results.json`` (MLRC's ``test``/``folds`` as tables; a fold whose best epoch is 0, the untrained model, is
flagged), ``results.md``, every stage's ``logs/*.csv`` (record-keeper tables, at any depth), the PNGs at the top
of the folder and, when the explanation hook ran, every PNG under ``explanations/``.
:func:`pml_extensions.runner.protocols.run_protocol` writes it after each run.
"""

import base64
import csv
import glob
import html
import io
import json
import os
from typing import Dict, List

from ..experiment.checkpoint import ITERATION_COLUMN, atomic_write_text


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


def _smooth(values: List[float]) -> List[float]:
    """Trailing moving average over ``max(1, n // 25)`` points (NaNs skipped)."""
    import numpy as np

    v = np.asarray(values, dtype=np.float64)
    w = max(1, len(v) // 25)
    out = []
    for i in range(len(v)):
        window = v[max(0, i - w + 1) : i + 1]
        window = window[np.isfinite(window)]
        out.append(float(window.mean()) if len(window) else float("nan"))
    return out


def _tables(folder: str) -> Dict[str, List[str]]:
    """record-keeper CSVs of every stage: table name -> paths (``<stage>/logs/<table>.csv`` at any depth)."""
    out: Dict[str, List[str]] = {}
    for path in sorted(glob.glob(os.path.join(folder, "**", "logs", "*.csv"), recursive=True)):
        out.setdefault(os.path.splitext(os.path.basename(path))[0], []).append(path)
    return out


def _stage(folder: str, path: str) -> str:
    return os.path.relpath(os.path.dirname(os.path.dirname(path)), folder)


def _curves(folder: str, primary: str) -> List[str]:
    """PNG data URIs: the training losses (raw faint, smoothed solid), the ``xml_loss`` curve when a loss logged
    one, and the validation primary metric (``<metric>`` or PML's ``<metric>_level0`` column)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = ITERATION_COLUMN
    tables = _tables(folder)
    plots = [
        ("training loss (smoothed)", "iteration", [(p, "total_loss") for p in tables.get("loss_histories", [])], True),
        (
            "xml_loss (smoothed)",
            "iteration",
            [(p, "xml_loss") for t, ps in tables.items() if not t.startswith("accuracies") for p in ps],
            True,
        ),
        (
            f"validation {primary}",
            "epoch",
            [
                (p, c)
                for t, ps in tables.items()
                if t.startswith("accuracies")
                for p in ps
                for c in (primary, primary + "_level0")
            ],
            False,
        ),
    ]
    images = []
    for title, xlabel, series, smooth in plots:
        fig, ax = plt.subplots(figsize=(6, 3.2))
        drawn = False
        for path, column in series:
            data = _read_csv(path)
            if column not in data or x not in data:
                continue
            label = _stage(folder, path)
            if smooth:
                line = ax.plot(data[x], data[column], alpha=0.25)[0]
                ax.plot(data[x], _smooth(data[column]), color=line.get_color(), label=label)
            else:
                ax.plot(data[x], data[column], marker="o", label=label)
            drawn = True
        if drawn:
            ax.set_xlabel(xlabel)
            ax.set_title(title)
            ax.legend(fontsize=7)
            images.append(_png(fig))
        plt.close(fig)
    return images


def _read_text(folder: str, name: str) -> str:
    path = os.path.join(folder, name)
    if not os.path.exists(path):
        return ""
    with open(path, encoding="utf-8") as f:
        return f.read()


def _dataset_line(config_text: str) -> str:
    """The config's dataset spec in one line (``dataset``, or the resolution job's ``datasets``)."""
    import yaml

    try:
        config = yaml.safe_load(config_text) or {}
    except yaml.YAMLError:
        return ""
    dataset = config.get("dataset") or (config.get("resolution_job") or {}).get("datasets")
    return "" if dataset is None else json.dumps(dataset, sort_keys=True, default=str)


def _embedded_png(folder: str, path: str) -> str:
    with open(path, "rb") as f:
        data = base64.b64encode(f.read()).decode("ascii")
    return (
        f"<figure><img src='data:image/png;base64,{data}' style='max-width:100%'>"
        f"<figcaption>{html.escape(os.path.relpath(path, folder))}</figcaption></figure>"
    )


def _yaml_value(config_text: str, key: str):
    import yaml

    try:
        return (yaml.safe_load(config_text) or {}).get(key)
    except (yaml.YAMLError, AttributeError):
        return None


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
    config_text = _read_text(folder, "config.yaml")
    command = _read_text(folder, "command.txt").strip()
    dataset = _dataset_line(config_text)
    protocol = results.get("protocol") or (_yaml_value(config_text, "protocol") or "mlrc")
    primary = results.get("primary_metric", "mean_average_precision_at_r")
    parts = [
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(protocol)} report</title>",
        "<style>body{font-family:sans-serif;max-width:1000px;margin:auto}table{border-collapse:collapse}"
        "td,th{border:1px solid #999;padding:3px 8px;text-align:right}pre{background:#f4f4f4;padding:8px;"
        "overflow:auto;max-height:400px}</style></head><body>",
        f"<h1>{html.escape(protocol)} report: {html.escape(os.path.basename(os.path.abspath(folder)))}</h1>",
    ]
    if command:
        parts.append(f"<p>Command: <code>{html.escape(command)}</code></p>")
    if dataset:
        parts.append(f"<p>Dataset: <code>{html.escape(dataset)}</code></p>")
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
            f"<h2>Folds</h2><table><tr><th>fold</th><th>best epoch</th><th>best val {html.escape(primary)}</th></tr>"
        )
        for k, fr in enumerate(folds):
            best = fr.get("best_val_" + primary, float("nan"))
            flag = " <b>(the untrained model: training never beat epoch 0)</b>" if fr.get("best_epoch") == 0 else ""
            parts.append(f"<tr><td>{k}</td><td>{fr.get('best_epoch')}{flag}</td><td>{best:.4f}</td></tr>")
        parts.append("</table>")
    table = _read_text(folder, "results.md")
    if table:
        parts.append(f"<h2>Results</h2><pre>{html.escape(table)}</pre>")
    curves = _curves(folder, primary)
    if curves:
        parts.append("<h2>Curves</h2>")
        parts += [f"<img src='{c}'>" for c in curves]
    figures = sorted(glob.glob(os.path.join(folder, "*.png")))
    if figures:
        parts.append("<h2>Figures</h2>")
        parts += [_embedded_png(folder, g) for g in figures]
    grids = sorted(glob.glob(os.path.join(folder, "explanations", "**", "*.png"), recursive=True))
    if grids:
        parts.append("<h2>Explanations (top-k grids with maps)</h2>")
        parts += [_embedded_png(folder, g) for g in grids]
    parts.append(f"<h2>Config</h2><pre>{html.escape(config_text)}</pre></body></html>")
    path = os.path.join(folder, "report.html")
    atomic_write_text(path, "\n".join(parts))
    return path
