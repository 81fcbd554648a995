"""runner/experiment/folder.py: the experiment folder (saved config, resume check), device, seeds and stages."""

import os

import pytest

from pml_extensions.runner.errors import ConfigError

QUIET = dict(log=lambda *a, **k: None)


def test_a_folder_that_trained_nothing_takes_the_new_config(tmp_path):
    from pml_extensions.runner.experiment.folder import prepare_folder

    folder = str(tmp_path / "exp")
    prepare_folder(folder, {"a": 1}, **QUIET)  # e.g. the run then stopped at a config error
    prepare_folder(folder, {"a": 2}, **QUIET)
    assert "a: 2" in open(os.path.join(folder, "config.yaml")).read()
    open(os.path.join(folder, "results.json"), "w").write("{}")
    with pytest.raises(ConfigError, match=r"differs from this run's config in a;"):
        prepare_folder(folder, {"a": 3}, **QUIET)


def test_config_differences_are_dotted_keys():
    from pml_extensions.runner.experiment.folder import config_differences

    old = {"a": 1, "b": {"c": 2, "d": [1, 2]}, "e": 0}
    new = {"a": 1, "b": {"c": 3, "d": [1, 2]}, "f": 0}
    assert config_differences(old, new) == ["b.c", "e", "f"]
    assert config_differences(old, old) == []


def test_device_names_the_key():
    import torch

    from pml_extensions.runner.experiment.folder import select_device

    assert select_device("cpu") == torch.device("cpu")
    with pytest.raises(ConfigError, match=r"^config_general.yaml: device: .*"):
        select_device("nonsense:x", where="config_general.yaml: device")
    with pytest.raises(ConfigError) as e:  # torch's own message lists no valid form
        select_device("gpu0", where="command line: device")
    assert str(e.value) == "command line: device: Invalid device string: 'gpu0' (expected auto, cpu, cuda or cuda:N)"
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="'cuda' requested but no CUDA device is available"):
            select_device("cuda")


def test_seeds_make_the_global_draws_repeat():
    import random

    import numpy as np
    import torch

    from pml_extensions.runner.experiment.folder import seed_everything

    def draws():
        return torch.rand(2).tolist(), np.random.rand(2).tolist(), random.random()

    assert seed_everything(7) == 7
    first = draws()
    seed_everything(7)
    assert draws() == first
    state = torch.get_rng_state()
    assert seed_everything(None) is None and torch.equal(torch.get_rng_state(), state)  # null leaves the RNGs alone


def test_stages_and_results(tmp_path):
    import json

    from pml_extensions.runner.experiment.folder import Experiment

    exp = Experiment(str(tmp_path / "exp"), {"seed": 3, "device": "cpu"}, {"device": "general.yaml"}, **QUIET)
    assert exp.where("device") == "general.yaml: device" and exp.seed == 3
    assert exp.stage_result("fold_0") is None
    exp.finish_stage("fold_0", {"best": 0.5})
    assert exp.stage_result("fold_0") == {"best": 0.5}
    path = exp.write_results({"x": 1})
    assert json.load(open(path)) == {"x": 1} and path == os.path.join(str(tmp_path / "exp"), "results.json")


def test_environment_json_records_what_moves_the_numbers(tmp_path, monkeypatch):
    import json

    import torch

    from pml_extensions.runner.experiment.folder import ENVIRONMENT_NAME, environment_summary, prepare_folder

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    prepare_folder(str(tmp_path / "exp"), {"seed": 0}, **QUIET)
    env = json.load(open(tmp_path / "exp" / ENVIRONMENT_NAME))
    assert env["torch_threads"] == torch.get_num_threads()
    assert env["thread_variables"]["OMP_NUM_THREADS"] == "1"
    assert env["versions"]["torch"] == torch.__version__.split("+")[0]
    assert set(env["versions"]) >= {"numpy", "Pillow", "matplotlib", "pytorch-metric-learning", "pml_extensions"}
    assert env["cpu"]["count"] == os.cpu_count() and env["cpu"]["model"]
    if os.path.exists("/proc/cpuinfo"):  # Linux: the instruction-set flags
        assert isinstance(env["cpu"]["flags"], list) and env["cpu"]["flags"]
    build = env["torch_build"]
    assert build["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert build.get("blas_info") and "onednn" in build or not torch.backends.mkldnn.is_available()
    line = environment_summary(env)
    assert line.startswith(f"torch {torch.__version__} (BLAS ") and line.endswith(
        f"{env['torch_threads']} torch thread{'' if env['torch_threads'] == 1 else 's'}"
    )


def test_the_saved_config_keeps_unicode_and_the_command_pastes_back(tmp_path):
    import shlex

    from pml_extensions.runner.experiment.folder import prepare_folder

    folder = str(tmp_path / "exp")
    command = ["python", "-m", "pml_extensions", "run", "contrastive", "--data_folder", "my shop/catalogue export.csv"]
    prepare_folder(folder, {"test_classes": ["Gürtel / Schals", "Robes d'été"]}, command=command, **QUIET)
    text = open(os.path.join(folder, "config.yaml"), encoding="utf-8").read()
    assert "Gürtel / Schals" in text and "Robes d'été" in text and "\\x" not in text
    line = open(os.path.join(folder, "command.txt"), encoding="utf-8").read()
    assert shlex.split(line) == command and "'my shop/catalogue export.csv'" in line


def test_the_environment_line_and_the_time_estimates():
    from pml_extensions.runner.experiment.folder import environment_summary, time_estimate

    env = {"torch": "2.14.1", "torch_threads": 1, "cpu": {"model": "AMD EPYC", "count": 2}}
    env["torch_build"] = {"blas_info": "mkl", "onednn": "Intel(R) MKL-DNN v3.12.0 (Git Hash 80af)"}
    env["torch_build"]["cpu_capability"] = "AVX512"
    env["versions"] = {"numpy": "2.2.6"}
    assert environment_summary(env) == (
        "torch 2.14.1 (BLAS mkl, oneDNN v3.12.0, AVX512 kernels), numpy 2.2.6, AMD EPYC (2 cores), 1 torch thread"
    )
    assert time_estimate(100.0, 3) == ("100 s", "about 5.0 min")
    assert time_estimate(0.2, 3) == ("under 1 s", "a few seconds")
