"""~BAYESIAN~ markers run an Optuna study that survives SIGKILL: rerunning ends with exactly the requested trials."""

import json
import os
import re
import signal
import subprocess
import sys

import pytest

from pml_extensions.runner.config.search_space import fill, search_space
from pml_extensions.runner.errors import ConfigError, OutputError
from pml_extensions.runner.outputs.search_summary import write_summary
from tests.forked_process import ForkedScript

optuna = pytest.importorskip("optuna")
SCRIPT = os.path.join(os.path.dirname(__file__), "search_kill_script.py")


def _run(folder, kill_at):
    """The kill script in a child forked from this process (:class:`ForkedScript`), to its end: ``(returncode,
    output)``."""
    proc = ForkedScript(SCRIPT, folder, kill_at)
    out, _ = proc.communicate(timeout=120)
    return proc.returncode, out


def _run_in_process(script, *args):
    """Run ``script args`` in this process (a rerun that only resumes: no signal reaches it, so it needs no process of
    its own, and it saves a child's ~8 s of imports); returns its stdout. The script's signal handlers are undone."""
    import contextlib
    import io
    import runpy

    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    argv, out = sys.argv, io.StringIO()
    sys.argv = [script, *map(str, args)]
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_path(script, run_name="__main__")
    finally:
        sys.argv = argv
        for s, handler in handlers.items():
            signal.signal(s, handler)
    return out.getvalue()


@pytest.mark.slow
def test_study_killed_after_trial_2_resumes_to_exactly_4_trials(tmp_path):
    folder = str(tmp_path / "exp")
    returncode, out = _run(folder, 2)
    assert returncode == -9, out  # SIGKILL inside trial 2 (trials 0 and 1 finished)
    _run_in_process(SCRIPT, folder, -1)  # the rerun (it raises if it fails)
    study = optuna.load_study(study_name="search", storage=f"sqlite:///{folder}/study.db")
    states = [t.state.name for t in study.trials]
    assert states == ["COMPLETE", "COMPLETE", "FAIL", "COMPLETE", "COMPLETE"]  # trial 2 killed, re-queued as 3
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    params = [tuple(sorted(t.params.items())) for t in complete]
    assert len(set(params)) == 4  # no duplicated trial
    assert complete[2].params == study.trials[2].params  # the re-queued trial has the killed one's parameters
    assert [t.user_attrs["folder"] for t in complete] == ["trial_0", "trial_1", "trial_2", "trial_4"]
    calls = [line.split() for line in open(os.path.join(folder, "calls.txt"))]
    assert [c[0] for c in calls] == ["0", "1", "2", "2", "4"]  # trial 2's folder runs again (it resumes there)
    assert calls[2] == calls[3]  # the killed trial was finished with its own parameters
    summary = json.load(open(os.path.join(folder, "search.json")))
    best = max(complete, key=lambda t: t.value)
    assert summary["n_trials"] == 4 and summary["best"]["number"] == best.number
    assert summary["failed_trials"] == [2]  # the killed one, kept in the history
    assert os.path.isfile(os.path.join(folder, "search.png")) and os.path.isfile(os.path.join(folder, "study.db"))


def test_fill_replaces_markers_in_place():
    cfg = {"a": 1, "lr~LOG_BAYESIAN~": [0.1, 1.0], "n": {"k~INT_BAYESIAN~": [1, 4], "z": 0}}
    space = search_space(cfg)
    assert [(s[1], s[2]) for s in space] == [("lr", "LOG_BAYESIAN"), ("n.k", "INT_BAYESIAN")]
    out = fill(cfg, space, {"lr": 0.5, "n.k": 3})
    assert out == {"a": 1, "lr": 0.5, "n": {"k": 3, "z": 0}} and list(out) == ["a", "lr", "n"]


@pytest.mark.parametrize(
    "cfg, message",
    [
        ({"x~BAYESIAN~": [1, 0]}, r"expected \[low, high\] with low < high"),
        ({"x~LOG_BAYESIAN~": [0, 1]}, "and low > 0"),
        ({"x~INT_BAYESIAN~": [0.5, 2]}, "expected two integers"),
    ],
)
def test_bad_ranges(cfg, message):
    with pytest.raises(ConfigError, match=message):
        search_space(cfg)


