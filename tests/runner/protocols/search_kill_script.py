"""Run a 4-trial study with a tiny objective; with KILL_AT=n the process SIGKILLs itself inside trial n."""

import os
import signal
import sys

from pml_extensions.runner.protocols.search import run_search

folder, kill_at = sys.argv[1], int(sys.argv[2])
config = {
    "seed": 0,
    "bayes_opt_iters": 4,
    "margin~BAYESIAN~": [0.0, 1.0],
    "optimizers": {"trunk_optimizer": {"Adam": {"lr~LOG_BAYESIAN~": [1e-4, 1e-1]}}},
}


def objective(cfg, trial_folder):
    n = int(trial_folder.rsplit("_", 1)[1])
    with open(os.path.join(folder, "calls.txt"), "a") as f:
        f.write(f"{n} {cfg['margin']!r} {cfg['optimizers']['trunk_optimizer']['Adam']['lr']!r}\n")
    if n == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)
    return -abs(cfg["margin"] - 0.3)


run_search(config, folder, {}, objective=objective, log=lambda *a: None)
