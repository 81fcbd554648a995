"""The protocol lookup table, run_protocol's saved-config check (a rerun never lies about what it trained) and
--reproduce."""

import json
import os

import pytest

from pml_extensions.runner.config.loader import load_config, parse_command_line
from pml_extensions.runner.errors import ConfigError
from pml_extensions.runner.protocols import DESCRIPTIONS, PROTOCOLS, get_protocol, protocol_name, run_protocol
from tests.runner.runner_testing_utils import register_tiny, write_tiny_config

register_tiny()
QUIET = dict(log=lambda *a, **k: None)


class TestLookup:
    def test_table_names_the_three_protocols_and_each_has_run(self):
        assert sorted(PROTOCOLS) == ["mlrc", "resolution_distillation", "xml_vs_gap"]
        assert sorted(DESCRIPTIONS) == sorted(PROTOCOLS)
        for name in PROTOCOLS:
            run = get_protocol(name).run
            assert callable(run)
            assert list(__import__("inspect").signature(run).parameters)[:2] == ["config", "experiment_folder"]

    def test_default_is_mlrc_and_unknown_is_one_line(self):
        assert protocol_name({}) == "mlrc" and protocol_name({"protocol": None}) == "mlrc"
        assert protocol_name({"protocol": "xml_vs_gap"}) == "xml_vs_gap"
        with pytest.raises(ConfigError, match=r"^general.yaml: protocol: unknown 'mlcr'; choose one of mlrc, "):
            protocol_name({"protocol": "mlcr"}, {"protocol": "general.yaml"})
        with pytest.raises(ConfigError, match="unknown 'nope'"):
            get_protocol("nope")

    def test_no_if_chain_on_protocol_names_in_the_dispatch(self):
        """The command line reaches a protocol through the table only (no ``if protocol == ...``)."""
        import pml_extensions

        pkg = os.path.dirname(pml_extensions.__file__)
        for rel in ("__main__.py", "cli/__init__.py", "cli/run.py", "cli/job.py", "runner/protocols/__init__.py"):
            path = os.path.join(pkg, rel)
            if not os.path.exists(path):
                continue
            text = open(path, encoding="utf-8").read()
            for proto in PROTOCOLS:
                assert f'== "{proto}"' not in text and f"== '{proto}'" not in text, (rel, proto)


def _config(tmp_path, argv=()):
    root = write_tiny_config(str(tmp_path / "cfg"))
    base = ["--num_epochs_train", "1", "--num_training_sets", "1", "--num_training_partitions", "2"]
    return load_config(root, None, parse_command_line(base + list(argv)))


class TestChangedConfig:
    def test_rerun_with_another_config_stops_listing_keys_and_flags(self, tmp_path):
        folder = str(tmp_path / "exp")
        cfg, sources = _config(tmp_path)
        first = run_protocol(cfg, folder, sources, **QUIET)
        cfg2, sources2 = _config(tmp_path, ["--num_epochs_train", "2", "--patience", "3"])
        with pytest.raises(ConfigError) as e:
            run_protocol(cfg2, folder, sources2, **QUIET)
        msg = str(e.value)
        assert "\n" not in msg
        assert "num_epochs_train, patience;" in msg and "--new" in msg and "--resume-anyway" in msg
        saved = json.load(open(os.path.join(folder, "results.json")))
        assert saved["test"] == json.loads(json.dumps(first["test"]))  # nothing was overwritten
        assert "num_epochs_train: 1" in open(os.path.join(folder, "config.yaml")).read()

    def test_same_config_resumes_and_device_is_neutral(self, tmp_path):
        folder = str(tmp_path / "exp")
        cfg, sources = _config(tmp_path)
        first = run_protocol(cfg, folder, sources, **QUIET)
        cfg["device"] = "cpu"
        again = run_protocol(cfg, folder, sources, **QUIET)
        assert again["test"] == first["test"]

    def test_new_moves_the_old_run_aside_and_resume_anyway_continues(self, tmp_path):
        folder = str(tmp_path / "exp")
        cfg, sources = _config(tmp_path)
        run_protocol(cfg, folder, sources, **QUIET)
        cfg2, sources2 = _config(tmp_path, ["--num_epochs_train", "2"])
        run_protocol(cfg2, folder, sources2, on_change="new", **QUIET)
        assert os.path.exists(folder + ".old-1/config.yaml")
        assert "num_epochs_train: 1" in open(folder + ".old-1/config.yaml").read()
        assert "num_epochs_train: 2" in open(os.path.join(folder, "config.yaml")).read()
        cfg3, sources3 = _config(tmp_path, ["--num_epochs_train", "3", "--patience", "9"])
        out = run_protocol(cfg3, folder, sources3, on_change="resume", **QUIET)
        from pml_extensions.runner.experiment.checkpoint import load_weights

        assert load_weights(os.path.join(folder, "fold_0", "checkpoint.pth"))["epoch"] == 3  # continued to 3
        assert out["folds"][0]["best_epoch"] <= 3
        with pytest.raises(ValueError, match="on_change"):
            run_protocol(cfg3, folder, sources3, on_change="maybe", **QUIET)


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


def test_a_folder_that_trained_nothing_takes_the_new_config(tmp_path):
    from pml_extensions.runner.experiment.folder import prepare_folder

    folder = str(tmp_path / "exp")
    prepare_folder(folder, {"a": 1}, **QUIET)  # e.g. the run then stopped at a config error
    prepare_folder(folder, {"a": 2}, **QUIET)
    assert "a: 2" in open(os.path.join(folder, "config.yaml")).read()
    open(os.path.join(folder, "results.json"), "w").write("{}")
    with pytest.raises(ConfigError, match=r"differs from this run's config in a;"):
        prepare_folder(folder, {"a": 3}, **QUIET)