def test_search_through_the_mlrc_protocol(tmp_path, tiny_mlrc_config):
    """Two real trials on the tiny config: each trial's objective is its run's aggregated validation metric."""
    from pml_extensions.runner.config.loader import parse_command_line
    from pml_extensions.runner.protocols import load_config
    from pml_extensions.runner.protocols.search import run_search

    root = tiny_mlrc_config
    argv = [
        "--bayes_opt_iters",
        "2",
        "--num_epochs_train",
        "1",
        "--num_training_sets",
        "1",
        "--optimizers~APPLY~3",
        "{lr~LOG_BAYESIAN~: [0.0001, 0.01]}",
    ]
    cfg, sources = load_config(root, None, parse_command_line(argv), allow_search=True, log=lambda *a: None)
    folder = str(tmp_path / "exp")
    summary = run_search(cfg, folder, sources, log=lambda *a: None)
    assert summary["n_trials"] == 2
    for trial in summary["trials"]:
        results = json.load(open(os.path.join(folder, trial["folder"], "results.json")))
        assert trial["value"] == results["aggregate"]["mean_average_precision_at_r"]
        saved = open(os.path.join(folder, trial["folder"], "config.yaml")).read()
        assert "BAYESIAN" not in saved and repr(trial["params"]["optimizers.trunk_optimizer.RMSprop.lr"])[:8] in saved
    assert "best: trial" in open(os.path.join(folder, "report.html")).read()
    best = json.load(open(os.path.join(folder, "search.json")))["best"]
    results = json.load(open(os.path.join(folder, best["folder"], "results.json")))
    assert best["test"] == summary["best"]["test"] == results["test"] and best["test"]  # {key: {metric: value}}


# ------------------------------------------------------------------------------------------ issue 22, item 1: counting
def _search(tmp_path, objective, n_trials, name="exp", **extra):
    """An in-process study on ``margin~BAYESIAN~`` with a stand-in objective; returns (summary, folder, log lines)."""
    from pml_extensions.runner.protocols.search import run_search

    lines = []
    config = {"seed": 0, "bayes_opt_iters": n_trials, "margin~BAYESIAN~": [0.0, 1.0], **extra}
    folder = str(tmp_path / name)
    summary = run_search(config, folder, {}, objective=objective, log=lambda *a: lines.append(" ".join(map(str, a))))
    return summary, folder, lines


def _trial_number(trial_folder):
    return int(trial_folder.rsplit("_", 1)[1])


def _study(folder):
    return optuna.load_study(study_name="search", storage=f"sqlite:///{folder}/study.db")


@pytest.mark.parametrize(
    "values, n_trials, complete, failed",
    [
        ([0.3, float("nan"), 0.5, 0.7], 3, [0, 2, 3], [1]),  # the issue's "COMPLETE: 2 failed: [1]"
        ([0.1, float("nan"), float("nan"), 0.2, 0.3, 0.4], 4, [0, 3, 4, 5], [1, 2]),  # "n_trials=3 failed=[1, 2]"
        ([float("inf"), 0.2, float("-inf"), 0.4], 2, [1, 3], [0, 2]),
    ],
)
def test_nan_and_inf_objectives_fail_with_their_reason_and_do_not_count(tmp_path, values, n_trials, complete, failed):
    summary, folder, _ = _search(tmp_path, lambda cfg, f: values[_trial_number(f)], n_trials)
    study = _study(folder)
    assert [t.number for t in study.trials if t.state.name == "COMPLETE"] == complete
    assert [t.number for t in study.trials if t.state.name == "FAIL"] == failed
    assert summary["n_trials"] == n_trials and summary["failed_trials"] == failed and summary["stopped"] is None
    for f in summary["failures"]:
        assert (
            f["reason"]
            == f"the objective is {values[f['number']]} (a diverged run: the validation metric is not a number)"
        )
    table = open(os.path.join(folder, "results.md")).read()
    assert f"{n_trials} COMPLETE trials of bayes_opt_iters={n_trials}" in table
    assert all(f"- trial {n}: the objective is {values[n]}" in table for n in failed)  # not silently left out
    assert json.load(open(os.path.join(folder, "search.json")))["failures"] == summary["failures"]


def test_the_best_trial_carries_its_runs_test_metrics(tmp_path):
    """search.json's best trial gains the ``"test"`` entry of its run's results.json (``{key: {metric: value}}``);
    the other trials' rows do not, and a best trial whose folder has no results.json adds nothing."""
    test = {"concatenated_8D": {"mean_average_precision_at_r": 0.5, "precision_at_1": 0.75}}

    def objective(cfg, trial_folder):
        n = _trial_number(trial_folder)
        os.makedirs(trial_folder, exist_ok=True)
        with open(os.path.join(trial_folder, "results.json"), "w") as f:
            json.dump({"test": {"concatenated_8D": {"precision_at_1": n / 10}}} if n != 1 else {"test": test}, f)
        return [0.2, 0.6, 0.4][n]

    summary, folder, _ = _search(tmp_path, objective, 3)
    assert summary["best"]["number"] == 1 and summary["best"]["test"] == test
    assert json.load(open(os.path.join(folder, "search.json")))["best"]["test"] == test
    assert all("test" not in row for row in summary["trials"])
    assert "| 1 (best) | 0.6000 |" in open(os.path.join(folder, "results.md")).read()
    with open(os.path.join(folder, summary["best"]["folder"], "results.json"), "w") as f:
        f.write('{"test": ')  # cut short: one line naming it, as the report reads it (it was skipped unsaid)
    with pytest.raises(OutputError, match=r"results.json: truncated or corrupt \(.*\); remove it and rerun"):
        write_summary(_study(folder), folder)
    summary, _, _ = _search(tmp_path, lambda cfg, f: cfg["margin"], 1, name="no_results")
    assert summary["best"]["number"] == 0 and "test" not in summary["best"]


