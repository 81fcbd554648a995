"""Hyper-parameter search: powerful-benchmarker's ``~BAYESIAN~`` markers run an Optuna study (optional extra
``pip install pml_extensions[search]``).

Markers (PB's): ``key~BAYESIAN~: [low, high]`` (uniform float), ``key~LOG_BAYESIAN~: [low, high]`` (log-uniform),
``key~INT_BAYESIAN~: [low, high]`` (integer). ``bayes_opt_iters`` (PB's key) is the number of trials. Each trial
is one run of the config's protocol with the sampled values, in ``<experiment>/trial_<n>``; its objective is the
aggregated validation primary metric (``results["aggregate"][primary_metric]``, :func:`pb_keys.aggregate`),
maximised with Optuna's TPE sampler seeded by the config's ``seed``.

The study lives in ``<experiment>/study.db`` (SQLite). Rerunning the same command resumes it, with Optuna's public
API only: a trial that was running when the process died (SIGKILL) is marked FAIL and its parameters are queued
again (``Study.enqueue_trial``) to run in the killed trial's own folder, so its protocol run resumes from its
checkpoint; only the missing trials are added, and the study ends with exactly ``bayes_opt_iters`` COMPLETE trials
(the interrupted one stays in the history as FAIL). One process drives a study folder; under ``torchrun`` that is
rank 0, which sends every trial's config to the other ranks so that all of them train it together.
``search.json`` / ``results.md`` / ``search.png`` (objective per trial, best so far) hold the trials and the best
one, which report.html shows.

Example (shell)::

    python -m pml_extensions run contrastive --variant quick --bayes_opt_iters 4 \\
        --optimizers~APPLY~3 "{lr~LOG_BAYESIAN~: [0.0001, 0.01]}"
"""

import copy
import json
import os
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..config.syntax import _SEARCH_OPS, split_marker
from ..errors import ConfigError

STUDY_NAME = "search"
FOLDER_ATTR = "folder"  # user attribute: the trial's folder under the experiment folder


def search_space(config: Any, path: Tuple = ()) -> List[Tuple[Tuple, str, str, Any]]:
    """``[(path_to_marked_key, param_name, op, [low, high])]`` for every search marker in ``config``.

    Raises:
        ConfigError: a range that is not ``[low, high]`` numbers with ``low < high`` (positive for LOG).
    """
    found = []
    if isinstance(config, dict):
        for key, value in config.items():
            name, op, _ = split_marker(key)
            if op in _SEARCH_OPS:
                where = ".".join(map(str, path + (name,)))
                ok = (
                    isinstance(value, list)
                    and len(value) == 2
                    and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
                )
                if not ok or value[0] >= value[1] or (op == "LOG_BAYESIAN" and value[0] <= 0):
                    raise ConfigError(
                        f"{where}~{op}~: expected [low, high] with low < high"
                        f"{' and low > 0' if op == 'LOG_BAYESIAN' else ''}, got {value!r}"
                    )
                if op == "INT_BAYESIAN" and not all(isinstance(v, int) for v in value):
                    raise ConfigError(f"{where}~{op}~: expected two integers, got {value!r}")
                found.append((path + (key,), where, op, value))
            else:
                found.extend(search_space(value, path + (key,)))
    return found


def suggest(trial, space) -> Dict[str, Any]:
    """Ask ``trial`` (an ``optuna.Trial``) for one value per marker."""
    out = {}
    for _, name, op, (low, high) in space:
        if op == "INT_BAYESIAN":
            out[name] = trial.suggest_int(name, low, high)
        else:
            out[name] = trial.suggest_float(name, float(low), float(high), log=op == "LOG_BAYESIAN")
    return out


def fill(config: Dict[str, Any], space, values: Dict[str, Any]) -> Dict[str, Any]:
    """``config`` with each marked key replaced by its plain key and the trial's value."""
    out = copy.deepcopy(config)
    for path, name, _, _ in space:
        parent = out
        for key in path[:-1]:
            parent = parent[key]
        items = list(parent.items())
        parent.clear()
        for k, v in items:
            if k == path[-1]:
                parent[split_marker(k)[0]] = values[name]
            else:
                parent[k] = v
    return out


