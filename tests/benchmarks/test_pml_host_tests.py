"""benchmarks/pml_host_tests.py: PML's own tests against our drop-ins. The committed counts are checked here always;
a short live run needs PML's test files (never committed: set ``PML_HOST_TESTS`` to a PML git directory or
checkout) and is skipped, with that reason, without them."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "benchmarks", "pml_host_tests.py")
RESULTS = os.path.join(ROOT, "benchmarks", "results", "pml_host_tests")
_spec = importlib.util.spec_from_file_location("pml_host_tests", SCRIPT)
host = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(host)

PML_TESTS = os.environ.get("PML_HOST_TESTS")
needs_pml_tests = pytest.mark.skipif(
    not (PML_TESTS and os.path.exists(PML_TESTS)),
    reason="PML's test files are absent: set PML_HOST_TESTS to a PML git directory or checkout (fetched for the "
    "run, never committed; PML's sdist ships no tests)",
)


def _run(tests):
    return {"tests": tests, "seconds": 0.0, "package": None, "returncode": 0}


def test_compare_counts_per_file_and_lists_each_difference_with_its_reason():
    ok, bad = {"outcome": "passed", "message": ""}, {"outcome": "failed", "message": "AssertionError: x"}
    runs = {
        "stock": _run({"tests/a.py::T::one": ok, "tests/a.py::T::two": ok, "tests/b.py::T::one": bad}),
        "chunked": _run({"tests/a.py::T::one": ok, "tests/a.py::T::two": bad, "tests/b.py::T::one": ok}),
    }
    summary = host.compare(runs, known={"tests/b.py::T::one": "ours passes a test stock fails"})
    assert summary["files"] == {
        "tests/a.py": {"stock": {"passed": 2, "total": 2}, "chunked": {"passed": 1, "total": 2}},
        "tests/b.py": {"stock": {"passed": 0, "total": 1}, "chunked": {"passed": 1, "total": 1}},
    }
    assert [(d["test"], d["reason"]) for d in summary["differences"]] == [
        ("tests/a.py::T::two", None),
        ("tests/b.py::T::one", "ours passes a test stock fails"),
    ]
    text = host.markdown(
        summary,
        {"commit": "c", "pml_version": "v", "torch_version": "t", "dtypes": "d", "subjects": ["stock", "chunked"]},
    )
    assert "| `a.py` | 2 / 2 | 1 / 2 |" in text and "**unexplained** (AssertionError: x)" in text


def test_the_committed_results_have_no_unexplained_difference():
    with open(RESULTS + ".json", encoding="utf-8") as f:
        results = json.load(f)
    assert set(results["subjects"]) == {"stock", "chunked", "asymmetric"}
    assert [d["test"] for d in results["differences"] if d["reason"] is None] == []
    # every difference has its reason in the script, and the table is what the script writes from the numbers
    for d in results["differences"]:
        assert d["reason"] == host.KNOWN_DIFFERENCES.get(
            f"{d['subject']}:{d['test']}", host.KNOWN_DIFFERENCES.get(d["test"])
        )
    with open(RESULTS + ".md", encoding="utf-8") as f:
        assert f.read() == host.markdown(results, results)
    # the calculator files and the testers ran with both calculators, the losses with the wrapper
    files = results["files"]
    assert files["tests/utils/test_calculate_accuracies.py"].keys() == {"stock", "chunked", "asymmetric"}
    assert files["tests/losses/test_contrastive_loss.py"].keys() == {"stock", "chunked"}


def test_copy_from_a_folder(tmp_path):
    source = tmp_path / "pml"
    for rel in ("tests/__init__.py", "tests/losses/test_x.py", "tests/losses/data.txt", "tests/miners/test_m.py"):
        (source / rel).parent.mkdir(parents=True, exist_ok=True)
        (source / rel).write_text("# " + rel)
    (source / "tests/zzz_testing_utils").mkdir()
    (source / "tests/testers").mkdir()
    dest = tmp_path / "copy"
    assert host.copy_pml_tests(str(source), "unused", str(dest)) == ["tests/__init__.py", "tests/losses/test_x.py"]
    assert (dest / "tests/losses/test_x.py").read_text() == "# tests/losses/test_x.py"
    with pytest.raises(FileNotFoundError, match="neither a folder with PML's tests/ nor a git directory"):
        host.copy_pml_tests(str(tmp_path / "nothing"), "unused", str(dest))


@pytest.mark.slow
@needs_pml_tests
def test_a_short_live_run_has_no_unexplained_difference(tmp_path, subprocess_env):
    """PML's k-warning test (which failed with both calculators) and its contrastive-loss tests, float32/float64."""
    select = [
        "tests/utils/test_calculate_accuracies.py::TestCalculateAccuraciesValidK",
        "tests/losses/test_contrastive_loss.py",
    ]
    proc = subprocess.run(
        [sys.executable, SCRIPT, "--pml", PML_TESTS, "--dtypes", "float32,float64", "--output", str(tmp_path)]
        + ["--select", *select],
        cwd=ROOT,
        env=dict(subprocess_env, OMP_NUM_THREADS="2"),  # this checkout's package
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(tmp_path / "pml_host_tests.json", encoding="utf-8") as f:
        results = json.load(f)
    for subject in ("stock", "chunked", "asymmetric"):
        outcomes = {t: r["outcome"] for t, r in results["tests"][subject].items()}
        assert outcomes["tests/utils/test_calculate_accuracies.py::TestCalculateAccuraciesValidK::test_k_warning"] == (
            "passed"
        )
    assert results["differences"] == []
