"""cli/__init__.py: the one command line dispatches job, run and explain, importing each only when it is asked for."""

import ast
import os

import pytest

import pml_extensions.cli as cli


def test_help_unknown_and_the_command_table(capsys):
    assert cli.main(["--help"]) == 0
    assert capsys.readouterr().out.startswith("usage: python -m pml_extensions {job,run,explain}")
    assert cli.main(["jobs"]) == 2
    captured = capsys.readouterr()
    assert "unknown command 'jobs'; choose one of: job, run, explain" in captured.err
    assert cli.main([]) == 0
    assert set(cli.COMMANDS) == {"job", "run", "explain"}


def test_commands_are_imported_lazily():
    """The dispatcher imports nothing of the package at module level: ``explain`` never loads the runner."""
    tree = ast.parse(open(cli.__file__, encoding="utf-8").read())
    top_level = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    names = [a.name for n in top_level for a in n.names] + [getattr(n, "module", None) or "" for n in top_level]
    assert not [n for n in names if n.startswith("pml_extensions") or n.startswith(".")]
    for module in cli.COMMANDS.values():
        path = os.path.join(os.path.dirname(cli.__file__), module.rsplit(".", 1)[1] + ".py")
        assert os.path.exists(path), module


def test_main_module_calls_the_dispatcher(monkeypatch):
    import pml_extensions.__main__ as entry

    assert entry.main is cli.main
    seen = []
    monkeypatch.setitem(cli.COMMANDS, "run", "tests.cli.test_cli")
    monkeypatch.setattr("tests.cli.test_cli.main", lambda argv: seen.append(argv) or 0, raising=False)
    assert cli.main(["run", "--x", "1"]) == 0 and seen == [["--x", "1"]]


@pytest.mark.parametrize("command", ["job", "run", "explain"])
def test_each_command_has_help(command, capsys):
    try:
        status = cli.main([command, "--help"])
    except SystemExit as e:  # explain's argparse exits after printing its help
        status = e.code
    assert status == 0
    out = capsys.readouterr().out
    assert out.startswith("usage:") and "``" not in out and ":func:" not in out


HEAVY = ("torch", "torchvision", "pytorch_metric_learning", "matplotlib", "record_keeper")


@pytest.mark.slow
@pytest.mark.parametrize(
    "argv, status",
    [
        (["run", "--help"], 0),
        (["job", "--help"], 0),
        (["explain", "--help"], 0),
        (["run", "--list"], 0),
        (["run", "--list", "loss"], 0),
        (["run", "contrastive", "--variant", "quick", "--num_epoch", "3"], 2),  # a typo: the config error
        (["run", "contrastive", "--loss_funcs~APPLY~2", "{xml_wieght: 0.1}", "--dry-run"], 2),
    ],
)
def test_answers_without_the_heavy_imports(argv, status, subprocess_env):
    """--help, --list and config errors (also under --dry-run) load no torch, torchvision, PML, matplotlib or
    record-keeper (a --dry-run without a config error goes on to decode the images and probe the trunk's channels,
    which needs torch; so does a config error on a dataset that names files on disk, whose bad files join the
    refusal) (the time they take is measured by benchmarks/cli_latency.py, not here). The class index is built
    once in this process (as a first `run` would) and read from the session's cache folder by the child."""
    import subprocess
    import sys

    from pml_extensions.runner.config.registry import index

    index()
    code = (
        "import sys\nfrom pml_extensions.cli import main\n"
        "try:\n    status = main(sys.argv[1:])\nexcept SystemExit as e:\n    status = e.code\n"
        f"print('HEAVY', sorted(m for m in {HEAVY!r} if m in sys.modules), status)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, *argv], env=subprocess_env, capture_output=True, text=True, timeout=300
    )
    line = [x for x in out.stdout.splitlines() if x.startswith("HEAVY")][-1]
    assert line == f"HEAVY [] {status}", (line, out.stderr[-2000:])


def test_pmls_loss_to_scalar_warning_is_silenced_only_while_a_command_runs(monkeypatch):
    """Every run printed torch's three-line 'Converting a tensor with requires_grad=True to a scalar' warning,
    triggered by pytorch-metric-learning's progress bar; other warnings pass, and the filter does not outlive the
    command."""
    import warnings

    def command(argv):
        warnings.warn(cli.PML_LOSS_WARNING + " may lead to unexpected behavior.", UserWarning, stacklevel=1)
        warnings.warn("another warning", UserWarning, stacklevel=1)
        return 0

    monkeypatch.setitem(cli.COMMANDS, "run", "tests.cli.test_cli")
    monkeypatch.setattr("tests.cli.test_cli.main", command, raising=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cli.main(["run"]) == 0
        assert [str(w.message) for w in caught] == ["another warning"]
        warnings.warn(cli.PML_LOSS_WARNING + " after the command", UserWarning, stacklevel=1)
        assert len(caught) == 2
