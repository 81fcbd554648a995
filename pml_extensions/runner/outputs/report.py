"""One self-contained HTML page per experiment, for every protocol (what it shows: docs/report.md). Everything is
embedded (PNG as base64 ``data:`` URIs; no script, nothing fetched) and read from the experiment folder alone; the
tables are rebuilt from ``results.json`` or ``search.json`` (:mod:`.results`, :mod:`.search_summary`), no Markdown is
parsed. :func:`pml_extensions.runner.protocols.run_protocol` writes it after each run.
"""

import base64
import csv
import glob
import html
import io
import json
import os
import pathlib
import re
from typing import Any, Dict, List, Optional, Tuple, Union

from ...utils.checks import is_int
from ..experiment.checkpoint import ITERATION_COLUMN, atomic_write_text
from ..experiment.folder import read_json, saved_config
from .results import results_blocks
from .search_summary import metrics_table, search_blocks
from .tables import Table, inline_html, to_html

#: a screenshot of report.html kept beside it (the browser test writes one); never embedded in the page itself
SCREENSHOT = "report.png"


def _float(value) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("nan")


def _logs(folder: str) -> Dict[str, Dict[str, Dict[str, List[float]]]]:
    """Every stage's record-keeper tables (``<stage>/logs/<table>.csv`` at any depth) as ``stage -> table -> column ->
    values`` (NaN where a cell is no number)."""
    out: Dict[str, Dict[str, Dict[str, List[float]]]] = {}
    for path in sorted(glob.glob(os.path.join(folder, "**", "logs", "*.csv"), recursive=True)):
        table: Dict[str, List[float]] = {}
        with open(path, newline="", encoding="utf-8") as f:
            for row in csv.DictReader(f):
                for k, v in row.items():
                    table.setdefault(k, []).append(_float(v))
        stage = os.path.relpath(os.path.dirname(os.path.dirname(path)), folder)
        out.setdefault(stage, {})[os.path.splitext(os.path.basename(path))[0]] = table
    return out


def _read_text(folder: str, name: str) -> str:
    path = pathlib.Path(folder, name)
    return path.read_text(encoding="utf-8") if path.exists() else ""


def _run_files(folder: str) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """A run folder's ``results.json`` and ``config.yaml`` (empty when absent); a corrupt one is one line naming it."""
    results = read_json(os.path.join(folder, "results.json"), "the run writes it again at its end")
    return results or {}, saved_config(folder) or {}


def _png(data: Union[bytes, str, Any]) -> str:
    """A PNG (its bytes, its file's path, or a matplotlib ``Figure`` drawn at 90 dpi) as a ``data:`` URI."""
    if isinstance(data, str):
        data = pathlib.Path(data).read_bytes()
    elif not isinstance(data, bytes):
        png = io.BytesIO()
        data.savefig(png, format="png", dpi=90, bbox_inches="tight")
        data = png.getvalue()
    return "data:image/png;base64," + base64.b64encode(data).decode("ascii")


def _figure(folder: str, path: str) -> str:
    return (
        f"<figure><img src='{_png(path)}' style='max-width:100%' alt='figure'>"
        f"<figcaption>{html.escape(os.path.relpath(path, folder))}</figcaption></figure>"
    )


def _untrained_val(logs: Dict[str, Any], fold: int, primary: str) -> Optional[float]:
    """Fold ``fold``'s validation ``primary`` at epoch 0 (the untrained model) in ``logs``, None when not logged."""
    data = logs.get(f"fold_{fold}", {}).get("accuracies_val", {})
    epochs = data.get("epoch") or data.get(ITERATION_COLUMN, [])  # accuracies tables count epochs in both
    return next((value for epoch, value in zip(epochs, data.get(primary, [])) if epoch == 0 and value == value), None)


