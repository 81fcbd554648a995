"""Every command and Python block of the docs pages runs as written, or is checked where it comes from.

* runner commands (``python -m pml_extensions run`` / ``job``, ``torchrun ... run``, ``tox -e job -- ...``) of the
  pages and the README, each distinct one once, from the repository's root, as the run checks them (``--dry-run``:
  merged and checked, nothing trained or written); ``--list`` as is. The ones in :data:`OWN_PROCESS` run in a fresh
  process as typed (one of each shape); the others through the same entry point (``pml_extensions.cli.main``) in
  the test's process: a dry run is almost all the ~8 s of imports a fresh process pays;
* ``explain`` commands: every option they use is one the command takes (the worked example of docs/own_data.md runs
  one end to end, tests/test_docs_own_data.py);
* ``python benchmarks/NAME.py --option``: the script exists and defines the option;
* Python blocks: run in a fresh namespace in an empty folder, unless the README has the same block
  (tests/test_readme_snippets.py runs it) or a test of their own runs them (:data:`ELSEWHERE`); docs/quickstart.md's
  two lines are the lines of the full example of docs/methods/xml.md.
"""

import os
import re
import shlex
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCS = os.path.join(ROOT, "docs")
#: pages whose examples a test of their own runs: page -> that test
ELSEWHERE = {
    "own_data.md": "tests/test_docs_own_data.py",
    "feature_cache.md": "tests/docs/test_feature_cache_md.py",
    "runner.md": "tests/docs/test_runner_md.py",
}
#: commands that need what an earlier command writes, or that stand for any value, and where they are run
NOT_HERE = {
    "--reproduce": "needs a finished run (tests/runner/protocols/test_reproduce.py)",
    "{...}": "a placeholder for the reader's value",
    "--data_folder photos": "docs/own_data.md's worked example (tests/test_docs_own_data.py)",
    "run toy ": "docs/runner.md's plugin example (tests/docs/test_runner_md.py)",
    "--variants finetuned distilled": "needs the teacher run before it (tests/runner/protocols/paired/"
    "test_distillation.py runs both commands)",
}


def _pages():
    out = {}
    for folder, dirs, names in os.walk(DOCS):
        dirs[:] = [d for d in dirs if d != "_hooks"]
        for name in names:
            if name.endswith(".md"):
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8") as f:
                    out[os.path.relpath(path, DOCS).replace(os.sep, "/")] = f.read()
    return out


PAGES = _pages()


README = "../README.md"  # the README's commands are checked here with the pages' (tests/test_readme_snippets.py)


def where(page):
    """A page's path from the repository's root."""
    return "README.md" if page == README else f"docs/{page}"


def _commands():
    """``(page, command)`` of every line of a bash block and every command in backticks, comments dropped, on the
    docs pages and the README."""
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    found = []
    for page, text in [*sorted(PAGES.items()), (README, readme)]:
        for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
            for line in block.replace("\\\n", " ").splitlines():
                command = " ".join(line.split("  #")[0].split())
                if command:
                    found.append((page, command))
        prose = re.sub(r"```.*?```", "", text, flags=re.S)
        for span in re.findall(r"`([^`]+)`", prose):
            span = " ".join(span.split())
            if span.startswith(("python -m pml_extensions ", "tox -e job -- ", "python benchmarks/")):
                found.append((page, span))
    return found


COMMANDS = _commands()


def _runner_argv(command):
    """The command as ``python -m pml_extensions ...`` argv, or None when it is not a runner command."""
    if command.startswith("tox -e job -- "):
        command = "python -m pml_extensions job " + command[len("tox -e job -- ") :]
    if command.startswith("torchrun "):
        command = "python " + command[command.index("-m pml_extensions") :]
    argv = shlex.split(command)
    if argv[:3] != ["python", "-m", "pml_extensions"] or argv[3:4] not in (["run"], ["job"]):
        return None
    return argv


RUNNER = [(p, c) for p, c in COMMANDS if _runner_argv(c) and not any(k in c for k in NOT_HERE)]


def _checked_argv(command):
    """The argv the test runs for ``command``: ``--dry-run`` added unless it lists or already dry-runs."""
    argv = _runner_argv(command)
    return argv if "--list" in argv or "--dry-run" in argv else argv + ["--dry-run"]


def _distinct_runs():
    """Each distinct checked argv once, with every ``(page, command)`` that stands for it (``python -m
    pml_extensions job`` is on five pages; a ``torchrun`` line checks the same argv as its one-process twin)."""
    runs = {}
    for page, command in RUNNER:
        runs.setdefault(tuple(_checked_argv(command)), []).append((page, command))
    return list(runs.items())


RUNS = _distinct_runs()
#: the checked commands that run in a process of their own, as a user types them: ``job`` and ``run`` (each on seven
#: pages), and ``--list`` (loads no torch: cheap)
OWN_PROCESS = {
    ("python", "-m", "pml_extensions", "job", "--dry-run"),
    ("python", "-m", "pml_extensions", "run", "contrastive_xml", "--variant", "quick", "--dry-run"),
}
#: what the output of a command must hold (and must not), by a part of its command line
OUTPUT = {
    "run --list loss": (["XMLWrapper"], []),
    "run --list protocol": (["\n  mlrc: ", "\n  paired: "], []),
    "run contrastive_xml --variant quick": (["GlyphDataset", "XMLWrapper"], []),
    # the nested-marker example: ~OVERRIDE~ inside ~APPLY~ leaves only the chunked calculator
    "{accuracy_calculator~OVERRIDE~: {ChunkedAccuracyCalculator": (
        ["ChunkedAccuracyCalculator"],
        ["  AccuracyCalculator:"],
    ),
}