def test_an_exception_in_a_trial_fails_it_with_its_reason_and_the_search_goes_on(tmp_path):
    def objective(cfg, trial_folder):
        if _trial_number(trial_folder) == 1:
            raise RuntimeError("the loss is nan\nat iteration 3")
        return cfg["margin"]

    summary, folder, lines = _search(tmp_path, objective, 2)
    assert [t.state.name for t in _study(folder).trials] == ["COMPLETE", "FAIL", "COMPLETE"]
    assert summary["failures"] == [{"number": 1, "reason": "RuntimeError: the loss is nan at iteration 3"}]
    assert "trial 1 failed: RuntimeError: the loss is nan at iteration 3" in lines


def test_failures_in_a_row_stop_the_search_in_one_line_and_a_rerun_continues(tmp_path):
    nan = float("nan")
    summary, folder, lines = _search(tmp_path, lambda cfg, f: nan, 4, bayes_opt_max_failures_in_a_row=3)
    stop = [line for line in lines if line.startswith("search stopped")]
    assert stop == [
        "search stopped: 3 trials in a row failed (trials 0, 1, 2; trial 2: the objective is nan (a diverged run: "
        "the validation metric is not a number)); 0 of bayes_opt_iters=4 trials COMPLETE; rerunning the command "
        "continues"
    ]
    assert summary["stopped"] == {"rule": "bayes_opt_max_failures_in_a_row=3", "trials": [0, 1, 2], "message": stop[0]}
    assert summary["best"] is None and summary["n_trials"] == 0
    assert json.load(open(os.path.join(folder, "search.json")))["stopped"]["trials"] == [0, 1, 2]
    assert stop[0] in open(os.path.join(folder, "results.md")).read()
    # the rerun (the cause fixed) counts its own failures afresh and ends with exactly bayes_opt_iters COMPLETE
    summary, _, _ = _search(tmp_path, lambda cfg, f: cfg["margin"], 4, bayes_opt_max_failures_in_a_row=3)
    assert summary["n_trials"] == 4 and summary["stopped"] is None and summary["failed_trials"] == [0, 1, 2]


def test_a_success_resets_the_failures_in_a_row(tmp_path):
    values = [float("nan"), float("nan"), 0.5, float("nan"), float("nan"), 0.6]
    summary, _, _ = _search(tmp_path, lambda cfg, f: values[_trial_number(f)], 2, bayes_opt_max_failures_in_a_row=3)
    assert summary["stopped"] is None and [r["number"] for r in summary["trials"]] == [2, 5]


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "3"])
def test_bad_max_failures_in_a_row_is_one_line(tmp_path, bad):
    with pytest.raises(ConfigError, match=r"^config: bayes_opt_max_failures_in_a_row: expected an integer >= 1"):
        _search(tmp_path, lambda cfg, f: 0.0, 2, bayes_opt_max_failures_in_a_row=bad)


def test_a_config_error_inside_a_trial_fails_it_and_stops_the_search(tmp_path):
    def objective(cfg, trial_folder):
        raise ConfigError("config_models/default.yaml: models.trunk: widths must be positive")

    with pytest.raises(ConfigError, match="widths must be positive"):
        _search(tmp_path, objective, 3)
    trials = _study(str(tmp_path / "exp")).trials
    assert [t.state.name for t in trials] == ["FAIL"]  # told, so a rerun does not resume it
    assert trials[0].user_attrs["fail_reason"].startswith("ConfigError: config_models/default.yaml")


def test_search_space_reaches_list_items():
    cfg = {
        "models": {
            "trunk": [
                {"ConvNetBody": {"widths": [16], "blocks_per_stage~INT_BAYESIAN~": [1, 2]}},
                {"AdaptiveAvgPool2d": [1]},
                [{"Deep": {"p~BAYESIAN~": [0.0, 0.5]}}],
            ]
        }
    }
    space = search_space(cfg)
    assert [(s[0], s[1], s[2]) for s in space] == [
        (("models", "trunk", 0, "ConvNetBody", "blocks_per_stage~INT_BAYESIAN~"),
         "models.trunk[0].ConvNetBody.blocks_per_stage", "INT_BAYESIAN"),
        (("models", "trunk", 2, 0, "Deep", "p~BAYESIAN~"), "models.trunk[2][0].Deep.p", "BAYESIAN"),
    ]  # fmt: skip
    out = fill(cfg, space, {"models.trunk[0].ConvNetBody.blocks_per_stage": 2, "models.trunk[2][0].Deep.p": 0.25})
    assert out["models"]["trunk"] == [
        {"ConvNetBody": {"widths": [16], "blocks_per_stage": 2}},
        {"AdaptiveAvgPool2d": [1]},
        [{"Deep": {"p": 0.25}}],
    ]
    assert "blocks_per_stage~INT_BAYESIAN~" in cfg["models"]["trunk"][0]["ConvNetBody"]  # the input is unchanged


