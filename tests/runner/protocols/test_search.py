"""~BAYESIAN~ markers run an Optuna study that survives SIGKILL: rerunning ends with exactly the requested trials."""

import json
import os
import subprocess
import sys

import pytest

from pml_extensions.runner.errors import ConfigError
from pml_extensions.runner.protocols.search import fill, search_space

optuna = pytest.importorskip("optuna")
SCRIPT = os.path.join(os.path.dirname(__file__), "search_kill_script.py")


def _run(folder, kill_at, env):
    return subprocess.run([sys.executable, SCRIPT, folder, str(kill_at)], env=env, capture_output=True, timeout=120)


@pytest.mark.slow
def test_study_killed_after_trial_2_resumes_to_exactly_4_trials(tmp_path, subprocess_env):
    folder = str(tmp_path / "exp")
    first = _run(folder, 2, subprocess_env)
    assert first.returncode == -9  # SIGKILL inside trial 2 (trials 0 and 1 finished)
    second = _run(folder, -1, subprocess_env)
    assert second.returncode == 0, second.stderr.decode()[-500:]
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
    from pml_extensions.runner.config.loader import load_config, parse_command_line
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


@pytest.mark.slow
def test_search_under_torchrun_runs_each_trial_on_every_rank(tmp_path, tiny_mlrc_config, subprocess_env):
    """Two gloo processes: rank 0 drives the study and sends each trial to rank 1; both train it together, so the
    study has exactly 2 trials (not 2 per rank) and each trial folder holds one run."""
    from tests.runner.runner_testing_utils import RUNNER_TESTS

    root, env = tiny_mlrc_config, subprocess_env
    script = os.path.join(RUNNER_TESTS, "runner_testing_utils.py")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "2",
            script,
            root,
            "--bayes_opt_iters",
            "2",
            "--num_epochs_train",
            "1",
            "--num_training_sets",
            "1",
            "--check_untrained_accuracy",
            "false",
            "--optimizers~APPLY~3",
            "{lr~LOG_BAYESIAN~: [0.0001, 0.01]}",
            "--root_experiment_folder",
            str(tmp_path / "exp"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    folder = tmp_path / "exp" / "cfg"
    study = optuna.load_study(study_name="search", storage=f"sqlite:///{folder}/study.db")
    assert [t.state.name for t in study.trials] == ["COMPLETE", "COMPLETE"]
    summary = json.load(open(folder / "search.json"))
    for trial in summary["trials"]:
        results = json.load(open(folder / trial["folder"] / "results.json"))
        assert trial["value"] == results["aggregate"]["mean_average_precision_at_r"]
