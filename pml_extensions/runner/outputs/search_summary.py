"""The outputs of a hyper-parameter search (:mod:`pml_extensions.runner.protocols.search`): ``search.json``,
``results.md`` and ``search.png`` (objective per trial and best so far) of an Optuna study, and the user attributes
of its trials that they read (each trial's folder, its failure reason, its folds that kept the untrained model).
"""

import json
import os
from typing import Any, Dict, Optional

FOLDER_ATTR = "folder"  # user attribute: the trial's folder under the experiment folder
REASON_ATTR = "fail_reason"  # user attribute of a FAIL trial whose run failed (not of a killed one)
UNTRAINED_ATTR = "untrained_folds"  # user attribute: the folds whose best epoch is 0 (the untrained model)
FOLDS_ATTR = "num_folds"


def trial_folder_name(trial) -> str:
    """The folder of an Optuna trial under the experiment folder (its ``folder`` user attribute, kept by a queued
    copy; ``trial_<number>`` otherwise)."""
    return trial.user_attrs.get(FOLDER_ATTR) or f"trial_{trial.number}"


def _untrained(row: Dict[str, Any]) -> bool:
    folds = row.get(FOLDS_ATTR)
    return bool(folds) and len(row.get(UNTRAINED_ATTR) or []) == folds


def untrained_note(best: Dict[str, Any]) -> str:
    return (
        f"the best trial, {best['number']} (objective {best['value']:.4f}), ties the untrained model's score: "
        f"epoch 0 stayed the best epoch of every fold, so training never beat the starting weights"
    )


def write_summary(
    study, folder: str, n_trials: Optional[int] = None, stopped: Optional[Dict[str, Any]] = None
) -> Dict[str, Any]:
    """``search.json``, ``results.md`` and ``search.png`` (objective per trial and best so far) of a study.

    The failed trials are listed with their reasons: the run's (a NaN objective, an exception) or, for a trial
    whose worker stopped, the trial that resumed it. A best trial that ties the untrained score is flagged. The best
    trial carries its run's test metrics (``"test"``, the ``"test"`` entry of its ``results.json``) when it has them.
    """
    import optuna

    from ...utils.atomic_io import atomic_savefig, atomic_write_text

    trials = study.get_trials(deepcopy=False)
    rows = []
    for t in trials:
        if t.state != optuna.trial.TrialState.COMPLETE:
            continue
        row = {"number": t.number, "value": t.value, "params": t.params, "folder": trial_folder_name(t)}
        if FOLDS_ATTR in t.user_attrs:
            row[UNTRAINED_ATTR] = list(t.user_attrs.get(UNTRAINED_ATTR) or [])
            row[FOLDS_ATTR] = t.user_attrs[FOLDS_ATTR]
        row["untrained"] = _untrained(row)
        rows.append(row)
    best = max(rows, key=lambda r: r["value"]) if rows else None
    if best is not None:
        best = {**best, **_test_metrics(os.path.join(folder, best["folder"], "results.json"))}
    resumed_as = {}
    for t in trials:
        for number in t.system_attrs.get("retry_history", []):
            resumed_as[number] = t.number  # the last copy of a trial resumed more than once
    failures = []
    for t in trials:
        if t.state != optuna.trial.TrialState.FAIL:
            continue
        if REASON_ATTR in t.user_attrs:
            reason = t.user_attrs[REASON_ATTR]
        elif t.number in resumed_as:
            reason = f"its worker stopped; resumed as trial {resumed_as[t.number]} in {trial_folder_name(t)}"
        else:
            reason = "its worker stopped"
        failures.append({"number": t.number, "reason": reason})
    summary = {
        "n_trials": len(rows),
        "bayes_opt_iters": n_trials,
        "best": best,
        "trials": rows,
        "failed_trials": [f["number"] for f in failures],
        "failures": failures,
        "stopped": stopped,
    }
    atomic_write_text(os.path.join(folder, "search.json"), json.dumps(summary, indent=2))
    lines = [
        f"Optuna study ({len(rows)} COMPLETE trials"
        + (f" of bayes_opt_iters={n_trials}" if n_trials is not None else "")
        + ", maximising the aggregated validation metric)"
        + (f"; best: trial {best['number']}." if best else "; no trial completed.")
    ]
    if best is not None and best["untrained"]:
        lines.append(f"\nFLAG: {untrained_note(best)}.")
    if stopped:
        lines.append(f"\n{stopped['message']}.")
    if rows:
        names = list(rows[0]["params"])
        with_folds = any(FOLDS_ATTR in r for r in rows)
        head = "| trial | objective |" + (" folds at epoch 0 |" if with_folds else "")
        lines += ["", head + "".join(f" {n} |" for n in names), "|---|---|" + "---|" * (len(names) + with_folds)]
        for r in rows:
            mark = " (best)" if r["number"] == best["number"] else ""
            folds = f" {len(r.get(UNTRAINED_ATTR, []))}/{r.get(FOLDS_ATTR, '?')} |" if with_folds else ""
            lines.append(
                f"| {r['number']}{mark} | {r['value']:.4f} |{folds}"
                + "".join(f" {_shown(r['params'][n])} |" for n in names)
            )
    if failures:
        lines += ["", "Failed trials:"] + [f"- trial {f['number']}: {f['reason']}" for f in failures]
    atomic_write_text(os.path.join(folder, "results.md"), "\n".join(lines) + "\n")
    if rows:
        _plot(rows, os.path.join(folder, "search.png"), atomic_savefig)
    return summary


def _test_metrics(results_path: str) -> Dict[str, Any]:
    """``{"test": {key: {metric: value}}}``: the test metrics of a trial's run (its ``results.json``), or ``{}``."""
    try:
        with open(results_path) as f:
            test = json.load(f).get("test")
    except (OSError, ValueError, AttributeError):  # no run there (a stand-in objective), or not a results file
        return {}
    return {"test": test} if isinstance(test, dict) else {}


def _shown(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _plot(rows, path, atomic_savefig) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, ax = plt.subplots(figsize=(5, 3))
    xs = [r["number"] for r in rows]
    ys = [r["value"] for r in rows]
    trained = [(x, y) for x, y, r in zip(xs, ys, rows) if not r["untrained"]]
    untrained = [(x, y) for x, y, r in zip(xs, ys, rows) if r["untrained"]]
    if trained:
        ax.plot(*zip(*trained), "o", color="C0", label="trial")
    if untrained:
        ax.plot(
            *zip(*untrained), "o", mfc="none", color="C3", label="trial: no fold beat its untrained model (epoch 0)"
        )
    best = [max(ys[: i + 1]) for i in range(len(ys))]
    ax.plot(xs, best, "-", color="C1", drawstyle="steps-post", label="best so far")
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set_xlabel("trial")
    ax.set_ylabel("objective (validation)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    atomic_savefig(fig, path, dpi=100)
    plt.close(fig)
