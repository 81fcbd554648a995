"""One worker of a shared study with a resumable stand-in for training (tests/runner/protocols/test_search.py).

``python search_worker_script.py FOLDER N_TRIALS [--gate] [--hold] [--mark] [--sigterm-raises] [--fast-heartbeat]``

Each trial "trains" 6 steps of 0.05 s; ``<trial folder>/steps.txt`` is its checkpoint (one ``pid step`` line per
step, written before the next starts), so a resumed trial continues after its last step. ``FOLDER/calls.txt``
gets ``start``/``end`` lines with the pid, the trial folder and the sampled margin.

--gate: the first step of each worker's first trial waits until two workers have started a trial (both run at once).
--hold: this worker's first trial stops after 2 steps, writes ``FOLDER/held`` and sleeps until a signal ends it.
--mark: this worker's first trial writes ``FOLDER/marked`` after 2 steps and goes on (a test may SIGSTOP it there).
--sigterm-raises: SIGTERM raises KeyboardInterrupt (what the command line does with it, issue 21's ``Interrupted``).
--fast-heartbeat: heartbeats every second, a trial is stale after 6 s without one.
"""

import os
import signal
import sys
import time

from pml_extensions.runner.protocols import search
from pml_extensions.runner.protocols.search import run_search

folder, n_trials = sys.argv[1], int(sys.argv[2])
flags = set(sys.argv[3:])
# the signals the tests send act here whatever this process inherited: a shell's background job (`cmd &`) starts its
# children with SIGINT ignored, and Python then installs no KeyboardInterrupt handler
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.signal(signal.SIGTERM, signal.SIG_DFL)
if "--fast-heartbeat" in flags:
    search.HEARTBEAT_INTERVAL_S, search.GRACE_PERIOD_S, search.POLL_S = 1, 6, 0.2
if "--sigterm-raises" in flags:

    def _raise(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, _raise)
config = {"seed": 0, "bayes_opt_iters": n_trials, "margin~BAYESIAN~": [0.0, 1.0]}
first = [True]


def _append(path, line):
    with open(path, "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def _starts():
    path = os.path.join(folder, "calls.txt")
    lines = open(path).read().split("\n") if os.path.exists(path) else []
    return {line.split()[1] for line in lines if line.startswith("start ")}


def objective(cfg, trial_folder):
    os.makedirs(trial_folder, exist_ok=True)
    pid, name = os.getpid(), os.path.basename(trial_folder)
    _append(os.path.join(folder, "calls.txt"), f"start {pid} {name} {cfg['margin']!r}")
    steps_path = os.path.join(trial_folder, "steps.txt")
    done = len(open(steps_path).read().split("\n")) - 1 if os.path.exists(steps_path) else 0
    is_first, first[0] = first[0], False
    if is_first and "--gate" in flags:
        deadline = time.time() + 120
        while len(_starts()) < 2 and time.time() < deadline:
            time.sleep(0.05)
    for step in range(done, 6):
        if is_first and "--hold" in flags and step == 2:
            _append(os.path.join(folder, "held"), name)
            while True:
                time.sleep(1)
        if is_first and "--mark" in flags and step == 2:
            _append(os.path.join(folder, "marked"), name)
        time.sleep(0.05)
        _append(steps_path, f"{pid} {step}")
    _append(os.path.join(folder, "calls.txt"), f"end {pid} {name}")
    return -abs(cfg["margin"] - 0.3)


run_search(config, folder, {}, objective=objective)
