"""docs/own_data.md (issue 21, item 1): its Python blocks and its worked example run as written, in an empty folder —
a generated folder of 10 classes x 20 images through the runner (the first command stops in one line, the second
trains, the same command again finds the run finished, explain reads the checkpoint it wrote) — and its table of the
classes each shipped config needs is what the configs need."""

import json
import os
import re
import shlex
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = open(os.path.join(ROOT, "docs", "own_data.md"), encoding="utf-8").read()
PYTHON_BLOCKS = re.findall(r"```python\n(.*?)```", DOC, flags=re.S)


def _worked_example():
    section = DOC[DOC.index("### Worked example") :]
    commands = re.search(r"```bash\n(.*?)```", section, flags=re.S).group(1)
    printed = re.search(r"The first command prints\n\n```\n(.*?)\n```", section, flags=re.S).group(1)
    return [line for line in commands.splitlines() if line.strip()], printed


def _run(command, cwd, env):
    """``command`` in a fresh process, as typed."""
    argv = shlex.split(command)
    assert argv[:3] == ["python", "-m", "pml_extensions"]
    return subprocess.run([sys.executable] + argv[1:], cwd=cwd, env=env, capture_output=True, text=True, timeout=1800)


def _run_here(command, capsys):
    """``command`` through the command line's entry point in this process (the current folder): what
    :func:`_run` returns, without the ~8 s of imports a fresh process pays."""
    from pml_extensions.cli import main

    argv = shlex.split(command)
    assert argv[:3] == ["python", "-m", "pml_extensions"]
    capsys.readouterr()
    returncode = main(argv[3:])
    out = capsys.readouterr()
    return subprocess.CompletedProcess(argv, returncode, out.out, out.err)


def _python_blocks(folder):
    for i, code in enumerate(PYTHON_BLOCKS):
        namespace = {"__name__": "__own_data__"}
        exec(compile(code, f"docs/own_data.md python block {i}", "exec"), namespace)


def test_python_blocks_run_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert len(PYTHON_BLOCKS) == 3
    _python_blocks(tmp_path)
    classes = sorted(os.listdir(tmp_path / "photos"))
    assert len(classes) == 10 and all(len(os.listdir(tmp_path / "photos" / c)) == 20 for c in classes)
    rows = (tmp_path / "photos.csv").read_text().splitlines()
    assert rows[0] == "label,path,split" and len(rows) == 201


@pytest.mark.slow
def test_the_worked_example_end_to_end(tmp_path, monkeypatch, subprocess_env, capsys):
    """The training command runs in a fresh process as typed; the first command (it stops in one line), the rerun (it
    finds the run finished) and ``explain`` through the same entry point in this process."""
    monkeypatch.chdir(tmp_path)
    _python_blocks(tmp_path)
    commands, printed = _worked_example()
    assert len(commands) == 4 and commands[1] == commands[2]
    env = dict(subprocess_env, MPLBACKEND="Agg")

    first = _run_here(commands[0], capsys)  # 10 classes: stops before training, says what fits
    assert first.returncode == 2 and first.stderr.strip() == printed, first.stderr
    assert not (tmp_path / "experiments" / "contrastive_quick" / "fold_0").exists()

    second = _run(commands[1], tmp_path, env)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "Traceback" not in second.stderr
    folder = tmp_path / "experiments" / "contrastive_quick"
    results = json.loads((folder / "results.json").read_text())
    assert len(results["folds"]) == 2 and results["test_classes"] == [5, 6, 7, 8, 9]
    assert (folder / "images_checked.json").exists() and not (folder / "bad_images.txt").exists()

    third = _run_here(commands[2], capsys)  # the same command again: every fold resumes finished, same numbers
    assert third.returncode == 0, third.stderr[-3000:]
    assert third.stdout.count("resuming after epoch") == 2 and " epoch " not in third.stdout.replace("after epoch", "")
    assert json.loads((folder / "results.json").read_text())["test"] == results["test"]

    fourth = _run_here(commands[3], capsys)  # explain reads the checkpoint the fresh process wrote
    assert fourth.returncode == 0, fourth.stderr[-3000:]
    similarity = json.loads((tmp_path / "why" / "similarity.json").read_text())
    assert len(similarity["results"]) == 3
    assert all(os.path.isfile(r["overlay"]) for r in similarity["results"])
    assert similarity["query_label"] == "digit_7" and similarity["excluded"][0]["reason"] == "same file as the query"


