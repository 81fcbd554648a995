import os
import subprocess
import sys
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class TestReproduce(unittest.TestCase):
    def run_script(self, *args):
        env = dict(os.environ, PYTHONPATH=ROOT)
        return subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "reproduce.py"), *args],
                              capture_output=True, text=True, env=env, cwd=ROOT)

    def test_list_names_every_step_with_its_command(self):
        r = self.run_script("--size", "full", "--device", "cuda", "--list")
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = r.stdout.strip().splitlines()
        self.assertEqual([l.split(":")[0] for l in lines], ["xml_vs_gap", "xml_generalization", "xml_signal",
                                                            "resolution_distillation", "template_block",
                                                            "template_block_medium", "explain_speed",
                                                            "explain_fidelity", "xml_overhead", "distill_memory",
                                                            "localization", "mlrc_quick", "accuracy_scale"])
        self.assertIn("xml_vs_gap: python -m pml_extensions job --output runs/reproduce/full --new --device cuda", lines)
        self.assertIn("localization: python benchmarks/localization.py --size full --device cuda", lines)
        self.assertIn("--splits 1000", r.stdout)
        self.assertIn("accuracy_scale: python benchmarks/accuracy_scale.py --device cuda", lines)

    def test_unknown_step_is_refused(self):
        r = self.run_script("--only", "nope")
        self.assertEqual(r.returncode, 2)
        self.assertIn("--only: unknown steps ['nope']", r.stderr)


def test_every_readme_block_has_a_step():
    """Each results block of the README is written by one of reproduce.py's steps."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("reproduce", os.path.join(ROOT, "benchmarks", "reproduce.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    from readme_tables import block_names

    written = {name for step in mod.steps("quick", "cpu", "runs") for name in step[2]}
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        assert sorted(set(block_names(f.read())) - written) == []