def _smooth(values: List[float]) -> List[float]:
    """Trailing moving average over ``max(1, n // 25)`` points (NaNs skipped)."""
    import numpy as np

    v = np.asarray(values, dtype=np.float64)
    w = max(1, len(v) // 25)
    windows = [v[max(0, i - w + 1) : i + 1] for i in range(len(v))]
    windows = [x[np.isfinite(x)] for x in windows]
    return [float(x.mean()) if len(x) else float("nan") for x in windows]


def _selected(results: Dict[str, Any]) -> Dict[str, Tuple[str, int]]:
    """Stage folder -> ``("epoch" | "iteration", value)`` of the model kept: ``results["selected"]`` (any protocol's
    ``{stage: [unit, value]}``), MLRC's ``folds[k].best_epoch``, a paired protocol's ``units[variant][seed]``."""
    out: Dict[str, Tuple[str, int]] = {}
    for k, fold in enumerate(results.get("folds") or []):
        if isinstance(fold, dict) and isinstance(fold.get("best_epoch"), int):
            out[f"fold_{k}"] = ("epoch", fold["best_epoch"])
    for name, per_seed in (results.get("units") or {}).items():
        for seed, unit in (per_seed or {}).items():
            epoch = unit.get("selected_epoch", unit.get("best_epoch")) if isinstance(unit, dict) else None
            if isinstance(epoch, int):
                out[f"{name}/seed_{seed}"] = ("epoch", epoch)
    for stage, (unit, value) in (results.get("selected") or {}).items():
        if unit in ("epoch", "iteration") and isinstance(value, int):
            out[stage] = (unit, value)
    return out


def _iterations_per_epoch(results: Dict[str, Any], config: Dict[str, Any]) -> Optional[int]:
    """Training iterations per epoch (``results`` or the config's trainer), None when the config does not fix it."""
    value = results.get("iterations_per_epoch")
    if not isinstance(value, int):
        trainer = config.get("trainer")
        if isinstance(trainer, dict) and len(trainer) == 1:
            kwargs = next(iter(trainer.values()))
            value = kwargs.get("iterations_per_epoch") if isinstance(kwargs, dict) else None
    return value if is_int(value) and value > 0 else None


def _mark(ax, colour: str, xs: List[float], ys: List[float], x: float) -> bool:
    """A star of ``colour`` on the curve ``(xs, ys)`` at ``x``, or a dotted line where it has no point there; True."""
    y = next((b for a, b in zip(xs, ys) if a == x), None)
    if y is None:
        ax.axvline(x, color=colour, linestyle=":", linewidth=1.5)
    else:
        ax.plot([x], [y], marker="*", markersize=15, color=colour, markeredgecolor="black")
    return True


def _variant(stage: str) -> str:
    """A stage folder's curve colour: its path without ``seed_<n>`` parts, so that a variant's seeds share one."""
    return "/".join(p for p in pathlib.PurePath(stage).parts if not re.fullmatch(r"seed_\d+", p)) or stage


def _losses(table: str, data: Dict[str, List[float]]) -> List[str]:
    """The losses of a record-keeper table: ``loss_histories``' (``total_loss`` only beside two or more), an
    ``XMLWrapper``'s ``xml_loss``."""
    if table == "loss_histories":
        names = [c for c in data if c != ITERATION_COLUMN]
        return [c for c in names if c != "total_loss" or len(names) != 2]
    return ["xml_loss"] if "xml_loss" in data and not table.startswith("accuracies") else []


def _figures(
    stages: Dict[str, Dict[str, Dict[str, List[float]]]],
    primary: str,
    selected: Dict[str, Tuple[str, int]],
    iterations_per_epoch: Optional[int] = None,
) -> list:
    """Matplotlib ``Figure``s (no pyplot state) of the stages' logs (:func:`_logs`; docs/report.md): one axes per loss
    over the iterations (raw faint, smoothed solid), then the validation metric per epoch; a colour per variant (its
    seeds share it, one legend entry), the selected model of each stage marked."""
    import numpy as np
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    x = ITERATION_COLUMN
    colours = {v: f"C{i % 10}" for i, v in enumerate(dict.fromkeys(map(_variant, stages)))}
    losses: Dict[str, List[Tuple[str, List[float], List[float]]]] = {}  # loss -> (stage, iterations, values)
    for stage, tables in stages.items():
        for table, data in tables.items():
            for loss in _losses(table, data) if x in data else []:
                losses.setdefault(loss, []).append((stage, data[x], data[loss]))
    # each stage's selected model on the iteration axes (an epoch at epoch × iterations_per_epoch, when known)
    on_iterations = {
        stage: value * (iterations_per_epoch if unit == "epoch" else 1)
        for stage, (unit, value) in selected.items()
        if unit == "iteration" or iterations_per_epoch
    }
    figures = []

    def legend(ax, title: str, marked: bool) -> None:  # one entry per variant
        ax.set_title(title + ("; ★ / dotted line: the selected model" if marked else ""), fontsize=9)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # epochs and iterations are whole numbers
        handles = dict(zip(*reversed(ax.get_legend_handles_labels())))
        ax.legend(handles.values(), handles.keys(), fontsize=6, ncol=2 if len(handles) > 6 else 1)

    panels: List[Tuple[str, list]] = []  # (loss, series); a loss whose variants differ over 5-fold: an axes per scale
    for loss, series in losses.items():
        scale: Dict[str, float] = {}  # variant -> the median of its values (all seeds)
        for variant in dict.fromkeys(_variant(stage) for stage, _, _ in series):
            scale[variant] = float(np.nanmedian([y for s, _, ys in series if _variant(s) == variant for y in ys]))
        groups: List[List[str]] = []  # ContrastiveLoss and ProxyAnchorLoss (both metric_loss) apart
        for variant in sorted(scale, key=scale.get):
            if groups and scale[variant] <= 5 * scale[groups[-1][0]]:
                groups[-1].append(variant)
            else:
                groups.append([variant])
        panels += [(loss, [s for s in series if _variant(s[0]) in group]) for group in groups]
    if panels:
        fig = Figure(figsize=(6.4, 0.6 + 1.9 * len(panels)))
        axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)
        for ax, (loss, series) in zip(axes[:, 0], panels):
            for stage, xs, ys in series:
                colour = colours[_variant(stage)]
                ax.plot(xs, ys, color=colour, alpha=0.2, linewidth=0.8)
                ax.plot(xs, _smooth(ys), color=colour, label=_variant(stage))
                if stage in on_iterations:
                    ax.axvline(on_iterations[stage], color=colour, linestyle=":", linewidth=1.5)
            legend(ax, f"{loss} (smoothed)", any(stage in on_iterations for stage, _, _ in series))
        axes[-1, 0].set_xlabel("iteration")
        figures.append(fig)
    fig = Figure(figsize=(6.4, 3.4))
    ax, xlabel, marked = fig.subplots(), "epoch", False
    for stage, tables in stages.items():
        label, colour = _variant(stage), colours[_variant(stage)]
        unit, value = selected.get(stage, (None, None))
        for data in (data for table, data in tables.items() if table.startswith("accuracies")):
            for column in (primary, primary + "_level0") if x in data else ():
                if column in data:
                    ax.plot(data[x], data[column], marker="o", markersize=3, color=colour, label=label)
                    marked = (unit == "epoch" and _mark(ax, colour, data[x], data[column], value)) or marked
            # a plugin's validation values per iteration, one column per setup
            for column in sorted(c for c in data if c.startswith("validation_") and c.endswith(primary)):
                xs, xlabel = data.get("iteration", data.get(x, [])), "iteration"
                line = ax.plot(xs, data[column], marker="o", markersize=3, label=f"{label} {column[11:]}")[0]
                if unit == "iteration" and "teacher_student" in column:  # the setup the selection maximises
                    marked = _mark(ax, line.get_color(), xs, data[column], value)
    if ax.get_lines():
        ax.set_xlabel(xlabel)
        legend(ax, f"validation {primary}", marked)
        figures.append(fig)
    return figures