def _mlrc_needs(config):
    from pml_extensions.runner.config import pb_keys
    from pml_extensions.runner.objects.preflight import minimum_classes
    from pml_extensions.runner.protocols.mlrc import mlrc_class_splits

    s = pb_keys.split_settings(config)
    m = next(iter(config["sampler"].values()))["m"]
    batch = next(iter(config["trainer"].values())).get("batch_size", 32)

    def split(labels):
        return mlrc_class_splits(labels, s["test_size"], s["test_start_idx"], s["num_training_partitions"])

    return minimum_classes(split, m, batch)


def _job_needs(config):
    """Fewest classes for the flat job: a train half whose validation part leaves m x classes >= batch_size."""
    from pml_extensions.datasets.class_disjoint_dataset import select_split_classes
    from pml_extensions.runner.errors import ConfigError
    from pml_extensions.runner.objects.data import validation_split

    m = next(iter(config["sampler"].values()))["m"]
    for count in range(2, 500):
        train = np.repeat(select_split_classes(list(range(count)), "train"), 2)
        if len(select_split_classes(list(range(count)), "test")) < 2:
            continue
        try:
            kept, _, _ = validation_split(train, config["validation"]["class_fraction"], config["validation"]["seed"])
        except ConfigError:
            continue
        if len(np.unique(train[kept])) * m >= config["batch_size"]:
            return count


def _variant_selections(root):
    from pml_extensions.runner.config.loader import CONFIG_FOLDERS

    return [None] + [
        {folder: ["default", f[:-5]]}
        for folder in CONFIG_FOLDERS
        if os.path.isdir(os.path.join(root, folder))
        for f in sorted(os.listdir(os.path.join(root, folder)))
        if f.endswith(".yaml") and f != "default.yaml"
    ]


def test_the_table_of_classes_each_config_needs():
    """Every config of the package and of benchmarks/configs is in the table, in the row of its protocol, and the
    number of classes its row gives is what the config needs (every variant of an mlrc config)."""
    from pml_extensions.runner.config.loader import config_layout, find_config, shipped_configs
    from pml_extensions.runner.protocols import load_config

    table = DOC[DOC.index("| config | protocol |") :].split("\n\n")[0]
    by_protocol = {}  # a protocol may have several rows (configs that need different counts)
    for row in table.splitlines()[2:]:
        by_protocol.setdefault(row.split("|")[2].strip(), []).append(row)
    assert sorted(by_protocol) == ["`mlrc`", "`paired`", "its plugin", "their plugins"]

    class Rows:
        def __getitem__(self, protocol):
            (row,) = [r for r in by_protocol[protocol] if f"`{name}`" in r.split("|")[1]]
            return row

    rows = Rows()
    benchmarks = os.path.join(ROOT, "benchmarks", "configs")
    roots = [find_config(n) for n in shipped_configs()] + [
        os.path.join(benchmarks, n) for n in sorted(os.listdir(benchmarks))
    ]
    for root in roots:
        name = os.path.basename(root)
        in_benchmarks = os.path.dirname(root) == benchmarks
        config = load_config(root, check=False)[0]
        protocol = config["protocol"]
        if protocol in ("paired", "benchmarks.protocols.xml_paper"):  # xml_paper: paired plus the XML loss curves
            row = rows["`paired`"]
            assert config_layout(root) == "flat"
            assert _job_needs(config) == int(row.rsplit("|", 2)[1]), name
        elif protocol == "mlrc":
            row = rows["`mlrc`"]
            for selection in _variant_selections(root):
                assert _mlrc_needs(load_config(root, selection, check=False)[0]) == int(row.rsplit("|", 2)[1]), (
                    name,
                    selection,
                )
        elif protocol == "benchmarks.protocols.resolution_distillation":
            row = rows["its plugin"]
        else:
            assert protocol in ("benchmarks.protocols.template_block", "benchmarks.protocols.localization"), protocol
            row = rows["their plugins"]
            assert "not with `--data_folder`" in row
        assert f"`{name}`" in row
        assert ("in `benchmarks/configs/`" in row.split(f"`{name}`")[0]) == in_benchmarks, name