#: the issue's input: every shipped trunk is a list, the marker sits in its first item
ISSUE_MODELS = (
    "{trunk~OVERRIDE~: [{ConvNetBody: {in_channels: 1, widths: [16, 32, 64], blocks_per_stage~INT_BAYESIAN~: [1, 2]}},"
    " {AdaptiveAvgPool2d: [1]}, {Flatten: null}]}"
)


def test_the_issues_list_item_marker_builds_each_trials_trunk():
    """``--models "{trunk~OVERRIDE~: [{ConvNetBody: {..., blocks_per_stage~INT_BAYESIAN~: [1, 2]}}, ...]}"`` on the
    shipped contrastive config: the marker is found and each value builds a trunk with that many blocks (it failed
    with ``unexpected keyword argument 'blocks_per_stage~INT_BAYESIAN~'``)."""
    import torch

    from pml_extensions.cli.run import _variant_selection
    from pml_extensions.runner.config.loader import find_config, parse_command_line
    from pml_extensions.runner.objects.builder import Builder
    from pml_extensions.runner.protocols import load_config

    root = find_config("contrastive")
    cfg, _ = load_config(
        root, _variant_selection(root, "quick", {}), parse_command_line(["--models", ISSUE_MODELS]), allow_search=True
    )
    space = search_space(cfg)
    assert [(s[1], s[2], s[3]) for s in space] == [
        ("models.trunk[0].ConvNetBody.blocks_per_stage", "INT_BAYESIAN", [1, 2])
    ]
    for blocks in (1, 2):
        trial_cfg = fill(cfg, space, {"models.trunk[0].ConvNetBody.blocks_per_stage": blocks})
        models = Builder(trial_cfg, log=lambda *a, **k: None).build_models(torch.zeros(1, 32, 32))
        convs = [m for m in models["trunk"].modules() if isinstance(m, torch.nn.Conv2d)]
        assert len(convs) == 3 * blocks


# ---------------------------------------------------------------------------------- issue 22, item 1: untrained flag
def test_a_best_trial_that_ties_the_untrained_score_is_flagged(tmp_path):
    """Both trials score 0.1456, the epoch-0 score of every fold: the output, search.json, results.md (the report's
    search section) and search.png say so."""
    summary, folder, lines = _search(tmp_path, lambda cfg, f: (0.1456, {"untrained_folds": [0, 1], "num_folds": 2}), 2)
    note = (
        "the best trial, 0 (objective 0.1456), ties the untrained model's score: epoch 0 stayed the best epoch of "
        "every fold, so training never beat the starting weights"
    )
    assert f"search: {note}" in lines
    assert summary["best"]["untrained"] is True and summary["best"]["untrained_folds"] == [0, 1]
    assert json.load(open(os.path.join(folder, "search.json")))["best"]["untrained"] is True
    assert f"FLAG: {note}." in open(os.path.join(folder, "results.md")).read()
    assert "FLAG: the best trial, 0" in open(os.path.join(folder, "report.html")).read()
    assert "| 0 (best) | 0.1456 | 2/2 |" in open(os.path.join(folder, "results.md")).read()


def test_a_trained_best_trial_is_not_flagged(tmp_path):
    def objective(cfg, trial_folder):
        n = _trial_number(trial_folder)
        return (
            (0.5, {"untrained_folds": [], "num_folds": 2})
            if n == 1
            else (0.1, {"untrained_folds": [0, 1], "num_folds": 2})
        )

    summary, folder, lines = _search(tmp_path, objective, 2)
    assert summary["best"]["number"] == 1 and summary["best"]["untrained"] is False
    assert [r["untrained"] for r in summary["trials"]] == [True, False]
    assert not any("untrained model's score" in line for line in lines)
    assert "FLAG" not in open(os.path.join(folder, "results.md")).read()


def test_untrained_flag_through_the_mlrc_protocol(tmp_path, tiny_mlrc_config):
    """A learning rate of at most 1e-30 leaves every weight unchanged, so epoch 0 stays the best epoch of each fold:
    the real protocol's trials are flagged, and the flag agrees with each trial's results.json."""
    from pml_extensions.runner.config.loader import parse_command_line
    from pml_extensions.runner.protocols import load_config
    from pml_extensions.runner.protocols.search import run_search

    argv = ["--bayes_opt_iters", "2", "--num_epochs_train", "1", "--num_training_sets", "2"]
    argv += ["--optimizers~APPLY~3", "{lr~BAYESIAN~: [0.0, 1.0e-30]}"]
    cfg, sources = load_config(tiny_mlrc_config, None, parse_command_line(argv), allow_search=True, log=lambda *a: None)
    lines = []
    summary = run_search(cfg, str(tmp_path / "exp"), sources, log=lambda *a: lines.append(" ".join(map(str, a))))
    for trial in summary["trials"]:
        results = json.load(open(tmp_path / "exp" / trial["folder"] / "results.json"))
        assert [f["best_epoch"] for f in results["folds"]] == [0, 0]
        assert trial["untrained"] is True and trial["untrained_folds"] == [0, 1] and trial["num_folds"] == 2
    assert any(line.startswith("search: the best trial,") for line in lines)


