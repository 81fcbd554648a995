"""Hyper-parameter search: powerful-benchmarker's ``~BAYESIAN~`` markers run an Optuna study in
``<experiment>/study.db`` (optional extra ``pip install pml_extensions[search]``), one protocol run per trial in
``trial_<n>/``, shared by any number of workers; the contract (workers, torchrun, locks, retries, outputs) is
docs/search.md.
"""

import functools
import math
import os
import socket
import time
import warnings
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..config.search_space import fill, search_space, suggest
from ..errors import ConfigError
from ..experiment import distributed as dist_utils
from ..experiment.folder import prepare_folder
from ..outputs import search_summary as outputs
from ..outputs.report import write_report
from . import protocol_of
from .base import Protocol, SearchSettings, read_settings

try:  # POSIX
    import fcntl
except ImportError:  # pragma: no cover - Windows: no lock files, one worker per study
    fcntl = None
try:  # the optional extra [search]
    import optuna
    from optuna.trial import TrialState
except ImportError:  # pragma: no cover - refused by run_search
    optuna = None

STUDY_NAME = "search"
#: seconds between two heartbeats of a running trial (Optuna's ``RDBStorage(heartbeat_interval=...)``)
HEARTBEAT_INTERVAL_S = 10
#: seconds without a heartbeat after which a running trial is failed and queued again (``grace_period``)
GRACE_PERIOD_S = 120
#: seconds a worker waits for the SQLite database while another worker writes it (sqlite3's busy timeout)
SQLITE_TIMEOUT_S = 60
#: seconds between two looks at the study while other workers' trials run
POLL_S = 2.0
LOCKS_FOLDER = "locks"


def untrained_folds(results: Dict[str, Any]) -> List[int]:
    """The folds of an mlrc run whose best epoch is 0: the untrained model was never beaten there (a tie does not
    replace it), so the fold's validation score is the untrained score.

    Example::

        >>> untrained_folds({"folds": [{"best_epoch": 0}, {"best_epoch": 3}]})
        [0]
    """
    return [k for k, fold in enumerate(results.get("folds") or []) if fold.get("best_epoch") == 0]


def _protocol_objective(sources, on_change, command, log, trial_config, trial_folder) -> Tuple[float, Dict[str, Any]]:
    """The default objective: the protocol's (validation) objective of the trial's run."""
    from . import run_protocol

    results = run_protocol(trial_config, trial_folder, sources, log=log, on_change=on_change, command=command)
    info = {outputs.UNTRAINED_ATTR: untrained_folds(results), outputs.FOLDS_ATTR: len(results.get("folds") or [])}
    return protocol_of(trial_config).objective(results, trial_config), info


def _outcome(objective, job) -> Tuple[Optional[float], Dict[str, Any], Optional[str]]:
    """``(value, user attributes, None)`` or ``(None, {}, reason)``; ConfigError and KeyboardInterrupt propagate."""
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


class _LeftUntold(BaseException):
    """Raised through ``Study.optimize`` (which tells FAIL on ``Exception`` and ``KeyboardInterrupt``) to leave the
    trial as the storage has it: RUNNING after Ctrl-C (resumed as after SIGKILL), or failed by another worker."""

    def __init__(self, interrupt: Optional[KeyboardInterrupt] = None):
        super().__init__()
        self.interrupt = interrupt


