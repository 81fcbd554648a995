import os
import subprocess
import sys
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class TestReproduce(unittest.TestCase):
    def run_script(self, *args):
        env = dict(os.environ, PYTHONPATH=ROOT)
        return subprocess.run(
            [sys.executable, os.path.join(ROOT, "benchmarks", "reproduce.py"), *args],
            capture_output=True,
            text=True,
            env=env,
            cwd=ROOT,
        )

    def test_list_names_every_step_with_its_command(self):
        r = self.run_script("--size", "full", "--device", "cuda", "--list")
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = r.stdout.strip().splitlines()
        steps = [l.split(":")[0] for l in lines if "." not in l.split(":")[0]]
        self.assertEqual(
            steps,
            [
                "resolution_distillation",
                "resolution_distillation_off_floor",
                "template_block_converged",
                "template_block",
                "localization",
                "xml_cached_cache",
                "xml_cached",
                "xml_trained",
                "template_block_cached_cache",
                "template_block_cached",
                "thread_sensitivity_run",
                "xml_signal",
                "explain_fidelity",
                "mlrc_quick",
                "xml_vs_gap",
                "explain_speed",
                "xml_overhead",
                "distill_memory",
                "raml_teacher_cache",
                "accuracy_scale",
                "xml_generalization",
                "thread_sensitivity",
            ],
        )
        self.assertIn(
            "xml_vs_gap: python -m pml_extensions job --root_experiment_folder runs/reproduce/full --new --device cuda"
            "  [alone, every core]",
            lines,
        )
        self.assertIn(
            "localization.seed4: python benchmarks/localization.py --size full "
            "--experiment-folder runs/reproduce/full/localization"
            " --device cuda --only-seeds 4  [1 thread]",
            lines,
        )
        self.assertIn(
            "template_block.glyphs: python benchmarks/template_block.py --size full "
            "--experiment-folder runs/reproduce/full/template_block --device cuda --part glyphs  [1 thread]",
            lines,
        )
        self.assertIn("--splits 1000", r.stdout)
        self.assertIn("accuracy_scale: python benchmarks/accuracy_scale.py --device cuda  [alone, every core]", lines)

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

    written = {name for step in mod.steps("quick", "cpu", "runs") for name in step[2]} | {"reproduce_quick_cpu"}
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        assert sorted(set(block_names(f.read())) - written) == []


