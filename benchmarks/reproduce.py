"""Regenerate every result table of the README with one command.

    python benchmarks/reproduce.py --size quick                  # CPU, several hours on 2 cores
    python benchmarks/reproduce.py --size full --device cuda     # GPU sizes
    python benchmarks/reproduce.py --size quick --only xml_vs_gap xml_generalization

Each step is one benchmark run by its stable command line (below); it writes ``benchmarks/results/NAME.json`` and
``NAME.md``. The main job's ``results.json``/``results.md`` are copied to ``benchmarks/results/xml_vs_gap.*``.
Then ``benchmarks/readme_tables.py`` copies every ``NAME.md`` into its README block (every README block has a step
here; a test checks it). A tqdm bar shows the steps;
each step's output goes to ``runs/reproduce/<size>/NAME.log``. A failing step is reported (with the end of its
log) and the others still run; the exit status is 1 when any step failed.
"""

import argparse
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results")
PY = sys.executable


def steps(size: str, device: str, runs: str):
    """``[(name, argv, results written)]`` in order; the XML generalisation probe reads the main job's models."""
    dev = ["--device", device]
    job_folder = os.path.join(runs, "xml_glyphs")
    return [
        ("xml_vs_gap", [PY, "-m", "pml_extensions", "job", "--output", runs, "--new"] + dev, ["xml_vs_gap"]),
        ("xml_generalization", [PY, "benchmarks/xml_generalization.py", "--run-folder", job_folder,
                                "--splits", "200" if size == "quick" else "1000"] + dev, ["xml_generalization"]),
        ("xml_signal", [PY, "benchmarks/xml_signal.py", "--size", size] + dev, ["xml_signal"]),
        ("resolution_distillation", [PY, "benchmarks/resolution_distillation.py", "--size", size] + dev,
         ["resolution_distillation"]),
        ("template_block", [PY, "benchmarks/template_block.py", "--size", size] + dev, ["template_block"]),
        ("template_block_medium", [PY, "benchmarks/template_block.py", "--size", "medium", "--skip", "lambda",
                                   "ablation", "--tag", "_medium"] + dev, ["template_block_medium"]),
        ("explain_speed", [PY, "benchmarks/explain_speed.py"] + dev, ["explain_speed"]),
        ("explain_fidelity", [PY, "benchmarks/explain_fidelity.py", "--seeds", "0", "1", "2", "3", "4", "--queries",
                              "12", "--steps", "8", "--images", "32"] + dev, ["explain_fidelity"]),
        ("xml_overhead", [PY, "benchmarks/xml_overhead.py"] + dev, ["xml_overhead"]),
        ("distill_memory", [PY, "benchmarks/distill_memory.py", "--repeats", "3"] + dev, ["distill_memory_" + device]),
        ("localization", [PY, "benchmarks/localization.py", "--size", size] + dev, ["localization"]),
        ("mlrc_quick", [PY, "benchmarks/mlrc_quick.py"] + dev, ["mlrc_quick"]),
        ("accuracy_scale", [PY, "benchmarks/accuracy_scale.py"] + dev,
         ["accuracy_scale" + ("_cuda" if device == "cuda" else "")]),
    ]


def copy_job_results(runs: str) -> None:
    """``<runs>/xml_glyphs/results.{json,md}`` -> ``benchmarks/results/xml_vs_gap.{json,md}``."""
    for ext in ("json", "md"):
        shutil.copyfile(os.path.join(runs, "xml_glyphs", f"results.{ext}"), os.path.join(RESULTS, f"xml_vs_gap.{ext}"))


def main(argv=None) -> int:
    from tqdm import tqdm

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", choices=("quick", "full"), default="quick")
    p.add_argument("--device", default="cpu", help="cpu (quick) or cuda (full)")
    p.add_argument("--only", nargs="+", help="run only these steps")
    p.add_argument("--list", action="store_true", help="print the steps and their commands, run nothing")
    args = p.parse_args(argv)
    runs = os.path.join("runs", "reproduce", args.size)
    plan = steps(args.size, args.device, runs)
    names = [s[0] for s in plan]
    if args.only:
        unknown = sorted(set(args.only) - set(names))
        if unknown:
            p.error(f"--only: unknown steps {unknown}; steps are {names}")
        plan = [s for s in plan if s[0] in args.only]
    if args.list:
        for name, argv_, _ in plan:
            print(f"{name}: {' '.join('python' if a == PY else a for a in argv_)}")
        return 0
    os.makedirs(os.path.join(ROOT, runs), exist_ok=True)
    os.makedirs(RESULTS, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    failed, timings = [], {}
    bar = tqdm(plan, desc=f"reproduce ({args.size})", unit="step")
    for name, cmd, _ in bar:
        bar.set_postfix_str(name)
        log_path = os.path.join(ROOT, runs, f"{name}.log")
        start = time.time()
        with open(log_path, "w", encoding="utf-8") as log:
            rc = subprocess.call(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        if rc == 0 and name == "xml_vs_gap":
            copy_job_results(os.path.join(ROOT, runs))
        timings[name] = time.time() - start
        if rc != 0:
            failed.append(name)
            with open(log_path, encoding="utf-8", errors="replace") as f:
                tail = f.read()[-1500:]
            tqdm.write(f"step {name} failed (exit {rc}); end of {log_path}:\n{tail}")
        else:
            tqdm.write(f"step {name}: done in {timings[name]:.0f} s")
    rc = subprocess.call([PY, os.path.join("benchmarks", "readme_tables.py")], cwd=ROOT, env=env)
    if rc != 0:
        failed.append("readme_tables")
    print(f"reproduce ({args.size}): {len(plan) - len(failed)} of {len(plan)} steps done"
          + (f"; failed: {', '.join(failed)}" if failed else "") + ", README tables updated")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
