"""A search's ``search.json``, ``results.md`` and ``search.png`` (docs/search.md), and the trials' user attributes
they read; ``results.md`` and the report show the blocks :func:`search_blocks` builds from ``search.json``."""

import itertools
import os
from typing import Any, Dict, List, Optional

from ...utils.checks import is_number
from ..experiment.folder import read_json
from .tables import Block, Items, Table, to_markdown

FOLDER_ATTR = "folder"  # user attribute: the trial's folder under the experiment folder
REASON_ATTR = "fail_reason"  # user attribute of a FAIL trial whose run failed (not of a killed one)
UNTRAINED_ATTR = "untrained_folds"  # user attribute: the folds whose best epoch is 0 (the untrained model)
FOLDS_ATTR = "num_folds"


def trial_folder_name(trial) -> str:
    """An Optuna trial's folder: its ``folder`` user attribute (kept by a queued copy), else ``trial_<number>``."""
    return trial.user_attrs.get(FOLDER_ATTR) or f"trial_{trial.number}"


def untrained_note(best: Dict[str, Any]) -> str:
    return (
        f"the best trial, {best['number']} (objective {best['value']:.4f}), ties the untrained model's score: "
        f"epoch 0 stayed the best epoch of every fold, so training never beat the starting weights"
    )


def write_summary(
    study, folder: str, n_trials: Optional[int] = None, stopped: Optional[Dict[str, Any]] = None
) -> Dict[str, Any]:
    """``search.json``, ``results.md`` and ``search.png`` of a study (docs/search.md, "What a search writes")."""
    from ...utils.atomic_io import atomic_write_json, atomic_write_text

    trials, rows = study.get_trials(deepcopy=False), []
    for t in (t for t in trials if t.state.name == "COMPLETE"):
        row = {"number": t.number, "value": t.value, "params": t.params, "folder": trial_folder_name(t)}
        if FOLDS_ATTR in t.user_attrs:
            row[UNTRAINED_ATTR] = list(t.user_attrs.get(UNTRAINED_ATTR) or [])
            row[FOLDS_ATTR] = t.user_attrs[FOLDS_ATTR]
        row["untrained"] = bool(row.get(FOLDS_ATTR)) and len(row[UNTRAINED_ATTR]) == row[FOLDS_ATTR]
        rows.append(row)
    best = max(rows, key=lambda r: r["value"], default=None)
    if best is not None:  # with its run's test metrics (none for a stand-in objective); a corrupt file is one line
        found = read_json(
            os.path.join(folder, best["folder"], "results.json"), "the summary then goes without its test metrics"
        )
        test = found.get("test") if isinstance(found, dict) else None
        best = {**best, **({"test": test} if isinstance(test, dict) else {})}
    copies = {}  # a trial resumed more than once: its last copy
    for t in trials:
        copies.update((number, t.number) for number in t.system_attrs.get("retry_history", []))
    failures = []
    for t in (t for t in trials if t.state.name == "FAIL"):
        again = f"; resumed as trial {copies[t.number]} in {trial_folder_name(t)}" if t.number in copies else ""
        failures.append({"number": t.number, "reason": t.user_attrs.get(REASON_ATTR, "its worker stopped" + again)})
    summary = {
        "n_trials": len(rows),
        "bayes_opt_iters": n_trials,
        "best": best,
        "trials": rows,
        "failed_trials": [f["number"] for f in failures],
        "failures": failures,
        "stopped": stopped,
    }
    atomic_write_json(os.path.join(folder, "search.json"), summary)
    atomic_write_text(os.path.join(folder, "results.md"), to_markdown(search_blocks(summary)))
    if rows:
        _plot(rows, os.path.join(folder, "search.png"))
    return summary


def search_blocks(summary: Dict[str, Any]) -> List[Block]:
    """What ``results.md`` and the report show of a search, from its ``search.json`` (:func:`write_summary`)."""
    rows, best, n_trials = summary.get("trials") or [], summary.get("best"), summary.get("bayes_opt_iters")
    blocks: List[Block] = [
        f"Optuna study ({summary.get('n_trials', len(rows))} COMPLETE trials"
        + (f" of bayes_opt_iters={n_trials}" if n_trials is not None else "")
        + ", maximising the aggregated validation metric)"
        + (f"; best: trial {best['number']}." if best else "; no trial completed.")
    ]
    if best is not None and best.get("untrained"):
        blocks.append(f"FLAG: {untrained_note(best)}.")
    stopped = summary.get("stopped")
    if stopped:
        blocks.append(f"{stopped['message']}.")
    test = best and metrics_table(best.get("test"), f"Test metrics of the best trial (trial {best['number']}):")
    if test:
        blocks.append(test)
    if rows:
        names = list(rows[0]["params"])
        with_folds = any(FOLDS_ATTR in r for r in rows)
        table = []
        for r in rows:
            mark = " (best)" if best is not None and r["number"] == best["number"] else ""
            folds = [f"{len(r.get(UNTRAINED_ATTR, []))}/{r.get(FOLDS_ATTR, '?')}"] if with_folds else []
            params = [f"{v:.4g}" if isinstance(v, float) else str(v) for v in (r["params"][n] for n in names)]
            table.append([f"{r['number']}{mark}", f"{r['value']:.4f}", *folds, *params])
        columns = ["trial", "objective", *(["folds at epoch 0"] if with_folds else []), *names]
        numbers = [all(is_number(r["params"].get(n)) for r in rows) for n in names]
        blocks.append(Table(columns, table, numeric=[False, True, *([False] if with_folds else []), *numbers]))
    failures = summary.get("failures") or []
    if failures:
        blocks.append(Items([f"trial {f['number']}: {f['reason']}" for f in failures], caption="Failed trials:"))
    return blocks


def metrics_table(test: Optional[Dict[str, Any]], caption: str = "") -> Optional[Table]:
    """The test metrics ``{embedding: {metric: value}}`` of a run (its ``results.json``'s ``test``) as a table, one
    row per embedding (other entries, such as MLRC's ``per_model`` list, left out); None when there are none."""
    test = {k: v for k, v in (test or {}).items() if isinstance(v, dict)}
    if not test:
        return None
    metrics = sorted({m for v in test.values() for m in v})
    rows = [[key, *("–" if v.get(m) is None else f"{v[m]:.4f}" for m in metrics)] for key, v in test.items()]
    return Table(["embedding", *metrics], rows, numeric=[False] + [True] * len(metrics), caption=caption)


def _plot(rows: List[Dict[str, Any]], path: str) -> None:
    """``search.png``: the objective per trial (hollow where no fold beat its untrained model) and the best so far."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    from ...utils.atomic_io import atomic_savefig

    fig, ax = plt.subplots(figsize=(5, 3))
    styles = {False: {"color": "C0", "label": "trial"}}
    styles[True] = {"mfc": "none", "color": "C3", "label": "trial: no fold beat its untrained model (epoch 0)"}
    for untrained, style in styles.items():
        points = [(r["number"], r["value"]) for r in rows if r["untrained"] == untrained]
        if points:
            ax.plot(*zip(*points), "o", **style)
    best = list(itertools.accumulate((r["value"] for r in rows), max))
    ax.plot([r["number"] for r in rows], best, "-", color="C1", drawstyle="steps-post", label="best so far")
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set(xlabel="trial", ylabel="objective (validation)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    atomic_savefig(fig, path, dpi=100)
    plt.close(fig)