class _Lock:
    """An exclusive ``fcntl.flock`` on ``<folder>/locks/<name>.lock`` (with a ``host pid`` line for people), held until
    :meth:`release` or the process ends, however it ends; acquiring a lock this object holds is a no-op."""

    def __init__(self, folder: str, name: str):
        self.path, self.fd = os.path.join(folder, LOCKS_FOLDER, f"{name}.lock"), None

    def acquire(self, block: bool = True) -> bool:
        if fcntl is None or self.fd is not None:
            return True
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if block else fcntl.LOCK_NB))
        except BaseException as e:
            os.close(fd)
            if isinstance(e, BlockingIOError):
                return False
            raise
        self.fd = fd
        os.ftruncate(fd, 0)
        os.write(fd, f"{socket.gethostname()} {os.getpid()}\n".encode())
        return True

    def release(self) -> None:
        if self.fd is not None:
            fd, self.fd = self.fd, None
            os.close(fd)  # closing the only descriptor releases the flock


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
            run the config's protocol and return its objective with the :func:`untrained_folds`.

    Returns:
        the ``search.json`` summary (docs/search.md): ``{"n_trials", "bayes_opt_iters", "best", "trials",
        "failed_trials", "failures", "stopped"}``.

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
    if optuna is None:
        raise ConfigError(
            "search markers (~BAYESIAN~) need optuna, which is not installed "
            "(pip install optuna); replace the markers by fixed values"
        )
    space = search_space(config)
    settings = read_settings(SearchSettings, config, sources)  # the keys' one check (the loader ran it too)
    n_trials, max_failures = settings.bayes_opt_iters, settings.bayes_opt_max_failures_in_a_row
    if n_trials is None:
        raise ConfigError(
            f"{(sources or {}).get('bayes_opt_iters', 'command line')}: bayes_opt_iters: the search needs the number "
            "of trials, e.g. --bayes_opt_iters 20"
        )
    protocol = protocol_of(config, sources)
    if objective is None and protocol.objective.__func__ is Protocol.objective.__func__:
        raise ConfigError(
            f"{(sources or {}).get('protocol', 'config')}: protocol: the search optimises a protocol's validation "
            f"objective; the {protocol.name} protocol has none"
        )
    prepare_folder(folder, config, on_change=on_change, command=command, log=log)
    objective = objective or functools.partial(_protocol_objective, sources, on_change, command, log)
    if not dist_utils.is_main():
        return _follow_rank_0(objective)
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.ERROR)  # our own lines say how each trial ended
    try:
        with warnings.catch_warnings():  # heartbeats, retries and fail_stale_trials are "experimental" in Optuna
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            worker = _Worker(folder, config, space, n_trials, max_failures, objective, log)
            stopped = worker.run()
    finally:
        optuna.logging.set_verbosity(verbosity)
    summary = outputs.write_summary(worker.study, folder, n_trials=n_trials, stopped=stopped)
    dist_utils.broadcast_object(("done", summary))
    best = summary["best"]
    if best is not None and best.get("untrained"):
        log(f"search: {outputs.untrained_note(best)}")
    write_report(folder)  # shows results.md (the trials, best marked, failures) and search.png
    return summary


