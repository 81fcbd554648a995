"""Hyper-parameter search: powerful-benchmarker's ``~BAYESIAN~`` markers run an Optuna study (optional extra
``pip install pml_extensions[search]``) that several workers may share.

Markers (PB's): ``key~BAYESIAN~: [low, high]`` (uniform float), ``key~LOG_BAYESIAN~: [low, high]`` (log-uniform),
``key~INT_BAYESIAN~: [low, high]`` (integer), at any depth, inside list items too (every shipped trunk is a list:
``models.trunk[0].ConvNetBody.blocks_per_stage`` names such a parameter). ``bayes_opt_iters`` (PB's key) is the
number of COMPLETE trials the study ends with. Each trial is one run of the config's protocol with the sampled values,
in ``<experiment>/trial_<n>``; its objective is the aggregated validation primary metric
(``results["aggregate"][primary_metric]``, :func:`pb_keys.aggregate`), maximised with Optuna's TPE sampler, seeded by
the config's ``seed`` plus the trial's number (every trial draws its own values, whichever worker asks for it).

Counting: the study ends with exactly ``bayes_opt_iters`` COMPLETE trials. A trial whose objective is NaN or infinite,
or whose run raises (a diverged loss, an out-of-memory error), is FAIL with its reason (``search.json``,
``results.md``) and does not count; the search stops early on one rule only: ``bayes_opt_max_failures_in_a_row``
(ours, default :data:`MAX_FAILURES_IN_A_ROW`) trials in a row failed since this worker started. The stop is said in
one line and recorded in ``search.json`` (``"stopped"``); rerunning the command continues the study. A
:class:`~pml_extensions.runner.errors.ConfigError` inside a trial (the sampled values make a bad config) fails the
trial and stops the search at once.

Many workers, one study: start the same command several times (processes, or ``torchrun`` groups, whose rank 0
is the worker) on the same experiment folder. The study lives in ``<experiment>/study.db`` (SQLite, through Optuna's
``RDBStorage`` with a busy timeout of :data:`SQLITE_TIMEOUT_S` and heartbeats every :data:`HEARTBEAT_INTERVAL_S`).
A worker takes a trial only while fewer than ``bayes_opt_iters`` trials are COMPLETE or running, and waits for the
others' running trials before it ends (one of them may still fail or die). A trial is run again only when its worker
is gone:

- the worker process ended (SIGKILL, a crash, SIGINT/SIGTERM): its lock ``locks/trial_<n>.worker.lock`` is free;
  the next worker to look (or the rerun of the command) fails the trial and queues its parameters again with
  Optuna's heartbeat-stale callback (``RetryHeartbeatStaleTrialCallback``; ``RetryFailedTrialCallback`` before
  Optuna 4.9);
- its heartbeat stopped for more than :data:`GRACE_PERIOD_S` (a worker on another machine that died without its lock
  being released): Optuna's ``fail_stale_trials`` does the same.

The queued copy has the same parameters and the same trial folder, so its protocol run resumes from the checkpoint
(the interrupted trial stays in the history as FAIL). ``locks/<folder>.folder.lock`` is held by whoever writes a
trial folder: no two workers ever write one; a copy waits for a worker that lost its heartbeat but still runs.
SIGINT/SIGTERM (``KeyboardInterrupt``, and the command line's ``Interrupted``) leave the running trial to be resumed
exactly as SIGKILL does, then propagate. Locks are ``fcntl.flock`` locks: workers on several machines need a shared
folder whose file locks work across them (as SQLite does); without ``fcntl`` (Windows) run one worker per study, and
a stopped worker's trial is resumed after the grace period.

``search.json`` / ``results.md`` / ``search.png`` (objective per trial, best so far) hold the trials, the failed ones
with their reasons, and the best one, which report.html shows. A best trial whose every fold kept the untrained
(epoch-0) model ties the untrained score: it is flagged in the output, ``search.json`` and ``results.md``.

Example (shell; run the same line in a second terminal to share the study)::

    python -m pml_extensions run contrastive --variant quick --bayes_opt_iters 4 \\
        --optimizers~APPLY~3 "{lr~LOG_BAYESIAN~: [0.0001, 0.01]}"
"""