# ------------------------------------------------------------------------------- issue 22, item 2: interrupted trials
def test_a_keyboard_interrupt_leaves_the_trial_to_be_resumed_as_after_sigkill(tmp_path):
    """Ctrl-C inside trial 1 (it lost the trial: "Trial 1 failed with value None", never resumed, left out of
    results.md): the trial stays RUNNING, so the rerun resumes it with its parameters in its folder."""
    calls = []

    def objective(cfg, trial_folder):
        calls.append((os.path.basename(trial_folder), cfg["margin"]))
        if len(calls) == 2:
            raise KeyboardInterrupt
        return -abs(cfg["margin"] - 0.3)

    with pytest.raises(KeyboardInterrupt):
        _search(tmp_path, objective, 3)
    folder = str(tmp_path / "exp")
    assert [t.state.name for t in _study(folder).trials] == ["COMPLETE", "RUNNING"]  # as after SIGKILL
    summary, _, lines = _search(tmp_path, objective, 3)
    study = _study(folder)
    assert [t.state.name for t in study.trials] == ["COMPLETE", "FAIL", "COMPLETE", "COMPLETE"]
    assert [c[0] for c in calls] == ["trial_0", "trial_1", "trial_1", "trial_3"]
    assert calls[1] == calls[2] and study.trials[2].params == study.trials[1].params
    assert "trial 1: its worker stopped (killed or interrupted); its parameters run again in trial_1, resuming from " \
           "its checkpoint" in lines  # fmt: skip
    assert summary["failures"] == [{"number": 1, "reason": "its worker stopped; resumed as trial 2 in trial_1"}]
    assert (
        "- trial 1: its worker stopped; resumed as trial 2 in trial_1"
        in open(os.path.join(folder, "results.md")).read()
    )


# ---------------------------------------------------------------------------- issue 22, item 2: many workers, one study
WORKER = os.path.join(os.path.dirname(__file__), "search_worker_script.py")


def _worker(folder, n_trials, *flags):
    """A worker process started as a shell's background job (``cmd &``) starts it, with SIGINT ignored, whether or not
    pytest itself runs in one: the worker script sets the signal dispositions that the tests rely on. Forked from
    this process (:class:`ForkedScript`): a real process of its own, without a fresh interpreter's imports."""
    return ForkedScript(WORKER, folder, n_trials, *flags, sigint=signal.SIG_IGN)


def _wait_for(path, proc, timeout=120):
    import time

    deadline = time.time() + timeout
    while not os.path.exists(path) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert os.path.exists(path), proc.communicate(timeout=30)[0][-3000:] if proc.poll() is not None else "timeout"


def _steps(folder, name):
    """``[(pid, step)]`` of a trial folder's stand-in checkpoint, in the order written."""
    return [tuple(map(int, line.split())) for line in open(os.path.join(folder, name, "steps.txt"))]


def _calls(folder, kind):
    return [line.split()[1:] for line in open(os.path.join(folder, "calls.txt")) if line.startswith(kind + " ")]


@pytest.mark.slow
def test_two_workers_share_one_study_4_trials_in_4_folders(tmp_path):
    """Two processes started with the same command on one folder, both running a trial at once: 4 COMPLETE trials
    in 4 distinct folders, none failed or run twice, each folder written by one worker (it was two pids in
    ``trial_0`` and ``AssertionError: Should not reach.`` from Optuna)."""
    folder = str(tmp_path / "exp")
    workers = [_worker(folder, 4, "--gate") for _ in range(2)]
    outs = [w.communicate(timeout=300)[0] for w in workers]
    assert [w.returncode for w in workers] == [0, 0], "\n".join(o[-2000:] for o in outs)
    study = _study(folder)
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 4
    names = [t.user_attrs["folder"] for t in study.trials]
    assert sorted(names) == ["trial_0", "trial_1", "trial_2", "trial_3"]
    starts = _calls(folder, "start")
    assert sorted(s[1] for s in starts) == sorted(names)  # each folder started once
    pids = {str(w.pid) for w in workers}
    assert {s[0] for s in starts} == pids  # both workers ran trials
    for name in names:
        writers = {pid for pid, _ in _steps(folder, name)}
        assert len(writers) == 1 and [s for _, s in _steps(folder, name)] == list(range(6))
    summary = json.load(open(os.path.join(folder, "search.json")))
    assert summary["n_trials"] == 4 and summary["failed_trials"] == []