class _Worker:
    """One worker of the study: ``Study.optimize``'s objective and callback; ``locks/study.lock`` is held from the look
    at the study to the start of the trial it asks for (SQLite does not serialise Optuna's pop of a queued trial)."""

    def __init__(self, folder, config, space, n_trials, max_failures, objective, log):
        self.folder, self.config, self.space, self.objective, self.log = folder, config, space, objective, log
        self.n_trials, self.max_failures, self.stopped = n_trials, max_failures, None
        self.failures: List[int] = []  # this worker's trials failed since its last COMPLETE one
        self.trial_lock: Optional[_Lock] = None  # held by the live worker of a trial, from ask to tell
        os.makedirs(os.path.join(folder, LOCKS_FOLDER), exist_ok=True)
        self.study_lock = _Lock(self.folder, "study")
        self.study_lock.acquire()  # two workers starting together do not both create the tables
        try:
            retry = getattr(optuna.storages, "RetryHeartbeatStaleTrialCallback", None)  # Optuna >= 4.9
            argument = "heartbeat_stale_trial_callback" if retry else "failed_trial_callback"
            self.retry = (retry or optuna.storages.RetryFailedTrialCallback)(max_retry=None)
            self.storage = optuna.storages.RDBStorage(
                f"sqlite:///{os.path.abspath(os.path.join(folder, 'study.db'))}",
                engine_kwargs={"connect_args": {"timeout": SQLITE_TIMEOUT_S}},
                heartbeat_interval=HEARTBEAT_INTERVAL_S,
                grace_period=GRACE_PERIOD_S,
                **{argument: lambda study, trial: self._requeue(study, trial, stale=True)},
            )
            self.study = optuna.create_study(
                study_name=STUDY_NAME, storage=self.storage, direction="maximize", load_if_exists=True
            )
        finally:
            self.study_lock.release()
        self.study_id = self.storage.get_study_id_from_name(STUDY_NAME)
        self.max_trials = optuna.study.MaxTrialsCallback(n_trials, states=(TrialState.COMPLETE, TrialState.RUNNING))

    def run(self) -> Optional[Dict[str, Any]]:
        """Trials until ``n_trials`` are COMPLETE (waiting for other workers' ones) or the failure rule stops."""
        waiting_for = None
        try:
            while self.stopped is None:
                self._look()
                trials = self.study.get_trials(deepcopy=False)
                complete = sum(t.state == TrialState.COMPLETE for t in trials)
                running = [t.number for t in trials if t.state == TrialState.RUNNING]
                if complete >= self.n_trials:
                    break
                if complete + len(running) >= self.n_trials:
                    self.study_lock.release()
                    if running != waiting_for:
                        self.log(f"search: waiting for trial(s) {', '.join(map(str, running))} of other workers")
                        waiting_for = running
                    _wait()
                    continue
                waiting_for = None
                try:
                    self.study.optimize(self._run_trial, callbacks=[self._after_trial, self.max_trials])
                except _LeftUntold as left:
                    if left.interrupt is not None:
                        raise left.interrupt from None
                finally:
                    self.study_lock.release()
                    if self.trial_lock is not None:
                        self.trial_lock.release()
        finally:
            self.study_lock.release()
        return self.stopped

    def _look(self) -> None:
        """Take the study lock (until the next trial starts) and fail and queue again each RUNNING trial whose worker
        is gone: its trial lock is free, or its heartbeat stopped (Optuna's ``fail_stale_trials``)."""
        self.study_lock.acquire()
        for frozen in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            lock = _Lock(self.folder, f"trial_{frozen.number}.worker")
            if fcntl is None or (os.path.exists(lock.path) and not lock.acquire(block=False)):
                continue  # a live worker runs it (without fcntl: left to the heartbeat rule)
            lock.release()
            trial_id = self.storage.get_trial_id_from_study_id_trial_number(self.study_id, frozen.number)
            try:
                if not self.storage.set_trial_state_values(trial_id, state=TrialState.FAIL):
                    continue
            except optuna.exceptions.UpdateFinishedTrialError:
                continue
            self._requeue(self.study, self.storage.get_trial(trial_id), stale=False)
        optuna.storages.fail_stale_trials(self.study)

    def _requeue(self, study, trial, stale: bool) -> None:
        """Queue a failed trial's parameters again (a WAITING copy with its user attributes, so its folder)."""
        name = outputs.trial_folder_name(trial)
        why = (
            f"no heartbeat for more than {GRACE_PERIOD_S} s; its parameters run again in {name} once its worker, if "
            "still alive, lets go of the folder"
            if stale
            else f"its worker stopped (killed or interrupted); its parameters run again in {name}, resuming from its "
            "checkpoint"
        )
        self.log(f"trial {trial.number}: {why}")
        self.retry(study, trial)

    def _run_trial(self, trial) -> float:
        """``Study.optimize``'s objective: the trial's run in its folder (a queued copy keeps it), the folder locked."""
        self.trial_lock = _Lock(self.folder, f"trial_{trial.number}.worker")
        self.trial_lock.acquire()  # a new number: free; taken before the study lock goes, so no one resumes it
        self.study_lock.release()
        name = outputs.trial_folder_name(trial)
        trial.set_user_attr(outputs.FOLDER_ATTR, name)
        seed = self.config.get("seed", 0)  # every trial draws with its own seed, whichever worker runs it
        seed = None if seed is None else int(seed) + trial.number
        self.study.sampler = optuna.samplers.TPESampler(seed=seed, constant_liar=True)
        values = suggest(trial, self.space)
        folder_lock = _Lock(self.folder, f"{name}.folder")
        try:
            if not folder_lock.acquire(block=False):
                self.log(f"trial {trial.number}: waiting for {name}: a worker that lost its heartbeat still writes it")
                while not folder_lock.acquire(block=False):
                    _wait()
            self.log(f"trial {trial.number}: " + ", ".join(f"{k}={v:.4g}" for k, v in values.items()))
            job = (fill(self.config, self.space, values), os.path.join(self.folder, name))
            dist_utils.broadcast_object(("trial", job))
            try:
                value, attrs, reason = _outcome(self.objective, job)
            except ConfigError as e:  # Study.optimize tells FAIL and re-raises it: the search stops
                trial.set_user_attr(outputs.REASON_ATTR, f"ConfigError: {e}")
                self.log(f"trial {trial.number} failed: ConfigError: {e}")
                raise
            except KeyboardInterrupt as e:
                self.log(f"trial {trial.number}: interrupted; it resumes in {name} when the command runs again")
                raise _LeftUntold(e) from None
        finally:
            folder_lock.release()
        trial_id = self.storage.get_trial_id_from_study_id_trial_number(self.study_id, trial.number)
        if self.storage.get_trial(trial_id).state != TrialState.RUNNING:
            self.log(
                f"trial {trial.number}: finished, but another worker had failed it for a lost heartbeat; its queued "
                f"copy reads this run from {name}"
            )
            raise _LeftUntold()
        for key, v in attrs.items():
            trial.set_user_attr(key, v)
        if reason is not None:
            trial.set_user_attr(outputs.REASON_ATTR, reason)
            self.log(f"trial {trial.number} failed: {reason}")
            return math.nan  # Study.optimize records FAIL and goes on
        self.log(f"trial {trial.number}: objective {value:.4f}")
        return value

    def _after_trial(self, study, trial) -> None:
        """``Study.optimize``'s first callback: the failure rule; then the look for abandoned trials, under the study
        lock, before Optuna's ``MaxTrialsCallback`` (COMPLETE and running trials) and the next trial."""
        self.trial_lock.release()  # told
        complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        self.failures = [] if trial.state == TrialState.COMPLETE else self.failures + [trial.number]
        if len(self.failures) >= self.max_failures:
            message = (
                f"search stopped: {len(self.failures)} trials in a row failed (trials "
                f"{', '.join(map(str, self.failures))}; trial {trial.number}: "
                f"{trial.user_attrs[outputs.REASON_ATTR]}); {len(complete)} of bayes_opt_iters={self.n_trials} trials "
                "COMPLETE; rerunning the command continues"
            )
            self.log(message)
            rule = f"bayes_opt_max_failures_in_a_row={self.max_failures}"
            self.stopped = {"rule": rule, "trials": self.failures, "message": message}
            study.stop()
        else:
            self._look()


def _wait() -> None:
    """Sleep :data:`POLL_S`; under torchrun tell the other ranks to go on waiting (a collective every few seconds, so
    that their wait for the next trial never reaches the process group's timeout)."""
    dist_utils.broadcast_object(("wait", None))
    time.sleep(POLL_S)


def _follow_rank_0(objective) -> Dict[str, Any]:
    """Ranks other than 0 under torchrun: train every trial rank 0 sends, until it sends the summary."""
    while True:
        kind, payload = dist_utils.broadcast_object(None)
        if kind == "done":
            return payload
        if kind == "trial":
            _outcome(objective, payload)