def objective_value(results: Dict[str, Any], config: Dict[str, Any]) -> float:
    """The aggregated validation primary metric of one protocol run (mean over folds of the best epoch's value).

    Raises:
        ConfigError: when the protocol reports no validation numbers to optimise.
    """
    from ..config import pb_keys

    primary = pb_keys.primary_metric(config)
    aggregate = results.get("aggregate") or {}
    if primary in aggregate:
        return float(aggregate[primary])
    folds = [f.get(f"best_val_{primary}") for f in results.get("folds") or []]
    if folds and all(isinstance(v, (int, float)) for v in folds):
        return float(sum(folds) / len(folds))
    raise ConfigError(
        f"bayes_opt_iters: the {config.get('protocol', 'mlrc')} protocol reports no validation "
        f"{primary} to optimise (the search supports the mlrc protocol)"
    )


def _protocol_objective(sources, on_change, command, log):
    def run(trial_config: Dict[str, Any], trial_folder: str) -> float:
        from . import run_protocol

        results = run_protocol(trial_config, trial_folder, sources, log=log, on_change=on_change, command=command)
        return objective_value(results, trial_config)

    return run


def run_search(
    config: Dict[str, Any],
    folder: str,
    sources: Optional[Dict[str, str]] = None,
    on_change: str = "stop",
    command: Optional[Sequence[str]] = None,
    log: Callable[..., None] = print,
    objective: Optional[Callable[[Dict[str, Any], str], float]] = None,
) -> Dict[str, Any]:
    """Run (or resume) the Optuna study of ``config``'s search markers in ``folder``.

    Args:
        config: merged config with ``~BAYESIAN~``-family markers and ``bayes_opt_iters``.
        folder: the experiment folder (``study.db`` and ``trial_<n>/`` go there).
        objective: ``(trial_config, trial_folder) -> float`` to maximise; default: run the config's protocol
            and return :func:`objective_value`.

    Returns:
        ``{"best": {"number", "value", "params", "folder"}, "trials": [...], "n_trials": n}`` (also written to
        ``search.json``).

    Raises:
        ConfigError: optuna not installed, no ``bayes_opt_iters``, bad ranges.
    """
    try:
        import optuna
    except ImportError:
        raise ConfigError(
            "search markers (~BAYESIAN~) need optuna, which is not installed "
            "(pip install optuna); replace the markers by fixed values"
        ) from None
    space = search_space(config)
    n_trials = config.get("bayes_opt_iters")
    if isinstance(n_trials, bool) or not isinstance(n_trials, int) or n_trials < 1:
        raise ConfigError(
            f"{(sources or {}).get('bayes_opt_iters', 'command line')}: bayes_opt_iters: the search "
            f"needs the number of trials, e.g. --bayes_opt_iters 20 (got {n_trials!r})"
        )
    if objective is None and (config.get("protocol") or "mlrc") != "mlrc":
        raise ConfigError(
            f"{(sources or {}).get('protocol', 'config')}: protocol: the search optimises the mlrc "
            f"protocol's aggregated validation metric; {config['protocol']} reports none"
        )
    from ..experiment import distributed as dist_utils
    from ..experiment.folder import prepare_folder

    prepare_folder(folder, config, on_change=on_change, command=command, log=log)
    objective = objective or _protocol_objective(sources, on_change, command, log)
    if not dist_utils.is_main():
        return _follow_rank_0(objective)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = f"sqlite:///{os.path.abspath(os.path.join(folder, 'study.db'))}"
    seed = config.get("seed", 0)
    study = optuna.create_study(study_name=STUDY_NAME, storage=storage, direction="maximize", load_if_exists=True)
    # seeded by the config's seed and the number of trials so far: a resumed study does not redraw old trials
    offset = len(study.get_trials(deepcopy=False))
    study.sampler = optuna.samplers.TPESampler(seed=None if seed is None else int(seed) + offset)

    def evaluate(trial) -> float:
        name = _trial_folder_name(trial)  # a re-queued interrupted trial keeps its folder
        trial.set_user_attr(FOLDER_ATTR, name)
        values = suggest(trial, space)
        log(f"trial {trial.number}: " + ", ".join(f"{k}={v:.4g}" for k, v in values.items()))
        job = (fill(config, space, values), os.path.join(folder, name))
        dist_utils.broadcast_object(("trial", job))  # under torchrun every rank trains the trial
        return objective(*job)

    for frozen in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        # one process drives a study folder, so a trial still RUNNING now was killed: FAIL it, queue its parameters
        # again, in its own folder (the protocol run there resumes from its checkpoint)
        log(f"trial {frozen.number}: interrupted; its parameters run again in {_trial_folder_name(frozen)}")
        study.tell(frozen.number, state=optuna.trial.TrialState.FAIL)
        study.enqueue_trial(frozen.params, user_attrs={FOLDER_ATTR: _trial_folder_name(frozen)})
    done = len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)))
    if done < n_trials:
        study.optimize(evaluate, n_trials=n_trials - done, catch=())
    summary = write_summary(study, folder)
    dist_utils.broadcast_object(("done", summary))
    from ..outputs.report import write_report

    write_report(folder)  # shows results.md (the trials, best marked) and search.png
    return summary