def test_the_pages_have_commands_of_every_kind():
    assert len(RUNNER) >= 15
    assert any("benchmarks/configs/" in c for _, c in RUNNER) and any(c.startswith("torchrun ") for _, c in RUNNER)
    assert any(" explain " in f" {c}" for _, c in COMMANDS)
    assert any(c.startswith("python benchmarks/") for _, c in COMMANDS)


def _run(argv, extra, subprocess_env, capsys, monkeypatch):
    """``(returncode, stdout, stderr)`` of ``argv + extra`` run from the repository's root: in a fresh process when
    ``argv`` is in :data:`OWN_PROCESS` or lists, else in this one through the command line's entry point."""
    if tuple(argv) in OWN_PROCESS or "--list" in argv:
        out = subprocess.run(
            [sys.executable, *argv[1:], *extra],
            cwd=ROOT,
            env=subprocess_env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        return out.returncode, out.stdout, out.stderr
    from pml_extensions.cli import main

    monkeypatch.chdir(ROOT)
    capsys.readouterr()
    code = main([*argv[3:], *extra])
    got = capsys.readouterr()
    return code, got.out, got.err


def test_one_command_of_each_shape_runs_in_a_process_of_its_own():
    shapes = {argv[3] for argv, _ in RUNS if "--list" not in argv}
    assert shapes == {"job", "run"} and sorted(a[3] for a in OWN_PROCESS) == sorted(shapes)
    assert OWN_PROCESS < {argv for argv, _ in RUNS}


@pytest.mark.slow
@pytest.mark.parametrize("argv, shown", RUNS, ids=[f"{where(w[0][0])}: {w[0][1][:60]}" for _, w in RUNS])
def test_runner_command_runs_as_written(argv, shown, subprocess_env, tmp_path, capsys, monkeypatch):
    """Each distinct command once; a dry run in an empty ``--root_experiment_folder`` leaves it empty."""
    dry = "--dry-run" in argv
    extra = ["--root_experiment_folder", str(tmp_path)] if dry else []
    returncode, stdout, stderr = _run(argv, extra, subprocess_env, capsys, monkeypatch)
    pages = "; ".join(f"{where(page)}: {command}" for page, command in shown)
    assert returncode == 0, f"{pages}\n{stderr[-2000:]}"
    if dry:
        assert "merged with the command line and checked" in stdout and stdout.startswith("# ")
        assert not os.listdir(tmp_path), f"{pages}: the dry run wrote {os.listdir(tmp_path)}"
    for part, (present, absent) in OUTPUT.items():
        if part in " ".join(argv):
            assert all(x in stdout for x in present) and not any(x in stdout for x in absent), pages


def test_every_runner_command_is_checked_once():
    assert sorted(pc for _, where in RUNS for pc in where) == sorted(RUNNER)
    assert len(RUNS) == len({argv for argv, _ in RUNS}) < len(RUNNER)
    (shown,) = [w for argv, w in RUNS if list(argv) == ["python", "-m", "pml_extensions", "job", "--dry-run"]]
    assert sorted({where(page) for page, _ in shown}) == [
        "README.md",
        "docs/benchmarks.md",
        "docs/install.md",
        "docs/methods/xml.md",
        "docs/quickstart.md",
        "docs/runner.md",
    ]
    assert all(any(part in " ".join(argv) for argv, _ in RUNS) for part in OUTPUT)


@pytest.mark.slow
def test_every_explain_option_is_one_the_command_takes(subprocess_env):
    out = subprocess.run(
        [sys.executable, "-m", "pml_extensions", "explain", "--help"],
        cwd=ROOT,
        env=subprocess_env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    explain = [c for _, c in COMMANDS if c.startswith("python -m pml_extensions explain ")]
    used = {option for c in explain for option in re.findall(r"--[\w-]+", c)}
    assert used and sorted(o for o in used if o not in out.stdout) == []


def test_every_benchmark_script_and_option_exists():
    for page, command in COMMANDS:
        if not command.startswith("python benchmarks/"):
            continue
        argv = shlex.split(command)
        path = os.path.join(ROOT, argv[1])
        assert os.path.isfile(path), f"{where(page)}: {command}"
        with open(path, encoding="utf-8") as f:
            source = f.read()
        for option in [a for a in argv[2:] if a.startswith("--")]:
            assert f'"{option}"' in source, f"{where(page)}: {command}: {argv[1]} has no {option}"


def _python_blocks():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme = re.findall(r"```python\n(.*?)```", f.read(), flags=re.S)
    out = []
    for page, text in sorted(PAGES.items()):
        for i, block in enumerate(re.findall(r"```python\n(.*?)```", text, flags=re.S)):
            if page not in ELSEWHERE and page != "quickstart.md" and block not in readme:
                out.append((f"{page}[{i}]", block))
    return out


BLOCKS = _python_blocks()


def test_the_python_blocks_are_run_somewhere():
    assert [name for name, _ in BLOCKS] == ["evaluation.md[0]", "explain.md[0]"]
    for page, test in ELSEWHERE.items():
        assert "```python" in PAGES[page] and os.path.isfile(os.path.join(ROOT, test)), page
    (fragment,) = re.findall(r"```python\n(.*?)```", PAGES["quickstart.md"], flags=re.S)
    (full,) = re.findall(r"```python\n(.*?)```", PAGES["methods/xml.md"], flags=re.S)
    assert all(line in full.splitlines() for line in fragment.splitlines())


@pytest.mark.parametrize("name, code", BLOCKS, ids=[n for n, _ in BLOCKS])
def test_python_block_runs_as_written(name, code, tmp_path, monkeypatch, mobilenet_weights):
    monkeypatch.chdir(tmp_path)
    exec(compile(code, f"docs/{name}", "exec"), {"__name__": "__docs__"})
