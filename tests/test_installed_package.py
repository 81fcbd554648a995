"""The package works installed, not only from a git checkout: ``pip install --no-deps --target`` a copy of the
source, then, from another directory with only the installed copy on the path, the shipped configs (the resolution
distillation protocol's included) load and merge, and every protocol module imports."""

import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    base = tmp_path_factory.mktemp("installed")
    src = base / "src"
    shutil.copytree(
        ROOT,
        src,
        ignore=shutil.ignore_patterns(
            ".git", "tests", "benchmarks", "runs", "experiments", "*.pyc", "__pycache__", ".tox"
        ),
    )
    site = base / "site"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(site),
            str(src),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if out.returncode != 0:
        pytest.skip(f"pip could not build the package here: {out.stderr.strip().splitlines()[-1:]}")
    shutil.rmtree(src)
    work = base / "elsewhere"
    work.mkdir()
    return str(site), str(work)


def _run(installed, *args):
    site, work = installed
    env = dict(os.environ, PYTHONPATH=site, OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable] + list(args), cwd=work, env=env, capture_output=True, text=True, timeout=300)


def test_installed_copy_is_the_one_imported(installed):
    out = _run(installed, "-c", "import pml_extensions; print(pml_extensions.__file__)")
    assert out.returncode == 0 and out.stdout.startswith(installed[0]), out.stdout + out.stderr


def test_protocol_modules_import_from_the_installed_package(installed):
    code = (
        "import importlib\nfrom pml_extensions.runner.protocols import PROTOCOLS\n"
        "for m in PROTOCOLS.values(): importlib.import_module(m.split(':')[0])\nprint('ok')"
    )
    out = _run(installed, "-c", code)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr


@pytest.mark.parametrize("name", ["xml_glyphs", "contrastive_xml"])  # the paired and the mlrc protocol
def test_shipped_configs_merge_from_the_installed_package(installed, name):
    variant = [] if name == "xml_glyphs" else ["--variant", "quick"]
    out = _run(installed, "-m", "pml_extensions", "run", name, *variant, "--dry-run")
    assert out.returncode == 0, out.stderr
    assert "protocol" in out.stdout or "models" in out.stdout
    assert installed[0] not in out.stdout + out.stderr  # no message prints the install path