def _trial_folder_name(trial) -> str:
    return trial.user_attrs.get(FOLDER_ATTR) or f"trial_{trial.number}"


def _follow_rank_0(objective) -> Dict[str, Any]:
    """Ranks other than 0 under torchrun: train every trial rank 0 sends, until it sends the summary."""
    from ..experiment import distributed as dist_utils

    while True:
        kind, payload = dist_utils.broadcast_object(None)
        if kind == "done":
            return payload
        objective(*payload)


def write_summary(study, folder: str) -> Dict[str, Any]:
    """``search.json``, ``results.md`` and ``search.png`` (objective per trial and best so far) of a study."""
    import optuna

    from ...utils.atomic_io import atomic_savefig, atomic_write_text

    trials = [t for t in study.get_trials(deepcopy=False) if t.state == optuna.trial.TrialState.COMPLETE]
    rows = [{"number": t.number, "value": t.value, "params": t.params, "folder": _trial_folder_name(t)} for t in trials]
    best = max(rows, key=lambda r: r["value"]) if rows else None
    # FAIL: killed (and re-queued) or raised
    failed = [t.number for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.FAIL,))]
    summary = {"n_trials": len(rows), "best": best, "trials": rows, "failed_trials": failed}
    atomic_write_text(os.path.join(folder, "search.json"), json.dumps(summary, indent=2))
    if rows:
        names = list(rows[0]["params"])
        lines = ["| trial | objective | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
        for r in rows:
            mark = " (best)" if r is best else ""
            lines.append(
                f"| {r['number']}{mark} | {r['value']:.4f} | "
                + " | ".join(f"{r['params'][n]:.4g}" for n in names)
                + " |"
            )
        atomic_write_text(
            os.path.join(folder, "results.md"),
            f"Optuna study ({len(rows)} trials, maximising the aggregated validation metric); "
            f"best: trial {best['number']}.\n\n" + "\n".join(lines) + "\n",
        )
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(5, 3))
        xs = [r["number"] for r in rows]
        ys = [r["value"] for r in rows]
        ax.plot(xs, ys, "o", label="trial")
        ax.plot(xs, [max(ys[: i + 1]) for i in range(len(ys))], "-", label="best so far")
        ax.set_xlabel("trial")
        ax.set_ylabel("objective (validation)")
        ax.legend()
        fig.tight_layout()
        atomic_savefig(fig, os.path.join(folder, "search.png"), dpi=100)
        plt.close(fig)
    return summary
