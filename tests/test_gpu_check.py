"""benchmarks/gpu_check.py (issue 14): the CPU smoke run of the GPU check, so the script cannot rot."""

import json
import os
import subprocess
import sys
import tempfile
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "benchmarks", "gpu_check.py")
STEPS = [
    "job",
    "mlrc_quick",
    "resolution_quick",
    *(f"autocast_{m}_{d}" for m in ("xml", "template_block", "distillation") for d in ("bfloat16", "float16")),
    "explain_speed",
    "accuracy_scale",
    "torchrun_gloo",
]


def _env(**extra):
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("OMP_NUM_THREADS", "1")
    env["MPLBACKEND"] = "Agg"
    env.update(extra)
    return env


class TestGPUCheck(unittest.TestCase):
    def test_without_cuda_one_line_and_exit_0(self):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "g.json")
            proc = subprocess.run(
                [sys.executable, SCRIPT, "--out", out],
                env=_env(CUDA_VISIBLE_DEVICES=""),
                capture_output=True,
                text=True,
                timeout=120,
            )
            self.assertEqual(proc.returncode, 0, proc.stderr)
            self.assertEqual(len(proc.stdout.strip().splitlines()), 1, proc.stdout)
            self.assertIn("no CUDA device", proc.stdout)
            self.assertFalse(os.path.exists(out))

    def test_cpu_tiny_runs_every_step(self):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "g.json")
            proc = subprocess.run(
                # the device loan's 8-minute budget would skip steps on a loaded machine: every step must run here
                [sys.executable, SCRIPT, "--device", "cpu", "--tiny", "--out", out, "--budget-s", "7200"],
                env=_env(),
                capture_output=True,
                text=True,
                timeout=3600,
            )
            self.assertEqual(proc.returncode, 0, proc.stdout[-3000:] + proc.stderr[-3000:])
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
