"""runner/protocols/__init__.py: the protocol lookup table and run_protocol's saved-config check (a rerun never lies
about what it trained)."""

import json
import os

import pytest

from pml_extensions.runner.config.loader import parse_command_line
from pml_extensions.runner.errors import ConfigError
from pml_extensions.runner.protocols import (
    PROTOCOLS,
    Protocol,
    descriptions,
    get_protocol,
    load_config,
    protocol_of,
    run_protocol,
)
from tests.runner.runner_testing_utils import register_tiny, write_tiny_config

register_tiny()
QUIET = dict(log=lambda *a, **k: None)


class TestLookup:
    def test_table_names_the_protocols_and_each_is_a_protocol_class(self):
        # the package's own; a plugin registered by an earlier test (benchmarks.protocols) goes by its dotted name
        assert sorted(n for n in PROTOCOLS if "." not in n) == ["mlrc", "paired"]
        assert sorted(n for n in descriptions() if "." not in n) == sorted(PROTOCOLS)
        for name in PROTOCOLS:
            cls = get_protocol(name)
            assert issubclass(cls, Protocol) and cls.name == name and callable(cls.run)

    def test_default_is_mlrc_and_unknown_is_one_line(self):
        assert protocol_of({}).name == "mlrc" and protocol_of({"protocol": None}).name == "mlrc"
        assert protocol_of({"protocol": "paired"}).name == "paired"
        unknown = r"^general.yaml: protocol: unknown 'mlcr'; did you mean mlrc\? \(known: (\S+, )*mlrc, paired"
        with pytest.raises(ConfigError, match=unknown):
            protocol_of({"protocol": "mlcr"}, {"protocol": "general.yaml"})
        with pytest.raises(ConfigError, match="unknown 'nope'"):
            get_protocol("nope")
        with pytest.raises(ConfigError, match="cannot import 'no_such.module'"):
            get_protocol("no_such.module:Thing")

    def test_a_registered_or_dotted_protocol_is_found(self):
        from pml_extensions.runner.protocols import register_protocol
        from pml_extensions.runner.protocols.paired import Paired

        class Mine(Paired):
            name = "mine"

        assert register_protocol("mine", Mine) is Mine and get_protocol("mine") is Mine
        assert get_protocol("pml_extensions.runner.protocols.paired.protocol") is Paired
        assert get_protocol("pml_extensions.runner.protocols.paired.protocol:Paired") is Paired
        with pytest.raises(TypeError):
            register_protocol("x", dict)

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
    flags = {"--num_epochs_train": "1", "--num_training_sets": "1", "--num_training_partitions": "2"}
    flags.update(zip(argv[::2], argv[1::2]))  # a test's flag replaces the base one (a flag given twice is refused)
    return load_config(root, None, parse_command_line([x for kv in flags.items() for x in kv]))


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
