"""PML's own tests for the accuracy calculator, the testers and the losses, run against our drop-ins.

The package promises drop-in replacements: ``ChunkedAccuracyCalculator`` / ``AsymmetricAccuracyCalculator`` for
PML's ``AccuracyCalculator``, and ``XMLWrapper(loss, xml_weight=0)`` equal to ``loss``. This script tests the promise
on tests nobody here wrote: it copies PML's test files (``tests/utils/test_calculate_accuracies*.py``,
``tests/testers/``, ``tests/losses/`` and the helpers they import) from a PML checkout or git directory into a
temporary folder, never into this repository, and runs them with pytest three times:

- ``stock``: as PML ships them;
- ``chunked``: ``pytorch_metric_learning.utils.accuracy_calculator.AccuracyCalculator`` (also the testers' default)
  replaced by ``ChunkedAccuracyCalculator``, and every PML loss class replaced by a class whose instances are
  ``XMLWrapper(the_loss, xml_weight=0)``;
- ``asymmetric``: the calculator and tester files with ``AsymmetricAccuracyCalculator``.

The substitution happens in a ``conftest.py`` written next to the copied tests, before PML's test modules import
the names. A wrapped loss reads and writes the attributes it does not have on its inner loss (PML's tests read
``loss_func.W``, ``loss_func.distance``...): an attribute access is not part of the promise, the loss value is.
Every test whose outcome differs from stock is listed in the results with its reason from :data:`KNOWN_DIFFERENCES`
(a difference that is intended) or as unexplained.

Results: ``benchmarks/results/pml_host_tests.json`` and ``.md`` (the table in ``docs/evaluation.md``).

    python benchmarks/pml_host_tests.py [--pml PATH] [--commit 216a792] [--dtypes float16,float32,float64]
        [--subjects stock chunked asymmetric] [--select FILE_OR_NODE ...] [--output DIR]

``--pml``: a PML git directory (bare or a checkout's ``.git``) or a folder holding PML's ``tests/``; default the
environment variable ``PML_HOST_TESTS``. PML 2.9.0's ``accuracy_calculator.py`` is byte-identical to the one at
commit 216a792 (the default ``--commit``; ignored for a folder). The tests run against the ``pml_extensions`` this
script imports (the installed package; ``PYTHONPATH=.`` in a checkout tests the checkout), whose folder and git
commit the results record. Exit status 1 when a difference is unexplained.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from typing import Dict, List, Optional

import pytorch_metric_learning
import torch

import pml_extensions
from pml_extensions.utils.atomic_io import atomic_write_json, atomic_write_text

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
DEFAULT_COMMIT = "216a792"
#: PML's test files this script runs (the first two are helpers every test file imports)
FOLDERS = ("tests/zzz_testing_utils", "tests/testers", "tests/losses")
FILES = (
    "tests/__init__.py",
    "tests/utils/__init__.py",
    "tests/utils/test_calculate_accuracies.py",
    "tests/utils/test_calculate_accuracies_large_k.py",
)
#: the files the calculator subjects run (losses only with ``chunked``, which also wraps them)
CALCULATOR_FILES = ("tests/utils/test_calculate_accuracies.py", "tests/utils/test_calculate_accuracies_large_k.py")
SUBJECTS = ("stock", "chunked", "asymmetric")

#: test id -> why its outcome with our drop-ins differs from stock, on purpose
KNOWN_DIFFERENCES: Dict[str, str] = {}

CONFTEST = '''"""Written by benchmarks/pml_host_tests.py: substitutes the drop-ins named by PML_HOST_SUBJECT."""

import inspect
import os

import pytorch_metric_learning.losses as pml_losses
import pytorch_metric_learning.testers.base_tester as pml_base_tester
import torch
from pytorch_metric_learning.utils import accuracy_calculator as pml_ac

SUBJECT = os.environ.get("PML_HOST_SUBJECT", "stock")
NOT_LOSSES = {"BaseLossWrapper", "BaseMetricLossFunction", "EmbeddingRegularizerMixin", "GenericPairLoss",
              "WeightRegularizerMixin"}


def wrapped(cls, XMLWrapper):
    """A class named as ``cls`` whose instances are ``XMLWrapper(cls(*args, **kwargs), xml_weight=0)``."""

    def __init__(self, *args, **kwargs):
        XMLWrapper.__init__(self, cls(*args, **kwargs), xml_weight=0)
        self.__dict__["_host_ready"] = True

    def __getattr__(self, name):
        try:
            return XMLWrapper.__getattr__(self, name)
        except AttributeError:
            inner = self.__dict__.get("_modules", {}).get("loss")
            if inner is None or name.startswith("__"):
                raise
            return getattr(inner, name)

    def __setattr__(self, name, value):
        inner = self.__dict__.get("_modules", {}).get("loss")
        mine = name in self.__dict__ or name in self._parameters or name in self._buffers or name in self._modules
        if self.__dict__.get("_host_ready") and not mine and hasattr(inner, name):
            setattr(inner, name, value)
        else:
            XMLWrapper.__setattr__(self, name, value)

    namespace = {"__init__": __init__, "__getattr__": __getattr__, "__setattr__": __setattr__,
                 "__module__": cls.__module__, "__qualname__": cls.__qualname__}
    # what tests read from the class: static and class methods (CrossBatchMemory.supported_losses), constants
    # (PNPLoss.VARIANTS); not its instance methods, which would replace the wrapper's
    for klass in reversed([k for k in cls.__mro__ if k.__module__.startswith("pytorch_metric_learning")]):
        for key, value in vars(klass).items():
            constant = not (callable(value) or isinstance(value, property) or key.startswith("__"))
            if isinstance(value, (staticmethod, classmethod)) or constant:
                namespace[key] = value
    return type(cls.__name__, (XMLWrapper,), namespace)


if SUBJECT != "stock":
    import pml_extensions
    from pml_extensions.knn import AsymmetricAccuracyCalculator, ChunkedAccuracyCalculator
    from pml_extensions.losses import XMLWrapper

    calculator = {"chunked": ChunkedAccuracyCalculator, "asymmetric": AsymmetricAccuracyCalculator}[SUBJECT]
    pml_ac.AccuracyCalculator = calculator
    pml_base_tester.AccuracyCalculator = calculator
    if SUBJECT == "chunked":
        for name, cls in list(vars(pml_losses).items()):
            if inspect.isclass(cls) and issubclass(cls, torch.nn.Module) and name not in NOT_LOSSES:
                setattr(pml_losses, name, wrapped(cls, XMLWrapper))
    with open(os.environ["PML_HOST_REPORT"], "w") as f:
        f.write(os.path.dirname(pml_extensions.__file__))
'''


def _git(git_dir: str, *args: str) -> bytes:
    return subprocess.run(["git", "--git-dir", git_dir, *args], check=True, capture_output=True).stdout


def copy_pml_tests(source: str, commit: str, dest: str) -> List[str]:
    """Copy PML's test files (:data:`FILES` and :data:`FOLDERS`) from ``source`` into ``dest``.

    ``source`` is a folder holding ``tests/`` (copied as it is) or a git directory (read at ``commit``). Returns the
    copied paths (relative, sorted).

    Raises:
        FileNotFoundError: ``source`` holds neither.
    """
    copied = []
    if os.path.isdir(os.path.join(source, "tests")):
        for rel in FILES:
            if os.path.exists(os.path.join(source, rel)):
                copied.append(rel)
        for folder in FOLDERS:
            for name in sorted(os.listdir(os.path.join(source, folder))):
                if name.endswith(".py"):
                    copied.append(f"{folder}/{name}")
        for rel in copied:
            os.makedirs(os.path.dirname(os.path.join(dest, rel)), exist_ok=True)
            shutil.copyfile(os.path.join(source, rel), os.path.join(dest, rel))
        return sorted(copied)
    git_dir = source if os.path.exists(os.path.join(source, "HEAD")) else os.path.join(source, ".git")
    if not os.path.exists(os.path.join(git_dir, "HEAD")):
        raise FileNotFoundError(f"{source}: neither a folder with PML's tests/ nor a git directory")
    listed = _git(git_dir, "ls-tree", "-r", "--name-only", commit, "--", *FOLDERS, *FILES).decode().split()
    for rel in listed:
        if not rel.endswith(".py"):
            continue
        path = os.path.join(dest, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(_git(git_dir, "show", f"{commit}:{rel}"))
        copied.append(rel)
    return sorted(copied)


def default_source() -> Optional[str]:
    """``$PML_HOST_TESTS`` when it names an existing path, else None."""
    path = os.environ.get("PML_HOST_TESTS")
    return path if path and os.path.exists(path) else None


def _package_commit(root: str) -> Optional[str]:
    """``git describe --always --dirty`` of the checkout holding the tested package, None outside one."""
    try:
        out = subprocess.run(
            ["git", "-C", root, "describe", "--always", "--dirty"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


def parse_junit(path: str) -> Dict[str, dict]:
    """``{test id: {"outcome": passed|failed|error|skipped, "message": first line, "seconds": t}}`` from pytest's
    junit XML; a test id is ``tests/<file>.py::<Class>::<name>``."""
    out = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        parts = case.get("classname", "").split(".")
        # classname = tests.losses.test_x.TestX: the module path, then the class
        module, cls = parts[:-1], parts[-1]
        test_id = "/".join(module) + ".py::" + cls + "::" + case.get("name")
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                message = (node.get("message") or node.text or "").strip().splitlines()[0:1]
                message = message[0][:300] if message else ""
                break
        out[test_id] = {"outcome": outcome, "message": message, "seconds": float(case.get("time", 0.0))}
    return out


def run_subject(folder: str, subject: str, targets: List[str], dtypes: str, timeout: float) -> dict:
    """Run pytest on ``targets`` (paths inside ``folder``) with the drop-ins of ``subject``; returns the parsed
    outcomes and the folder of the ``pml_extensions`` that was substituted."""
    junit = os.path.join(folder, f"junit_{subject}.xml")
    report = os.path.join(folder, f"package_{subject}.txt")
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(pml_extensions.__file__)))
    env = dict(os.environ, PML_HOST_SUBJECT=subject, PML_HOST_REPORT=report, TEST_DEVICE="cpu", TEST_DTYPES=dtypes)
    # the child imports the pml_extensions this script imports (a checkout or the installed package)
    env["PYTHONPATH"] = os.pathsep.join([package_root] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.pop("WITH_COLLECT_STATS", None)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--junitxml", junit, *targets]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True, timeout=timeout)
    seconds = time.perf_counter() - start
    if not os.path.exists(junit):
        raise RuntimeError(f"pytest wrote no report for {subject} (rc {proc.returncode}): {proc.stdout[-2000:]}")
    package = None
    if os.path.exists(report):
        with open(report) as f:
            package = f.read().strip()
    return {"tests": parse_junit(junit), "seconds": seconds, "package": package, "returncode": proc.returncode}


def compare(runs: Dict[str, dict], known: Dict[str, str] = KNOWN_DIFFERENCES) -> dict:
    """Per-file counts and the tests whose outcome differs from stock.

    Returns ``{"files": {file: {subject: {"passed": p, "total": n}}}, "differences": [{"test", "subject",
    "stock", "ours", "message", "reason"}]}``; ``reason`` is None for an unexplained difference.
    """
    files: Dict[str, Dict[str, dict]] = {}
    differences = []
    stock = runs["stock"]["tests"]
    for subject, run in runs.items():
        for test_id, result in run["tests"].items():
            counts = files.setdefault(test_id.split("::")[0], {}).setdefault(subject, {"passed": 0, "total": 0})
            counts["total"] += 1
            counts["passed"] += result["outcome"] in ("passed", "skipped")
            if subject == "stock":
                continue
            before = stock.get(test_id, {"outcome": "absent"})["outcome"]
            if (before in ("passed", "skipped")) != (result["outcome"] in ("passed", "skipped")):
                differences.append(
                    {
                        "test": test_id,
                        "subject": subject,
                        "stock": before,
                        "ours": result["outcome"],
                        "message": result["message"] or stock.get(test_id, {}).get("message", ""),
                        "reason": known.get(f"{subject}:{test_id}", known.get(test_id)),
                    }
                )
    return {"files": dict(sorted(files.items())), "differences": differences}


def markdown(summary: dict, meta: dict) -> str:
    subjects = [s for s in SUBJECTS if s in meta["subjects"]]
    names = {"stock": "stock PML", "chunked": "ours: Chunked + XMLWrapper(λ=0)", "asymmetric": "ours: Asymmetric"}
    lines = [
        f"`python benchmarks/pml_host_tests.py` (PML's tests at commit {meta['commit']}, PML "
        f"{meta['pml_version']}, torch {meta['torch_version']}, TEST_DTYPES={meta['dtypes']}, TEST_DEVICE=cpu; "
        "passed / run, a skip counts as passed)",
        "",
        "| PML test file | " + " | ".join(names[s] for s in subjects) + " |",
        "|---|" + "---|" * len(subjects),
    ]
    totals = {s: [0, 0] for s in subjects}
    for file, per in summary["files"].items():
        cells = []
        for s in subjects:
            if s in per:
                cells.append(f"{per[s]['passed']} / {per[s]['total']}")
                totals[s][0] += per[s]["passed"]
                totals[s][1] += per[s]["total"]
            else:
                cells.append("—")
        lines.append(f"| `{file[len('tests/') :]}` | " + " | ".join(cells) + " |")
    lines.append("| **all** | " + " | ".join(f"**{p} / {n}**" for p, n in totals.values()) + " |")
    diffs = summary["differences"]
    lines.append("")
    if not diffs:
        lines.append("Every test that passes with stock PML passes with our drop-ins, and none more.")
    tests = summary.get("tests", {})
    both = [
        (t, r["message"])
        for t, r in tests.get("stock", {}).items()
        if r["outcome"] in ("failed", "error")
        and all(tests[s].get(t, r)["outcome"] in ("failed", "error") for s in subjects if s != "stock")
    ]
    if both:
        lines.append("")
        lines.append(f"Failing with stock PML and with ours alike ({len(both)}):")
        lines.append("")
        lines.extend(f"- `{t}`: {message}" for t, message in both)
    else:
        lines.append("Tests whose outcome differs from stock:")
        lines.append("")
        for d in diffs:
            why = d["reason"] or f"**unexplained** ({d['message']})"
            lines.append(f"- `{d['test']}` ({d['subject']}: stock {d['stock']}, ours {d['ours']}): {why}")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pml", default=default_source(), help="PML git directory or folder with tests/")
    p.add_argument("--commit", default=DEFAULT_COMMIT)
    p.add_argument("--dtypes", default="float16,float32,float64", help="PML's TEST_DTYPES (its default)")
    p.add_argument("--subjects", nargs="+", default=list(SUBJECTS), choices=SUBJECTS)
    p.add_argument("--select", nargs="+", default=None, help="test files or node ids (tests/...) to run")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds per subject")
    p.add_argument("--output", default=RESULTS, help="folder for pml_host_tests.json/.md ('' = do not write)")
    p.add_argument("--render", metavar="JSON", help="only rewrite the .md beside this results file from its numbers")
    args = p.parse_args(argv)
    if args.render:
        with open(args.render, encoding="utf-8") as f:
            results = json.load(f)
        atomic_write_text(os.path.splitext(args.render)[0] + ".md", markdown(results, results))
        return 0
    if not args.pml:
        print("no PML tests: pass --pml or set PML_HOST_TESTS (a PML git directory or checkout)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="pml_host_tests_") as folder:
        copied = copy_pml_tests(args.pml, args.commit, folder)
        with open(os.path.join(folder, "conftest.py"), "w") as f:
            f.write(CONFTEST)
        runs = {}
        for subject in ["stock"] + [s for s in args.subjects if s != "stock"]:
            if args.select:
                targets = list(args.select)
                if subject == "asymmetric":
                    targets = [t for t in targets if not t.startswith("tests/losses")]
            elif subject == "asymmetric":
                targets = list(CALCULATOR_FILES) + ["tests/testers"]
            else:
                targets = list(CALCULATOR_FILES) + ["tests/testers", "tests/losses"]
            if not targets:
                continue
            print(f"{subject}: pytest {' '.join(targets)}", flush=True)
            runs[subject] = run_subject(folder, subject, targets, args.dtypes, args.timeout)
            print(f"  {len(runs[subject]['tests'])} tests in {runs[subject]['seconds']:.0f} s", flush=True)
    here = os.path.dirname(os.path.dirname(os.path.abspath(pml_extensions.__file__)))
    for subject, run in runs.items():
        if subject != "stock" and run["package"] != os.path.join(here, "pml_extensions"):
            raise RuntimeError(f"{subject}: the tests imported pml_extensions from {run['package']}, not {here}")
    summary = compare(runs)
    meta = {
        "commit": args.commit,
        "package_commit": _package_commit(here),
        "pml_version": pytorch_metric_learning.__version__,
        "torch_version": torch.__version__.split("+")[0],
        "dtypes": args.dtypes,
        "subjects": list(runs),
        "files_copied": len(copied),
        "seconds": {s: round(r["seconds"], 1) for s, r in runs.items()},
    }
    payload = dict(meta, **summary, tests={s: r["tests"] for s, r in runs.items()})
    text = markdown(payload, payload)
    print(text)
    if args.output:
        atomic_write_json(os.path.join(args.output, "pml_host_tests.json"), payload)
        atomic_write_text(os.path.join(args.output, "pml_host_tests.md"), text)
    return 1 if any(d["reason"] is None for d in summary["differences"]) else 0


if __name__ == "__main__":
    sys.exit(main())
