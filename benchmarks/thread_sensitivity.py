"""How far the main job's numbers move with the torch thread count (issue 24, item 5).

CPU reductions (matmul, convolution) split their sums by thread, so the same config gives other float round-off
with another thread count, and a short run from random weights amplifies it. This reruns the main job
(``python -m pml_extensions job``, the README's first command) with ``OMP_NUM_THREADS`` = each count and compares
the runs number by number: every per-seed MAP@R, every variant's mean, every paired comparison (mean difference,
95 % interval) and its verdict. The verdicts — not the digits — must not change; if they do, that is reported. The
main job is a smoke test, not evidence on the XML claim; its comparisons are read here as that claim (XML > GAP,
``"greater"``; the λ = 0 twin against GAP, the pairing check, ``"on_par"``) with XML's smallest effect of interest
:data:`SMALLEST_EFFECT` = 1 MAP@R point and the runner's rules
(:func:`pml_extensions.runner.outputs.results.summarize`, Holm over a run's comparisons), only to see whether the
thread count moves a verdict.

    python benchmarks/thread_sensitivity.py --threads 1 2                       # both runs, then the table
    python benchmarks/thread_sensitivity.py --run 1 --out runs/threads           # one run (a reproduce.py part)
    python benchmarks/thread_sensitivity.py --compare runs/threads/threads_1/xml_glyphs runs/xml_glyphs

    python benchmarks/thread_sensitivity.py --from-json       # the table again from its .json (per-seed values)

``--compare`` takes finished job folders; each one's thread count is read from its ``environment.json``.
Writes ``benchmarks/results/thread_sensitivity.json`` and ``.md``.
"""

import argparse
import json
import os
import subprocess
import sys

from pml_extensions.runner.experiment.folder import ENVIRONMENT_NAME, environment_summary
from pml_extensions.runner.outputs.results import summarize
from pml_extensions.utils.atomic_io import atomic_write_json, atomic_write_text

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

METRIC = "mean_average_precision_at_r"
#: δ of every comparison (MAP@R as a fraction: 1 point), the evidence guide's smallest effect for XML
SMALLEST_EFFECT = 0.01


def claim(variant: str, baseline: str) -> str:
    """The direction of a main-job comparison: a λ = 0 twin (HistogramPooling without the XML term) against GAP is
    the pairing check, ``"on_par"``; every other one is XML's claim, ``"greater"``."""
    return "on_par" if variant.endswith("_lambda0") else "greater"


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


def verdicts(variants: dict, pairs) -> list:
    """The runner's comparisons of ``pairs`` on MAP@R as claims (:func:`claim`, δ = :data:`SMALLEST_EFFECT`, Holm
    over them) from a run's ``variants`` (``{name: {"per_seed": {seed: {metric: value}}}}``)."""
    per_seed = {name: v["per_seed"] for name, v in variants.items()}
    claims = {(v, b): claim(v, b) for v, b in pairs}
    return summarize(per_seed, pairs, [METRIC], smallest_effects=SMALLEST_EFFECT, claims=claims)["comparisons"]


def summary(runs: list, pairs) -> dict:
    """Per number, its value in every run and the largest move; per comparison, the verdicts (one per run)."""
    numbers, comparisons = [], []
    for name, v in runs[0]["variants"].items():
        for seed in v["per_seed"]:
            values = [r["variants"][name]["per_seed"][seed][METRIC] for r in runs]
            numbers.append({"what": f"{name} seed {seed}", "values": values})
        numbers.append({"what": f"{name} mean", "values": [r["variants"][name]["mean"][METRIC] for r in runs]})
    claimed = [verdicts(r["variants"], pairs) for r in runs]
    for i, (variant, baseline) in enumerate(pairs):
        rows = [c[i] for c in claimed]
        words = [x["verdict"] for x in rows]
        comparisons.append(
            {
                "comparison": f"{variant} − {baseline}",
                "claim": rows[0]["claim"],
                "mean_difference": [x["mean_difference"] for x in rows],
                "ci95": [x["ci95"] for x in rows],
                "verdicts": words,
                "same_verdict": len(set(words)) == 1,
            }
        )
    for n in numbers:
        n["max_move"] = max(n["values"]) - min(n["values"])
    return {
        "numbers": numbers,
        "comparisons": comparisons,
        "max_move_per_seed": max(n["max_move"] for n in numbers if "seed" in n["what"]),
        "max_move_mean": max(n["max_move"] for n in numbers if n["what"].endswith("mean")),
        "verdicts_unchanged": all(c["same_verdict"] for c in comparisons),
    }


