"""runner/protocols/reproduce.py: --reproduce reruns a finished experiment from its config.yaml and compares every
number."""

import json
import os

import pytest

from pml_extensions.runner.errors import ConfigError
from pml_extensions.runner.protocols import run_protocol
from tests.runner.protocols.test_run_protocol import QUIET, _config


def test_reproduce_gives_the_same_metrics_exactly(tmp_path):
    from pml_extensions.runner.protocols.reproduce import main, reproduce

    folder = str(tmp_path / "exp")
    cfg, sources = _config(tmp_path, ["--num_epochs_train", "2", "--seed", "5"])
    first = run_protocol(cfg, folder, sources, **QUIET)
    outcome = reproduce(folder, **QUIET)
    assert outcome == {
        "run_folder": folder,
        "output_folder": folder + "_reproduced",
        "equal": True,
        "differences": [],
    }
    again = json.load(open(os.path.join(folder + "_reproduced", "results.json")))
    assert again["test"] == json.loads(json.dumps(first["test"]))
    assert again["test"]["separate_8D"]["mean_average_precision_at_r"] > 0  # real numbers were compared
    # a doctored original is caught
    doctored = json.load(open(os.path.join(folder, "results.json")))
    doctored["test"]["separate_8D"]["precision_at_1"] += 0.25
    json.dump(doctored, open(os.path.join(folder, "results.json"), "w"))
    assert main(folder, str(tmp_path / "again")) == 1
    with pytest.raises(ConfigError, match="not a finished experiment folder"):
        reproduce(str(tmp_path / "nothing_here"))


def test_reproduce_reruns_with_the_recorded_thread_count(tmp_path, monkeypatch):
    """environment.json records torch's thread count; --reproduce reruns with it (CPU sums split by thread)
    and gives this process its own count back."""
    import torch

    from pml_extensions.runner.experiment.folder import ENVIRONMENT_NAME, prepare_folder
    from pml_extensions.runner.protocols import reproduce as rep

    folder = str(tmp_path / "exp")
    prepare_folder(folder, {"protocol": "mlrc"}, **QUIET)
    env = json.load(open(os.path.join(folder, ENVIRONMENT_NAME)))
    assert env["torch_threads"] == torch.get_num_threads() and env["torch"] == torch.__version__
    env["torch_threads"] = torch.get_num_threads() + 1
    json.dump(env, open(os.path.join(folder, ENVIRONMENT_NAME), "w"))
    json.dump({"x": 1.0}, open(os.path.join(folder, "results.json"), "w"))
    seen = []

    def fake_run(config, out, **kwargs):
        seen.append(torch.get_num_threads())
        os.makedirs(out, exist_ok=True)
        json.dump({"x": 1.0}, open(os.path.join(out, "results.json"), "w"))

    monkeypatch.setattr("pml_extensions.runner.protocols.run_protocol", fake_run)
    before = torch.get_num_threads()
    assert rep.reproduce(folder, **QUIET)["equal"]
    assert seen == [before + 1] and torch.get_num_threads() == before
