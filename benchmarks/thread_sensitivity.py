"""How far the main job's numbers move with the torch thread count (issue 24, item 5).

CPU reductions (matmul, convolution) split their sums by thread, so the same config gives other float round-off
with another thread count, and a short run from random weights amplifies it. This reruns the main job
(``python -m pml_extensions job``, the README's first command) with ``OMP_NUM_THREADS`` = each count and compares
the runs number by number: every per-seed MAP@R, every variant's mean, every paired comparison (mean difference,
95 % interval) and its verdict. The verdicts — not the digits — must not change; if they do, that is reported.

    python benchmarks/thread_sensitivity.py --threads 1 2                       # both runs, then the table
    python benchmarks/thread_sensitivity.py --run 1 --out runs/threads           # one run (a reproduce.py part)
    python benchmarks/thread_sensitivity.py --compare runs/threads/threads_1/xml_glyphs runs/xml_glyphs

``--compare`` takes finished job folders; each one's thread count is read from its ``environment.json``.
Writes ``benchmarks/results/thread_sensitivity.json`` and ``.md``.
"""

import argparse
import json
import os
import subprocess
import sys

from pml_extensions.runner.experiment.folder import ENVIRONMENT_NAME, environment_summary
from pml_extensions.runner.outputs.results import verdict
from pml_extensions.utils.atomic_io import atomic_write_json, atomic_write_text

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

METRIC = "mean_average_precision_at_r"


def run_job(threads: int, out: str) -> str:
    """The main job with ``threads`` torch threads in ``<out>/threads_<n>``; returns its folder."""
    root = os.path.join(out, f"threads_{threads}")
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), TQDM_DISABLE="1")
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, "-m", "pml_extensions", "job", "--root_experiment_folder", root, "--new", "--device", "cpu"]
    subprocess.run(cmd, cwd=ROOT, env=env, check=True)
    return os.path.join(root, "xml_glyphs")


def load(folder: str) -> dict:
    with open(os.path.join(folder, "results.json"), encoding="utf-8") as f:
        results = json.load(f)
    with open(os.path.join(folder, ENVIRONMENT_NAME), encoding="utf-8") as f:
        results["environment"] = json.load(f)
    return results


def _claim(text: str) -> str:
    """The verdict of a :func:`verdict` line (the words after its last colon)."""
    return text.rsplit(": ", 1)[-1]


def compare(folders) -> dict:
    """Per number, its value in every run and the largest move; per comparison, the verdicts."""
    runs = [load(f) for f in folders]
    threads = [r["environment"]["torch_threads"] for r in runs]
    numbers, comparisons = [], []
    for name, v in runs[0]["variants"].items():
        for seed in v["per_seed"]:
            values = [r["variants"][name]["per_seed"][seed][METRIC] for r in runs]
            numbers.append({"what": f"{name} seed {seed}", "values": values})
        numbers.append({"what": f"{name} mean", "values": [r["variants"][name]["mean"][METRIC] for r in runs]})
    for i, c in enumerate(runs[0]["comparisons"]):
        rows = [r["comparisons"][i] for r in runs]
        assert all((x["variant"], x["baseline"]) == (c["variant"], c["baseline"]) for x in rows)
        claims = [_claim(verdict(x)) for x in rows]
        comparisons.append(
            {
                "comparison": f"{c['variant']} − {c['baseline']}",
                "mean_difference": [x["mean_difference"] for x in rows],
                "ci95": [x["ci95"] for x in rows],
                "verdicts": claims,
                "same_verdict": len(set(claims)) == 1,
            }
        )
    for n in numbers:
        n["max_move"] = max(n["values"]) - min(n["values"])
    return {
        "threads": threads,
        "folders": [os.path.relpath(f, ROOT) for f in folders],
        "environments": [environment_summary(r["environment"]) for r in runs],
        "numbers": numbers,
        "comparisons": comparisons,
        "max_move_per_seed": max(n["max_move"] for n in numbers if "seed" in n["what"]),
        "max_move_mean": max(n["max_move"] for n in numbers if n["what"].endswith("mean")),
        "verdicts_unchanged": all(c["same_verdict"] for c in comparisons),
    }


def markdown(out: dict) -> str:
    t = out["threads"]
    head = " | ".join(f"{n} thread{'s' if n != 1 else ''}" for n in t)
    lines = [
        f"`python benchmarks/thread_sensitivity.py`: the main job (`python -m pml_extensions job`) rerun with "
        f"{', '.join(map(str, t))} torch threads on one machine ({out['environments'][0].split(', 1 torch')[0]}). "
        f"MAP@R moves by up to **{out['max_move_per_seed']:.4f}** per seed and **{out['max_move_mean']:.4f}** in a "
        f"variant's mean; the verdicts "
        + ("**do not change**." if out["verdicts_unchanged"] else "**change** (see the table): too little power.")
        + "",
        "",
        f"| comparison | mean difference ({head}) | 95 % CI ({head}) | verdict ({head}) |",
        "|---|---|---|---|",
    ]
    for c in out["comparisons"]:
        diffs = ", ".join(f"{d:+.4f}" for d in c["mean_difference"])
        cis = ", ".join("–" if ci is None else f"[{ci[0]:+.4f}, {ci[1]:+.4f}]" for ci in c["ci95"])
        verdicts = c["verdicts"][0] if c["same_verdict"] else " / ".join(c["verdicts"])
        lines.append(f"| {c['comparison']} | {diffs} | {cis} | {verdicts} |")
    lines += ["", f"| number | MAP@R ({head}) | moved by |", "|---|---|---|"]
    for n in out["numbers"]:
        lines.append(f"| {n['what']} | {', '.join(f'{v:.4f}' for v in n['values'])} | {n['max_move']:.4f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, nargs="+", help="run the job with each count, then compare")
    p.add_argument("--run", type=int, help="only run the job with this many threads (under --out)")
    p.add_argument("--compare", nargs="+", help="finished job folders to compare")
    p.add_argument("--out", default=os.path.join("runs", "thread_sensitivity"))
    p.add_argument("--results", default=os.path.join(ROOT, "benchmarks", "results"))
    args = p.parse_args(argv)
    if args.run is not None:
        run_job(args.run, args.out)
        return 0
    folders = args.compare or [run_job(n, args.out) for n in (args.threads or [1, 2])]
    if len(folders) < 2:
        p.error("compare at least two runs")
    out = compare(folders)
    text = markdown(out)
    atomic_write_json(os.path.join(args.results, "thread_sensitivity.json"), out, indent=1)
    atomic_write_text(os.path.join(args.results, "thread_sensitivity.md"), text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