def _retrieval_html(folder: str) -> str:
    """The retrieval examples under ``<folder>/retrieval/`` (:mod:`.retrieval`), one row per query."""
    base, out = os.path.join(folder, "retrieval"), []

    def cell(item: Dict[str, Any], kind: str, alt: str, caption: str, mark: str = "") -> str:
        path = os.path.join(base, item.get("image", ""))
        if not os.path.isfile(path):
            return ""
        text = f"{caption}<br>{html.escape(str(item.get('class')))}{mark}"
        return f"<td class='{kind}'><img src='{_png(path)}' alt='{alt}'><br>{text}</td>"

    for path in sorted(glob.glob(os.path.join(base, "*.json"))):
        examples = read_json(path, "the run writes it again")
        out.append(f"<h3>{html.escape(str(examples.get('name', '')))}</h3>")
        if examples.get("note"):
            out.append(f"<p>{inline_html(str(examples['note']))}</p>")
        out.append("<table class='retrieval'>")
        for query in examples.get("queries", []):
            row = [cell(query, "query", f"query {query.get('index')}", "query")]
            if not row[0]:
                continue
            for n in query.get("neighbours", []):
                kind, mark = ("same", " ✓ same class") if n.get("same_class") else ("other", " ✗ other class")
                caption = f"#{n.get('rank')} · cos {float(n.get('cosine', 0)):.4f}"
                row.append(cell(n, kind, f"rank {n.get('rank')}", caption, mark))
            out.append("<tr>" + "".join(row) + "</tr>")
        out.append("</table>")
    if not out:
        return ""
    legend = (
        "<p>Seeded test queries (left) and their nearest test images by cosine similarity, the query's own image "
        "left out; <span class='same-key'>green frame</span>: same class as the query, "
        "<span class='other-key'>red frame</span>: other class.</p>"
    )
    return legend + "\n".join(out)