@pytest.mark.slow
def test_a_worker_killed_mid_trial_is_resumed_by_the_other(tmp_path):
    """SIGKILL one of two workers inside its trial: the live worker resumes that trial (same parameters, same
    folder, after its last checkpointed step) and the study ends with 4 COMPLETE trials."""
    folder = str(tmp_path / "exp")
    os.makedirs(folder)
    victim = _worker(folder, 4, "--hold")
    _wait_for(os.path.join(folder, "held"), victim)  # inside its first trial, after 2 of 6 steps
    victim.kill()
    victim.wait(timeout=30)
    out = _run_in_process(WORKER, folder, 4)  # the other worker, in this process (it raises if it fails)
    other_pid = os.getpid()
    held = open(os.path.join(folder, "held")).read().split()[0]
    study = _study(folder)
    states = [t.state.name for t in study.trials]
    assert states.count("COMPLETE") == 4 and states.count("FAIL") == 1
    killed = next(t for t in study.trials if t.state.name == "FAIL")
    copy_ = next(t for t in study.trials if t.system_attrs.get("failed_trial") == killed.number)
    assert copy_.state.name == "COMPLETE" and copy_.params == killed.params
    assert killed.user_attrs["folder"] == copy_.user_attrs["folder"] == held
    assert _steps(folder, held) == [(victim.pid, 0), (victim.pid, 1)] + [(other_pid, s) for s in range(2, 6)]
    assert f"trial {killed.number}: its worker stopped (killed or interrupted)" in out
    complete = [t.user_attrs["folder"] for t in study.trials if t.state.name == "COMPLETE"]
    assert len(set(complete)) == 4


@pytest.mark.slow
@pytest.mark.parametrize(
    "signum, flags",
    [
        (signal.SIGKILL, ()),
        (signal.SIGINT, ()),  # Ctrl-C: KeyboardInterrupt
        (signal.SIGTERM, ()),  # Python's default: the process ends at once
        (signal.SIGTERM, ("--sigterm-raises",)),  # the command line's Interrupted (a KeyboardInterrupt)
    ],
    ids=["SIGKILL", "SIGINT", "SIGTERM", "SIGTERM-raises"],
)
def test_a_signalled_worker_leaves_its_trial_to_be_resumed_as_sigkill_does(tmp_path, signum, flags):
    """Ctrl-C lost the trial ("Trial 1 failed with value None"; the rerun never resumed it and results.md left it
    out). Now every signal leaves it RUNNING; the rerun resumes it with its parameters, in its folder, after its last
    checkpointed step, and results.md lists it."""
    folder = str(tmp_path / "exp")
    os.makedirs(folder)
    first = _worker(folder, 3, "--hold", *flags)
    _wait_for(os.path.join(folder, "held"), first)
    first.send_signal(signum)
    out = first.communicate(timeout=60)[0]
    assert first.returncode != 0
    if signum == signal.SIGINT or flags:
        assert "trial 0: interrupted; it resumes in trial_0 when the command runs again" in out
    assert [t.state.name for t in _study(folder).trials] == ["RUNNING"]  # not FAIL: nothing is lost
    _run_in_process(WORKER, folder, 3)  # the rerun, in this process (it raises if it fails)
    study = _study(folder)
    assert [t.state.name for t in study.trials] == ["FAIL", "COMPLETE", "COMPLETE", "COMPLETE"]
    assert study.trials[1].params == study.trials[0].params and study.trials[1].user_attrs["folder"] == "trial_0"
    assert _steps(folder, "trial_0") == [(first.pid, 0), (first.pid, 1)] + [(os.getpid(), s) for s in range(2, 6)]
    assert (
        "- trial 0: its worker stopped; resumed as trial 1 in trial_0"
        in open(os.path.join(folder, "results.md")).read()
    )


