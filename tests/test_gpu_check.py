"""benchmarks/gpu_check.py (issue 14): the CPU smoke run of the GPU check, so the script cannot rot."""

import contextlib
import io
import json
import os
import tempfile
import unittest
from unittest import mock

STEPS = [
    "job",
    "mlrc_quick",
    "resolution_quick",
    *(f"autocast_{m}_{d}" for m in ("xml", "template_block", "distillation") for d in ("bfloat16", "float16")),
    "explain_speed",
    "accuracy_scale",
    "torchrun_gloo",
]


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the environment the script's own process had: this checkout first on the children's PYTHONPATH (accuracy_scale's
# rows), one OpenMP thread unless the caller chose
ENV = {
    "MPLBACKEND": "Agg",
    "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
    "PYTHONPATH": REPO + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else ""),
}


def _main(argv):
    """``python benchmarks/gpu_check.py ARGV`` through its ``main(argv)`` in this process (a child interpreter would
    import torch and torchvision again, ~7 s): (exit status, what it printed). The steps' own children (torchrun,
    accuracy_scale's rows) still run as processes, with this checkout first on their PYTHONPATH."""
    from benchmarks import gpu_check

    tiny = dict(gpu_check.IN_PROCESS)
    out = io.StringIO()
    try:
        with mock.patch.dict(os.environ, ENV), contextlib.redirect_stdout(out):
            code = gpu_check.main(argv)
    finally:
        gpu_check.IN_PROCESS.update(tiny)  # --tiny sets it for the whole interpreter
    return code, out.getvalue()


class TestGPUCheck(unittest.TestCase):
    def test_without_cuda_one_line_and_exit_0(self):
        with tempfile.TemporaryDirectory() as tmp, mock.patch("torch.cuda.is_available", return_value=False):
            out = os.path.join(tmp, "g.json")
            code, stdout = _main(["--out", out])
            self.assertEqual(code, 0, stdout)
            self.assertEqual(len(stdout.strip().splitlines()), 1, stdout)
            self.assertIn("no CUDA device", stdout)
            self.assertFalse(os.path.exists(out))

    def test_cpu_tiny_runs_every_step(self):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "g.json")
            # the device loan's 8-minute budget would skip steps on a loaded machine: every step must run here
            code, stdout = _main(["--device", "cpu", "--tiny", "--out", out, "--budget-s", "7200"])
            self.assertEqual(code, 0, stdout[-6000:])
            with open(out) as f:
                result = json.load(f)
            steps = {s["name"]: s for s in result["steps"]}
            self.assertEqual(list(steps), STEPS)
            for name, step in steps.items():
                if name == "accuracy_scale" and step["status"] == "skipped":
                    self.assertIn("--device", step["note"])  # tolerated while the script has no --device option
                    continue
                self.assertEqual(step["status"], "ok", f"{name}: {step['note']}")
            for name in STEPS[3:9]:
                figures = steps[name]["figures"]
                self.assertTrue(all(v == v and abs(v) < float("inf") for v in figures.values()), figures)
            self.assertEqual(steps["torchrun_gloo"]["figures"]["backend"], "gloo")
            self.assertLess(steps["explain_speed"]["figures"]["rows.point-to-point 14x14 (einsum / 4 loops).ratio"], 1)
            with open(os.path.splitext(out)[0] + ".md") as f:
                table = f.read()
            self.assertIn("| autocast_xml_float16 | ok |", table)


if __name__ == "__main__":
    unittest.main()