_STYLE = (
    "body{font-family:sans-serif;max-width:1100px;margin:auto;padding:0 12px}"
    "table{border-collapse:collapse;margin:12px 0}td,th{border:1px solid #999;padding:3px 8px;text-align:left}"
    "td.num{text-align:right;white-space:nowrap}pre{background:#f4f4f4;padding:8px;overflow:auto;max-height:400px}"
    "table.retrieval td{border:none;padding:4px;text-align:center;font-size:11px;vertical-align:top}"
    "table.retrieval img{display:block;margin:auto;width:96px;height:96px;object-fit:contain;background:#eee}"
    "td.query img{border:4px solid #444}td.same img{border:4px solid #1a9850}td.other img{border:4px solid #d73027}"
    ".same-key{color:#1a9850;font-weight:bold}.other-key{color:#d73027;font-weight:bold}img.curve{max-width:49%}"
    "p.lines{white-space:pre-line}"
)


def write_report(folder: str) -> str:
    """Write ``<folder>/report.html`` and return its path.

    Raises:
        FileNotFoundError: if ``folder`` does not exist.
    """
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"{folder}: no such experiment folder")
    results, config = _run_files(folder)
    config_text, logs = _read_text(folder, "config.yaml"), _logs(folder)
    command = _read_text(folder, "command.txt").strip()
    dataset = config.get("dataset") or config.get("datasets")
    protocol = results.get("protocol") or config.get("protocol") or "mlrc"
    primary = results.get("primary_metric", "mean_average_precision_at_r")
    summary = read_json(os.path.join(folder, "search.json"), "the search writes it again at its end") or {}
    links, best_trial = [], None
    if summary:  # a search folder: links to every trial's own report, and the best trial's folder
        best = summary.get("best") or {}
        for trial in summary.get("trials", []):
            name = str(trial.get("folder", ""))
            report = os.path.join(name, "report.html")
            mark = " (best)" if trial.get("number") == best.get("number") else ""
            if os.path.isfile(os.path.join(folder, report)):
                links.append(f"<li><a href='{html.escape(report)}'>{html.escape(name)}</a>{mark}</li>")
        best_trial = os.path.join(folder, str(best["folder"])) if best.get("folder") else None
        best_trial = best_trial if best_trial and os.path.isdir(best_trial) else None
    title = f"{protocol} search" if summary else protocol
    parts = [
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)} report</title>",
        f"<style>{_STYLE}</style></head><body>",
        f"<h1>{html.escape(title)} report: {html.escape(os.path.basename(os.path.abspath(folder)))}</h1>",
    ]

    def section(heading: str, items: List[str]) -> None:  # a heading and its items, when there are any
        parts.extend([heading, *items] if items else [])

    if command:
        parts.append(f"<p>Command: <code>{html.escape(command)}</code></p>")
    if dataset is not None:
        parts.append(f"<p>Dataset: <code>{html.escape(json.dumps(dataset, sort_keys=True, default=str))}</code></p>")
    test = metrics_table(results.get("test"))  # MLRC's test metrics and folds (with each fold's untrained score)
    if test is not None:
        parts.append(f"<h2>Test metrics</h2>{to_html([test])}")
    rows = []
    for k, fr in enumerate(results.get("folds", [])):
        flag = " **(the untrained model: training never beat epoch 0)**" if fr.get("best_epoch") == 0 else ""
        best, untrained = fr.get("best_val_" + primary, float("nan")), _untrained_val(logs, k, primary)
        untrained = "not measured" if untrained is None else f"{untrained:.4f}"
        rows.append([str(k), f"{fr.get('best_epoch')}{flag}", f"{best:.4f}", untrained])
    if rows:
        columns = ["fold", "best epoch", f"best val {primary}", f"untrained (epoch 0) val {primary}"]
        parts.append(f"<h2>Folds</h2>{to_html([Table(columns, rows, numeric=[False, False, True, True])])}")
    if summary:  # the search: its trials, failures (and the best trial's test metrics) from search.json
        parts.append(f"<h2>Search: trials</h2>{to_html(search_blocks(summary))}")
        section("<p>Each trial's own report:</p>", ["<ul>" + "".join(links) + "</ul>"] if links else [])
    elif isinstance(results.get("variants"), dict):  # the tables of results.md, rebuilt from results.json
        parts.append(f"<h2>Results</h2>{to_html(results_blocks(results))}")
    elif os.path.isfile(os.path.join(folder, "results.md")):  # written by something else: shown as it is
        parts.append(f"<h2>Results</h2><pre>{html.escape(_read_text(folder, 'results.md'))}</pre>")
    # every PNG the run wrote at the top of the folder, except a screenshot of this page (report.png)
    figures = [g for g in sorted(glob.glob(os.path.join(folder, "*.png"))) if os.path.basename(g) != SCREENSHOT]
    if summary:  # the search plot right under its table
        section("<h2>Search: objective per trial</h2>", [_figure(folder, g) for g in figures])
        figures = []
    source = best_trial or folder
    where = f" (best trial: {html.escape(os.path.relpath(best_trial, folder))})" if best_trial else ""
    examples = _retrieval_html(source)
    if examples:
        parts.append(f"<h2>Retrieval examples{where}</h2>{examples}")
    source_results, source_config = _run_files(best_trial) if best_trial else (results, config)
    curves = _figures(
        _logs(best_trial) if best_trial else logs,
        source_results.get("primary_metric", primary),
        _selected(source_results),
        _iterations_per_epoch(source_results, source_config),
    )
    section(f"<h2>Curves{where}</h2>", [f"<img class='curve' src='{_png(c)}' alt='curve'>" for c in curves])
    section("<h2>Figures</h2>", [_figure(folder, g) for g in figures])
    grids = sorted(glob.glob(os.path.join(source, "explanations", "**", "*.png"), recursive=True))
    section(f"<h2>Explanations (top-k grids with maps){where}</h2>", [_figure(source, g) for g in grids])
    parts.append(f"<h2>Config</h2><pre>{html.escape(config_text)}</pre></body></html>")
    path = os.path.join(folder, "report.html")
    atomic_write_text(path, "\n".join(parts))
    return path