import contextlib
import copy
import math
import os
import socket
import threading
import time
import warnings
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from ..config.search_space import fill, search_space, suggest
from ..errors import ConfigError
from ..outputs.search_summary import (
    FOLDER_ATTR,
    FOLDS_ATTR,
    REASON_ATTR,
    UNTRAINED_ATTR,
    trial_folder_name,
    untrained_note,
    write_summary,
)

try:  # POSIX
    import fcntl
except ImportError:  # pragma: no cover - Windows: no lock files, one worker per study
    fcntl = None

STUDY_NAME = "search"
#: seconds between two heartbeats of a running trial (Optuna's ``RDBStorage(heartbeat_interval=...)``)
HEARTBEAT_INTERVAL_S = 10
#: seconds without a heartbeat after which a running trial is failed and queued again (``grace_period``)
GRACE_PERIOD_S = 120
#: seconds a worker waits for the SQLite database while another worker writes it (sqlite3's busy timeout)
SQLITE_TIMEOUT_S = 60
#: seconds between two looks at the study while other workers' trials run
POLL_S = 2.0
#: default of ``bayes_opt_max_failures_in_a_row``
MAX_FAILURES_IN_A_ROW = 5
LOCKS_FOLDER = "locks"


# ------------------------------------------------------------------------------------------------ one trial's value
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


def untrained_folds(results: Dict[str, Any]) -> List[int]:
    """The folds of an mlrc run whose best epoch is 0: the untrained model was never beaten there (epochs that only
    tie it do not replace it), so the fold's validation score is the untrained score.

    Example::

        >>> untrained_folds({"folds": [{"best_epoch": 0}, {"best_epoch": 3}]})
        [0]
    """
    return [k for k, fold in enumerate(results.get("folds") or []) if fold.get("best_epoch") == 0]


def _protocol_objective(sources, on_change, command, log):
    def run(trial_config: Dict[str, Any], trial_folder: str) -> Tuple[float, Dict[str, Any]]:
        from . import run_protocol

        results = run_protocol(trial_config, trial_folder, sources, log=log, on_change=on_change, command=command)
        info = {UNTRAINED_ATTR: untrained_folds(results), FOLDS_ATTR: len(results.get("folds") or [])}
        return objective_value(results, trial_config), info

    return run


def _outcome(objective, job) -> Tuple[Optional[float], Dict[str, Any], Optional[str]]:
    """``(value, user attributes, None)`` of a finished trial or ``(None, {}, reason)`` of a failed one. A
    ConfigError (a bad config, not a bad trial) and KeyboardInterrupt propagate."""
    try:
        out = objective(*job)
    except ConfigError:
        raise
    except Exception as e:  # a diverged or crashed run: the trial fails, the search goes on
        message = " ".join(str(e).split()) or "(no message)"
        return None, {}, f"{type(e).__name__}: {message[:300]}"
    value, attrs = out if isinstance(out, tuple) else (out, {})
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None, {}, f"the objective is {value!r}, not a number"
    if not math.isfinite(value):
        return None, {}, f"the objective is {value} (a diverged run: the validation metric is not a number)"
    return value, dict(attrs), None


# ------------------------------------------------------------------------------------------------ locks
class _Lock:
    """An exclusive ``fcntl.flock`` on ``path`` (created with a ``host pid`` line for people); released by
    :meth:`release` or when the process ends, however it ends."""

    def __init__(self, path: str):
        self.path, self.fd = path, None

    def acquire(self, block: bool = True) -> bool:
        if fcntl is None:
            return True
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if block else fcntl.LOCK_NB))
        except BlockingIOError:
            os.close(fd)
            return False
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd
        os.ftruncate(fd, 0)
        os.write(fd, f"{socket.gethostname()} {os.getpid()}\n".encode())
        return True

    def release(self) -> None:
        if self.fd is not None:
            fd, self.fd = self.fd, None
            os.close(fd)  # closing the only descriptor releases the flock

    def held_elsewhere(self) -> bool:
        """True when another open description of the file (another live process) holds the lock; without
        ``fcntl`` always True (a stopped worker's trial is then resumed by the heartbeat rule alone)."""
        if fcntl is None:
            return True
        if not os.path.exists(self.path):
            return False
        if self.acquire(block=False):
            self.release()
            return False
        return True