@pytest.mark.slow
def test_ctrl_c_in_a_real_trial_resumes_its_training_from_the_checkpoint(tmp_path, capsys):
    """SIGINT inside epoch 2 of an mlrc trial; the rerun of the same command resumes that trial in its folder after
    epoch 1, and its logs equal those of an uninterrupted search (same seed, so the same trial parameters)."""
    import time

    from pml_extensions.cli.run import main
    from pml_extensions.runner.experiment.checkpoint import Checkpointer, load_weights
    from tests.runner.runner_testing_utils import RUNNER_TESTS, register_tiny, write_tiny_config

    progress = str(tmp_path / "progress.txt")
    root = write_tiny_config(
        str(tmp_path / "cfg"),
        {
            "config_dataset/default.yaml": f"""
dataset:
  TinyVectors: {{num_classes: 16, per_class: 8, sleep: 0.004, progress_file: {progress}}}
num_training_sets: 1
""",
            "config_general/default.yaml": """
trainer:
  MetricLossOnly:
    iterations_per_epoch: 6
    dataloader_num_workers: 0
    batch_size: 8
    set_min_label_to_zero: True
num_epochs_train: 3
save_interval: 1
patience: 10
seed: 0
device: cpu
""",
        },
    )
    search = ["--bayes_opt_iters", "1", "--loss_funcs~APPLY~3", "{neg_margin~BAYESIAN~: [0.5, 1.5]}"]

    def command(name):
        return [root] + search + ["--root_experiment_folder", str(tmp_path / "exp"), "--experiment_name", name]

    def start(name):  # a child forked from this process: a real process, without a fresh interpreter's imports
        return ForkedScript(os.path.join(RUNNER_TESTS, "runner_testing_utils.py"), *command(name))

    fold = str(tmp_path / "exp" / "stopped" / "trial_0" / "fold_0")
    proc = start("stopped")
    try:
        deadline, start_size = time.time() + 180, None
        while time.time() < deadline and proc.poll() is None:
            ckpt = os.path.join(fold, "checkpoint.pth")
            if start_size is None and os.path.exists(ckpt) and load_weights(ckpt)["epoch"] >= 1:
                start_size = os.path.getsize(progress)
            if start_size is not None and os.path.getsize(progress) - start_size >= 24:  # 3 of 6 batches of epoch 2
                proc.send_signal(signal.SIGINT)
                break
            time.sleep(0.005)
        out = proc.communicate(timeout=60)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0 and "trial 0: interrupted; it resumes in trial_0 when the command runs again" in out
    assert load_weights(os.path.join(fold, "checkpoint.pth"))["epoch"] == 1  # interrupted inside epoch 2
    # the rerun and the uninterrupted reference: the same command in this process (no signal reaches them)
    register_tiny()
    capsys.readouterr()
    assert main(command("stopped")) == 0
    out = "".join(capsys.readouterr())
    assert "trial 0: its worker stopped (killed or interrupted); its parameters run again in trial_0" in out
    assert "resuming after epoch 1" in out
    assert main(command("clean")) == 0
    stopped, fresh = _study(str(tmp_path / "exp" / "stopped")), _study(str(tmp_path / "exp" / "clean"))
    assert [t.state.name for t in stopped.trials] == ["FAIL", "COMPLETE"]
    assert stopped.trials[1].params == stopped.trials[0].params == fresh.trials[0].params
    assert stopped.trials[1].value == fresh.trials[0].value
    clean_fold = str(tmp_path / "exp" / "clean" / "trial_0" / "fold_0")
    got, want = (Checkpointer(f).rows("loss_histories") for f in (fold, clean_fold))
    assert [r["~iteration~"] for r in got] == [r["~iteration~"] for r in want] == list(range(1, 19))
    assert [r["total_loss"] for r in got] == pytest.approx([r["total_loss"] for r in want], rel=1e-5, abs=1e-6)


@pytest.mark.slow
def test_a_trial_whose_heartbeat_stopped_is_retried_without_a_second_writer(tmp_path):
    """A worker frozen (SIGSTOP) mid-trial loses its heartbeat: Optuna's stale-trial rule fails its trial and queues
    a copy, which the other worker takes but runs only once the frozen one, thawed, has finished writing the folder
    (its late result is refused in one line); the copy then reads the finished run."""
    import time

    folder = str(tmp_path / "exp")
    os.makedirs(folder)
    frozen = _worker(folder, 2, "--mark", "--fast-heartbeat")
    try:
        _wait_for(os.path.join(folder, "marked"), frozen)
        frozen.send_signal(signal.SIGSTOP)
        other = _worker(folder, 2, "--fast-heartbeat")
        deadline, copies = time.time() + 180, []
        while time.time() < deadline:
            trials = _study(folder).trials
            copies = [t for t in trials if t.system_attrs.get("failed_trial") == 0 and t.state.name == "RUNNING"]
            if trials[0].state.name == "FAIL" and copies:
                break  # trial 0 failed for its heartbeat; the other worker took its copy and waits for the folder
            time.sleep(0.2)
        assert copies, [t.state.name for t in trials]
        time.sleep(1.0)
    finally:
        frozen.send_signal(signal.SIGCONT)
    outs = [p.communicate(timeout=120)[0] for p in (frozen, other)]
    assert [frozen.returncode, other.returncode] == [0, 0], "\n".join(o[-2000:] for o in outs)
    study = _study(folder)
    assert sorted(t.state.name for t in study.trials) == ["COMPLETE", "COMPLETE", "FAIL"]
    copy_ = study.trials[copies[0].number]
    assert copy_.state.name == "COMPLETE" and copy_.params == study.trials[0].params
    assert copy_.user_attrs["folder"] == "trial_0" and copy_.value == -abs(copy_.params["margin"] - 0.3)
    assert _steps(folder, "trial_0") == [(frozen.pid, s) for s in range(6)]  # one writer
    calls = [line.split()[:3] for line in open(os.path.join(folder, "calls.txt"))]
    assert calls.index(["start", str(other.pid), "trial_0"]) > calls.index(["end", str(frozen.pid), "trial_0"])
    assert "trial 0: finished, but another worker had failed it for a lost heartbeat" in outs[0]
    assert "trial 0: no heartbeat for more than 6 s" in outs[1] and "waiting for trial_0" in outs[1]
    assert "trial 0: no heartbeat for more than 6 s" in outs[1] and "waiting for trial_0" in outs[1]