def _load_reproduce():
    import importlib.util

    spec = importlib.util.spec_from_file_location("reproduce_mod", os.path.join(ROOT, "benchmarks", "reproduce.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_run_plan_orders_alone_processes_and_skips_after_a_failure(tmp_path, monkeypatch):
    """Parallel processes start in list order, an alone process runs with nothing beside it, a failed process's
    dependants are skipped and the others still run."""
    mod = _load_reproduce()
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    stamp = str(tmp_path / "order.txt")

    def proc(name, code, alone=False, needs=()):
        body = (
            f"import time, os; f = open({stamp!r}, 'a'); f.write('start {name}\\n'); f.flush(); "
            f"time.sleep(0.3); f.write('end {name} ' + os.environ.get('OMP_NUM_THREADS', '-') + '\\n'); "
            f"f.close(); raise SystemExit({code})"
        )
        return mod.Process(name, [sys.executable, "-c", body], alone, needs)

    runs = os.path.relpath(str(tmp_path), mod.ROOT)
    procs = [
        proc("a", 0),
        proc("b", 1),
        proc("c", 0, needs=("b",)),
        proc("m", 0, needs=("a",)),
        proc("solo", 0, alone=True),
        proc("after", 0, needs=("solo",)),
    ]
    seconds, failed, skipped = mod.run_plan(procs, runs, jobs=2, write=lambda *_: None)
    assert failed == ["b"] and skipped == ["c"]
    assert sorted(seconds) == ["a", "after", "m", "solo"]
    lines = open(stamp).read().split("\n")
    solo_start, solo_end = lines.index("start solo"), [i for i, l in enumerate(lines) if l.startswith("end solo")][0]
    assert solo_end == solo_start + 1  # nothing started or ended while it ran
    assert lines[solo_end] == "end solo 7"  # every core: the caller's OMP_NUM_THREADS, not forced to 1
    assert "end a 1" in lines and "end after 1" in lines  # parallel processes get one thread
    assert lines.index("start m") > lines.index("end a 1")  # a merge waits for its parts


def test_parts_come_before_their_merge():
    mod = _load_reproduce()
    procs = mod.processes(mod.steps("quick", "cpu", "runs"))
    names = [p.name for p in procs]
    merge = names.index("template_block")
    assert {n for n in names[:merge] if n.startswith("template_block.")} == {
        "template_block.ablation",
        "template_block.fashion_lambda",
        "template_block.glyphs",
    }
    assert set(procs[merge].needs) == {
        "template_block.ablation",
        "template_block.fashion_lambda",
        "template_block.glyphs",
    }
    assert names.index("xml_generalization") > names.index("xml_vs_gap")
    fresh = {s.name: s.fresh for s in mod.steps("full", "cpu", "runs")}
    assert fresh["xml_vs_gap"] == (os.path.join("runs", "xml_glyphs"),)  # resumable folders start afresh
    assert fresh["resolution_distillation"] == (os.path.join("runs", "resolution_distillation"),)
    assert fresh["template_block"] == (os.path.join("runs", "template_block"),)  # parts share these folders
    assert fresh["localization"] == (os.path.join("runs", "localization"),)
    assert fresh["xml_generalization"] == ()  # it reads the job's folder, never deletes it


def test_record_names_the_wall_time_and_every_process(tmp_path, monkeypatch):
    import argparse
    import json

    mod = _load_reproduce()
    monkeypatch.setattr(mod, "RESULTS", str(tmp_path))
    args = argparse.Namespace(size="quick", device="cpu", jobs=2)
    plan = mod.steps("quick", "cpu", "runs")[:1]
    mod.write_record(args, plan, 125.0, {"template_block": 90.0}, [], [])
    rec = json.load(open(tmp_path / "reproduce_quick_cpu.json"))
    assert rec["wall_seconds"] == 125.0 and rec["steps"] == ["template_block"]
    md = open(tmp_path / "reproduce_quick_cpu.md").read()
    assert "**2.1 min** wall" in md and "every process succeeded" in md
    assert "| template_block | 1.5 |" in md
    mod.write_record(args, plan, 60.0, {}, ["template_block"], ["xml_generalization"])
    md = open(tmp_path / "reproduce_quick_cpu.md").read()
    assert "failed: template_block; skipped: xml_generalization" in md


def test_quick_leaves_the_full_only_steps_out():
    """--size quick fits its 60 minutes by leaving the k-NN scale timings (18.1 min alone in the last whole call), the
    near-the-floor RAML tables (18.2 min) and the hour-long fair settings to --size full."""
    mod = _load_reproduce()
    quick = [s.name for s in mod.steps("quick", "cpu", "runs")]
    full = [s.name for s in mod.steps("full", "cpu", "runs")]
    assert mod.FULL_ONLY == (
        "accuracy_scale", "resolution_distillation", "xml_trained", "resolution_distillation_off_floor",
        "template_block_converged",
    )  # fmt: skip
    assert all(n in full and n not in quick for n in mod.FULL_ONLY)
    assert [n for n in full if n not in mod.FULL_ONLY] == quick


def test_a_rerun_is_compared_with_the_committed_files_seed_by_seed(tmp_path, monkeypatch):
    """The generated line 'k of n seeds bit-identical, largest difference d': per-seed metrics and per-seed
    differences are compared, means and intervals are not (they follow from them)."""
    import argparse
    import json

    mod = _load_reproduce()
    monkeypatch.setattr(mod, "RESULTS", str(tmp_path))
    old = {"variants": {"a": {"per_seed": {"0": {"m": 0.25}, "1": {"m": 0.5}}, "mean": {"m": 0.375}}},
           "comparisons": [{"differences": [0.125, -0.5], "ci95": [0, 1]}]}  # fmt: skip
    new = {"variants": {"a": {"per_seed": {"0": {"m": 0.25}, "1": {"m": 0.75}}, "mean": {"m": 0.5}}},
           "comparisons": [{"differences": [0.125, -0.25], "ci95": [0, 2]}]}  # fmt: skip
    (tmp_path / "x.json").write_text(json.dumps(old))
    plan = [mod.Step("x", [], ["x"])]
    before = mod.committed_results(plan)
    (tmp_path / "x.json").write_text(json.dumps(new))
    reruns = mod.rerun_comparison(before)
    assert reruns == {"x": {"compared": 4, "identical": 2, "largest_difference": 0.25}}
    mod.write_record(argparse.Namespace(size="quick", device="cpu", jobs=2), plan, 60.0, {}, [], [], reruns)
    assert "| x | 4 | 2 of 4 | 0.25 |" in open(tmp_path / "reproduce_quick_cpu.md").read()
    assert mod.rerun_line({"per_seed": {"0": True}}, {}) == {"compared": 0, "identical": 0, "largest_difference": None}