@contextlib.contextmanager
def _locked(path: str) -> Iterator[None]:
    lock = _Lock(path)
    lock.acquire()
    try:
        yield
    finally:
        lock.release()


class _Heartbeat:
    """Record ``trial_id``'s heartbeat in ``storage`` every ``interval`` seconds from a thread, as ``Study.optimize``
    does (the loop here asks and tells itself, see :func:`_worker_loop`)."""

    def __init__(self, storage, trial_id: int, interval: float):
        self.storage, self.trial_id, self.interval = storage, trial_id, interval
        self.stop = threading.Event()
        self.storage.record_heartbeat(trial_id)
        self.thread = threading.Thread(target=self._beat, daemon=True, name=f"heartbeat of trial id {trial_id}")
        self.thread.start()

    def _beat(self) -> None:
        while not self.stop.wait(self.interval):
            try:
                self.storage.record_heartbeat(self.trial_id)
            except Exception:  # the database was busy beyond the timeout: the next beat tries again
                pass

    def close(self) -> None:
        self.stop.set()
        self.thread.join()


# ------------------------------------------------------------------------------------------------ the study
def run_search(
    config: Dict[str, Any],
    folder: str,
    sources: Optional[Dict[str, str]] = None,
    on_change: str = "stop",
    command: Optional[Sequence[str]] = None,
    log: Callable[..., None] = print,
    objective: Optional[Callable[[Dict[str, Any], str], Any]] = None,
) -> Dict[str, Any]:
    """Run (or resume, or join) the Optuna study of ``config``'s search markers in ``folder``.

    Args:
        config: merged config with ``~BAYESIAN~``-family markers and ``bayes_opt_iters``
            (``bayes_opt_max_failures_in_a_row`` optional).
        folder: the experiment folder (``study.db``, ``locks/`` and ``trial_<n>/`` go there).
        objective: ``(trial_config, trial_folder) -> value`` to maximise, or ``-> (value, user_attrs)``; default:
            run the config's protocol and return :func:`objective_value` with the :func:`untrained_folds`.

    Returns:
        ``{"n_trials", "bayes_opt_iters", "best": {"number", "value", "params", "folder", "untrained", ...},
        "trials": [...], "failed_trials": [numbers], "failures": [{"number", "reason"}], "stopped": None or
        {"rule", "trials", "message"}}`` (also written to ``search.json``).

    Raises:
        ConfigError: optuna not installed, no ``bayes_opt_iters``, bad ranges, a bad
            ``bayes_opt_max_failures_in_a_row``, or a config error inside a trial.
        KeyboardInterrupt: after leaving the running trial to be resumed (as SIGKILL would).

    Example (a stand-in objective instead of training)::

        >>> import tempfile
        >>> config = {"seed": 0, "bayes_opt_iters": 2, "margin~BAYESIAN~": [0.0, 1.0]}
        >>> summary = run_search(config, tempfile.mkdtemp(), objective=lambda cfg, folder: -abs(cfg["margin"] - 0.3),
        ...                      log=lambda *a: None)
        >>> summary["n_trials"], summary["failed_trials"], summary["best"]["folder"]
        (2, [], 'trial_1')
    """
    try:
        import optuna  # noqa: F401
    except ImportError:
        raise ConfigError(
            "search markers (~BAYESIAN~) need optuna, which is not installed "
            "(pip install optuna); replace the markers by fixed values"
        ) from None
    where = lambda key: (sources or {}).get(key, "command line")  # noqa: E731
    space = search_space(config)
    n_trials = config.get("bayes_opt_iters")
    if isinstance(n_trials, bool) or not isinstance(n_trials, int) or n_trials < 1:
        raise ConfigError(
            f"{where('bayes_opt_iters')}: bayes_opt_iters: the search "
            f"needs the number of trials, e.g. --bayes_opt_iters 20 (got {n_trials!r})"
        )
    max_failures = config.get("bayes_opt_max_failures_in_a_row", MAX_FAILURES_IN_A_ROW)
    if isinstance(max_failures, bool) or not isinstance(max_failures, int) or max_failures < 1:
        raise ConfigError(
            f"{where('bayes_opt_max_failures_in_a_row')}: bayes_opt_max_failures_in_a_row: expected a positive "
            f"number of trials, got {max_failures!r}"
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
    shared = _SharedStudy(folder, log)
    stopped = _worker_loop(shared, config, space, n_trials, max_failures, objective)
    summary = write_summary(shared.study, folder, n_trials=n_trials, stopped=stopped)
    dist_utils.broadcast_object(("done", summary))
    best = summary["best"]
    if best is not None and best.get("untrained"):
        log(f"search: {untrained_note(best)}")
    from ..outputs.report import write_report

    write_report(folder)  # shows results.md (the trials, best marked, failures) and search.png
    return summary


def _retry_callback(optuna) -> Tuple[str, Callable]:
    """Optuna's callback that queues a stale trial's parameters again (a WAITING copy with its user attributes, so
    its folder), and the ``RDBStorage`` argument that takes it."""
    retry = getattr(optuna.storages, "RetryHeartbeatStaleTrialCallback", None)
    if retry is None:  # Optuna < 4.9
        return "failed_trial_callback", optuna.storages.RetryFailedTrialCallback(max_retry=None)
    return "heartbeat_stale_trial_callback", retry(max_retry=None)


class _SharedStudy:
    """The study in ``<folder>/study.db`` as one worker sees it: created by the first worker (under the study lock,
    so that two workers starting together do not both create the tables), the trials that this worker's failure rule
    looks at (those created after it joined), and the steps a worker takes under the study lock."""

    def __init__(self, folder: str, log: Callable[..., None]):
        import optuna

        self.optuna, self.folder, self.log = optuna, folder, log
        os.makedirs(os.path.join(folder, LOCKS_FOLDER), exist_ok=True)
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        with self.lock(), warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            argument, self.retry = _retry_callback(optuna)
            self.storage = optuna.storages.RDBStorage(
                f"sqlite:///{os.path.abspath(os.path.join(folder, 'study.db'))}",
                engine_kwargs={"connect_args": {"timeout": SQLITE_TIMEOUT_S}},
                heartbeat_interval=HEARTBEAT_INTERVAL_S,
                grace_period=GRACE_PERIOD_S,
                **{argument: self.retry},
            )
            self.study = optuna.create_study(
                study_name=STUDY_NAME, storage=self.storage, direction="maximize", load_if_exists=True
            )
        self.study_id = self.storage.get_study_id_from_name(STUDY_NAME)
        self.joined_at = len(self.study.get_trials(deepcopy=False))

    def lock(self):
        """Held for the milliseconds a worker looks at the study and takes a trial: one worker at a time pops a
        queued trial (SQLite does not serialise Optuna's read-then-write there) and judges which workers are gone."""
        return _locked(os.path.join(self.folder, LOCKS_FOLDER, "study.lock"))

    def trial_lock(self, number: int) -> _Lock:
        """Held by the live worker that runs trial ``number``, from ask to tell."""
        return _Lock(os.path.join(self.folder, LOCKS_FOLDER, f"trial_{number}.worker.lock"))

    def folder_lock(self, name: str) -> _Lock:
        """Held by the one worker that writes the trial folder ``name``."""
        return _Lock(os.path.join(self.folder, LOCKS_FOLDER, f"{name}.folder.lock"))

    def trial_id(self, number: int) -> int:
        return self.storage.get_trial_id_from_study_id_trial_number(self.study_id, number)

    def recover(self) -> None:
        """Fail the RUNNING trials whose worker is gone and queue their parameters again, in their own folder: the
        worker process ended (its trial lock is free) or its heartbeat stopped (Optuna's ``fail_stale_trials``).
        Call under the study lock."""
        optuna = self.optuna
        for frozen in self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            if self.trial_lock(frozen.number).held_elsewhere():
                continue  # a live worker runs it
            trial_id = self.trial_id(frozen.number)
            try:
                if not self.storage.set_trial_state_values(trial_id, state=optuna.trial.TrialState.FAIL):
                    continue
            except optuna.exceptions.UpdateFinishedTrialError:
                continue
            self.log(
                f"trial {frozen.number}: its worker stopped (killed or interrupted); its parameters run again in "
                f"{trial_folder_name(frozen)}, resuming from its checkpoint"
            )
            self.retry(self.study, copy.deepcopy(self.storage.get_trial(trial_id)))
        failed = self.optuna.trial.TrialState.FAIL
        before = {t.number for t in self.study.get_trials(deepcopy=False, states=(failed,))}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(self.study)
        for t in self.study.get_trials(deepcopy=False, states=(failed,)):
            if t.number not in before:
                self.log(
                    f"trial {t.number}: no heartbeat for more than {GRACE_PERIOD_S} s; its parameters run again in "
                    f"{trial_folder_name(t)} once its worker, if still alive, lets go of the folder"
                )

    def failures_in_a_row(self, trials) -> List[int]:
        """The trials that failed (with a reason: not killed ones, which are resumed) after the last COMPLETE one,
        among the trials created since this worker joined, in the order they finished."""
        states = self.optuna.trial.TrialState
        ended = [
            t
            for t in trials
            if t.number >= self.joined_at
            and (t.state == states.COMPLETE or (t.state == states.FAIL and REASON_ATTR in t.user_attrs))
        ]
        out: List[int] = []
        for t in sorted(ended, key=lambda t: (t.datetime_complete, t.number)):
            out = [] if t.state == states.COMPLETE else out + [t.number]
        return out

    def start_trial(self, config, space) -> "_RunningTrial":
        """Ask for a trial (a queued copy first) and take its locks; call under the study lock."""
        with warnings.catch_warnings():
            # the heartbeat is recorded here as Study.optimize records it (see _Heartbeat)
            warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with")
            trial = self.study.ask()
        trial_lock = self.trial_lock(trial.number)
        trial_lock.acquire()  # a new number: free
        heartbeat = folder_lock = None
        try:
            heartbeat = _Heartbeat(self.storage, self.trial_id(trial.number), HEARTBEAT_INTERVAL_S)
            name = trial_folder_name(trial)  # a queued copy keeps its folder
            trial.set_user_attr(FOLDER_ATTR, name)
            seed = config.get("seed", 0)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", self.optuna.exceptions.ExperimentalWarning)
                # every trial draws with its own seed (config seed + trial number), whichever worker runs it
                self.study.sampler = self.optuna.samplers.TPESampler(
                    seed=None if seed is None else int(seed) + trial.number, constant_liar=True
                )
            values = suggest(trial, space)
            folder_lock = self.folder_lock(name)
            has_folder = folder_lock.acquire(block=False)
        except BaseException:
            if heartbeat is not None:
                heartbeat.close()
            trial_lock.release()
            raise
        return _RunningTrial(self, trial, name, values, trial_lock, folder_lock, has_folder, heartbeat)


class _RunningTrial:
    """One trial this worker runs: its locks and heartbeat, released however the trial ends."""

    def __init__(self, shared, trial, name, values, trial_lock, folder_lock, has_folder, heartbeat):
        self.shared, self.trial, self.name, self.values = shared, trial, name, values
        self.trial_lock, self.folder_lock, self.has_folder, self.heartbeat = (
            trial_lock,
            folder_lock,
            has_folder,
            heartbeat,
        )

    def run(self, config, space, objective) -> Optional[str]:
        """Run the objective in the trial folder and tell the study; returns the failure reason, if any. On
        KeyboardInterrupt the trial stays RUNNING with its locks released: the next look at the study resumes it
        exactly as after SIGKILL."""
        from ..experiment import distributed as dist_utils

        shared, trial, log = self.shared, self.trial, self.shared.log
        try:
            if not self.has_folder:
                log(f"trial {trial.number}: waiting for {self.name}: a worker that lost its heartbeat still writes it")
                while not self.folder_lock.acquire(block=False):
                    _wait()
            log(f"trial {trial.number}: " + ", ".join(f"{k}={v:.4g}" for k, v in self.values.items()))
            job = (fill(config, space, self.values), os.path.join(shared.folder, self.name))
            dist_utils.broadcast_object(("trial", job))  # under torchrun every rank trains the trial
            try:
                value, attrs, reason = _outcome(objective, job)
            except ConfigError as e:
                self._tell(None, {}, f"ConfigError: {e}")
                raise
            except KeyboardInterrupt:
                log(f"trial {trial.number}: interrupted; it resumes in {self.name} when the command runs again")
                raise
            self._tell(value, attrs, reason)
            return reason
        finally:
            self.heartbeat.close()
            self.folder_lock.release()
            self.trial_lock.release()

    def _tell(self, value, attrs, reason) -> None:
        optuna, trial, log = self.shared.optuna, self.trial, self.shared.log
        try:
            for key, v in attrs.items():
                trial.set_user_attr(key, v)
            if reason is not None:
                trial.set_user_attr(REASON_ATTR, reason)
            state = optuna.trial.TrialState.FAIL if reason is not None else optuna.trial.TrialState.COMPLETE
            told = self.shared.study.tell(trial, None if reason else value, state=state, skip_if_finished=True)
            taken_over = told.state != state
        except optuna.exceptions.UpdateFinishedTrialError:
            taken_over = True
        if taken_over:
            log(
                f"trial {trial.number}: finished, but another worker had failed it for a lost heartbeat; its queued "
                f"copy reads this run from {self.name}"
            )
        elif reason is not None:
            log(f"trial {trial.number} failed: {reason}")
        else:
            log(f"trial {trial.number}: objective {value:.4f}")


def _worker_loop(shared, config, space, n_trials, max_failures, objective) -> Optional[Dict[str, Any]]:
    """Take and run trials until ``n_trials`` are COMPLETE (waiting for other workers' running trials) or the failure
    rule stops the search; returns ``None`` or the stop record."""
    states = shared.optuna.trial.TrialState
    waiting_for = None
    while True:
        with shared.lock():
            shared.recover()
            trials = shared.study.get_trials(deepcopy=False)
            complete = sum(t.state == states.COMPLETE for t in trials)
            running = [t.number for t in trials if t.state == states.RUNNING]
            failures = shared.failures_in_a_row(trials)
            if len(failures) >= max_failures:
                last = next(t for t in trials if t.number == failures[-1])
                message = (
                    f"search stopped: {len(failures)} trials in a row failed (trials "
                    f"{', '.join(map(str, failures))}; trial {last.number}: {last.user_attrs[REASON_ATTR]}); "
                    f"{complete} of bayes_opt_iters={n_trials} trials COMPLETE; rerunning the command continues"
                )
                shared.log(message)
                rule = f"bayes_opt_max_failures_in_a_row={max_failures}"
                return {"rule": rule, "trials": failures, "message": message}
            if complete >= n_trials:
                return None
            job = None if complete + len(running) >= n_trials else shared.start_trial(config, space)
        if job is None:
            if running != waiting_for:
                shared.log(f"search: waiting for trial(s) {', '.join(map(str, running))} of other workers")
                waiting_for = running
            _wait()
            continue
        waiting_for = None
        job.run(config, space, objective)


def _wait() -> None:
    """Sleep :data:`POLL_S` while other workers run; under torchrun tell the other ranks to go on waiting (a
    collective every few seconds, so that their wait for the next trial never reaches the process group's timeout)."""
    from ..experiment import distributed as dist_utils

    dist_utils.broadcast_object(("wait", None))
    time.sleep(POLL_S)


def _follow_rank_0(objective) -> Dict[str, Any]:
    """Ranks other than 0 under torchrun: train every trial rank 0 sends, until it sends the summary. A trial that
    fails here fails on rank 0 too (the same run); a ConfigError propagates as there."""
    from ..experiment import distributed as dist_utils

    while True:
        kind, payload = dist_utils.broadcast_object(None)
        if kind == "done":
            return payload
        if kind == "trial":
            _outcome(objective, payload)