def compare(folders) -> dict:
    """Per number, its value in every run and the largest move; per comparison, the verdicts."""
    runs = [load(f) for f in folders]
    pairs = list(dict.fromkeys((c["variant"], c["baseline"]) for c in runs[0]["comparisons"] if c["metric"] == METRIC))
    return {
        "threads": [r["environment"]["torch_threads"] for r in runs],
        "folders": [os.path.relpath(f, ROOT) for f in folders],
        "environments": [environment_summary(r["environment"]) for r in runs],
        **summary(runs, pairs),
    }


def rerender(out: dict) -> dict:
    """A stored ``thread_sensitivity.json`` with its comparisons and verdicts computed again from the per-seed values
    it keeps (``numbers``), as :func:`compare` writes them."""
    runs = [{"variants": {}} for _ in out["threads"]]
    for n in out["numbers"]:
        if " seed " not in n["what"]:
            continue
        name, seed = n["what"].rsplit(" seed ", 1)
        for run, value in zip(runs, n["values"]):
            run["variants"].setdefault(name, {"per_seed": {}})["per_seed"][seed] = {METRIC: value}
    for run in runs:  # the means, as summarize computes them
        run["variants"] = summarize({k: v["per_seed"] for k, v in run["variants"].items()})["variants"]
    pairs = [tuple(c["comparison"].split(" − ")) for c in out["comparisons"]]
    return {**out, **summary(runs, pairs)}


def markdown(out: dict) -> str:
    t = out["threads"]
    head = " | ".join(f"{n} thread{'s' if n != 1 else ''}" for n in t)
    lines = [
        f"`python benchmarks/thread_sensitivity.py`: the main job (`python -m pml_extensions job`) rerun with "
        f"{', '.join(map(str, t))} torch threads on one machine ({out['environments'][0].split(', 1 torch')[0]}). "
        f"MAP@R moves by up to **{out['max_move_per_seed']:.4f}** per seed and **{out['max_move_mean']:.4f}** in a "
        f"variant's mean; the verdicts (claims read with δ = {100 * SMALLEST_EFFECT:g} MAP@R point, the main job "
        "being a smoke test) "
        + ("**do not change**." if out["verdicts_unchanged"] else "**change** (see the table): too little power.")
        + "",
        "",
        f"| comparison | claim | mean difference ({head}) | 95 % CI ({head}) | verdict ({head}) |",
        "|---|---|---|---|---|",
    ]
    for c in out["comparisons"]:
        diffs = ", ".join(f"{d:+.4f}" for d in c["mean_difference"])
        cis = ", ".join("–" if ci is None else f"[{ci[0]:+.4f}, {ci[1]:+.4f}]" for ci in c["ci95"])
        words = c["verdicts"][0] if c["same_verdict"] else " / ".join(c["verdicts"])
        claim_text = {"greater": "greater", "on_par": "on par"}.get(c.get("claim"), "–")
        lines.append(f"| {c['comparison']} | {claim_text} | {diffs} | {cis} | {words} |")
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
    p.add_argument("--from-json", action="store_true", help="render thread_sensitivity.json / .md again from the json")
    args = p.parse_args(argv)
    if args.from_json:
        with open(os.path.join(args.results, "thread_sensitivity.json"), encoding="utf-8") as f:
            out = rerender(json.load(f))
        return _write(out, args.results)
    if args.run is not None:
        run_job(args.run, args.out)
        return 0
    folders = args.compare or [run_job(n, args.out) for n in (args.threads or [1, 2])]
    if len(folders) < 2:
        p.error("compare at least two runs")
    return _write(compare(folders), args.results)


def _write(out: dict, results: str) -> int:
    text = markdown(out)
    atomic_write_json(os.path.join(results, "thread_sensitivity.json"), out, indent=1)
    atomic_write_text(os.path.join(results, "thread_sensitivity.md"), text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