@pytest.mark.slow
def test_the_issues_list_item_marker_searches_through_the_command_line(tmp_path, capsys):
    """The issue's command, shortened to 2 trials of 2 iterations: both trials train (no ``unexpected keyword argument
    'blocks_per_stage~INT_BAYESIAN~'``) with an integer blocks_per_stage in their saved config."""
    import yaml

    from pml_extensions.cli.run import main

    argv = ["contrastive", "--variant", "quick", "--root_experiment_folder", str(tmp_path), "--bayes_opt_iters", "2"]
    argv += ["--num_epochs_train", "1", "--num_training_sets", "1", "--trainer~APPLY~2", "{iterations_per_epoch: 2}"]
    assert main(argv + ["--models", ISSUE_MODELS]) == 0
    out = capsys.readouterr().out
    folder = tmp_path / "contrastive_quick"
    study = _study(str(folder))
    assert [t.state.name for t in study.trials] == ["COMPLETE", "COMPLETE"]
    for t in study.trials:
        blocks = t.params["models.trunk[0].ConvNetBody.blocks_per_stage"]
        assert f"trial {t.number}: models.trunk[0].ConvNetBody.blocks_per_stage={blocks}" in out
        saved = yaml.safe_load(open(folder / t.user_attrs["folder"] / "config.yaml"))
        assert saved["models"]["trunk"][0]["ConvNetBody"]["blocks_per_stage"] == blocks in (1, 2)
    best = json.load(open(folder / "search.json"))["best"]  # the summary prints the best trial's test metrics
    key = next(k for k in best["test"] if k.startswith("concatenated_"))
    shown = ", ".join(f"{m}={v:.4f}" for m, v in best["test"][key].items())
    assert f"test {key}: {shown}\n" in out


@pytest.fixture(scope="module")
def torchrun_groups(tmp_path_factory):
    """Two ``torchrun`` groups of 2 gloo processes started with the same command (4 trials) on one folder: their
    return codes, their outputs and the study folder (one run serves both torchrun tests of this file)."""
    from tests.conftest import child_env
    from tests.runner.runner_testing_utils import RUNNER_TESTS, register_tiny, write_tiny_config

    tmp_path = tmp_path_factory.mktemp("torchrun_groups")
    register_tiny()
    root = write_tiny_config(
        str(tmp_path / "cfg"),
        {"config_dataset/default.yaml": "dataset:\n  TinyVectors: {num_classes: 16, per_class: 8, sleep: 0.01}\n"},
    )
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    command += [os.path.join(RUNNER_TESTS, "runner_testing_utils.py"), root, "--bayes_opt_iters", "4"]
    command += ["--num_epochs_train", "1", "--num_training_sets", "1", "--root_experiment_folder", str(tmp_path)]
    command += ["--optimizers~APPLY~3", "{lr~LOG_BAYESIAN~: [0.0001, 0.01]}"]
    groups = [
        subprocess.Popen(command, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for _ in range(2)
    ]
    try:
        outs = [g.communicate(timeout=600)[0] for g in groups]
    finally:
        for g in groups:
            if g.poll() is None:
                g.kill()
    return [g.returncode for g in groups], outs, tmp_path / "cfg"


@pytest.mark.slow
def test_search_under_torchrun_runs_each_trial_on_every_rank(torchrun_groups):
    """Two gloo processes per group: rank 0 drives the study and sends each trial to rank 1; both train it together,
    so the study has exactly bayes_opt_iters=4 trials (not 4 per rank) and each trial folder holds one run (the run
    of :func:`torchrun_groups`, which serves this test and the next: it was a torchrun of its own, 2 trials)."""
    returncodes, outs, folder = torchrun_groups
    assert returncodes == [0, 0], "\n".join(o[-3000:] for o in outs)
    study = optuna.load_study(study_name="search", storage=f"sqlite:///{folder}/study.db")
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 4
    summary = json.load(open(folder / "search.json"))
    for trial in summary["trials"]:
        results = json.load(open(folder / trial["folder"] / "results.json"))
        assert trial["value"] == results["aggregate"]["mean_average_precision_at_r"]


@pytest.mark.slow
def test_two_torchrun_groups_share_one_study(torchrun_groups):
    """Two ``torchrun`` groups of 2 gloo processes started with the same command on one folder: each group's rank 0 is
    one worker (its rank 1 trains each trial with it, and waits with it while the other group's last trial runs):
    4 COMPLETE trials in 4 folders, each with its run's results."""
    returncodes, outs, folder = torchrun_groups
    assert returncodes == [0, 0], "\n".join(o[-3000:] for o in outs)
    study = _study(str(folder))
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 4
    assert sorted(t.user_attrs["folder"] for t in study.trials) == ["trial_0", "trial_1", "trial_2", "trial_3"]
    for t in study.trials:
        results = json.load(open(folder / t.user_attrs["folder"] / "results.json"))
        assert t.value == results["aggregate"]["mean_average_precision_at_r"]
    ran = [{int(n) for n in re.findall(r"^trial (\d+): objective ", out, re.M)} for out in outs]  # rank 0 logs
    assert ran[0] and ran[1] and sorted(ran[0] | ran[1]) == [0, 1, 2, 3]  # both groups trained trials
