"""The shipped MLRC configs' ``quick`` variants, run through the CLI: the docs' "MLRC quick configs" table.

Each config runs as a user would run it (``python -m pml_extensions run NAME --variant quick``, glyphs, one seed,
class-disjoint folds with early stopping on validation classes) into ``runs/mlrc_quick/``; its ``results.json``
gives the test accuracy of the four fold models (128D: mean over the models; 512D: their concatenated
embeddings) and the wall time. One seed per config: the table shows that every config trains and what it reaches
at smoke scale; it is not a comparison between configs (the paired, multi-seed comparisons are the other tables).

    python benchmarks/mlrc_quick.py                       # all six configs, about 4 minutes on 2 CPU cores
    python benchmarks/mlrc_quick.py --configs contrastive template_block

Writes ``benchmarks/results/mlrc_quick.json`` and ``.md`` (the docs' ``results:mlrc_quick`` block).
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

from pml_extensions.utils.atomic_io import atomic_write_json, atomic_write_text

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

RESULTS = os.path.join(ROOT, "benchmarks", "results")
CONFIGS = ("contrastive", "contrastive_xml", "proxy_anchor", "proxy_anchor_xml", "template_block", "explanation")
METRICS = ("mean_average_precision_at_r", "precision_at_1")


def run_config(name: str, runs: str, device: str) -> dict:
    """Run one config's quick variant afresh; returns its row (or ``{"config", "failed"}``).

    The config's experiment folder ``<runs>/<name>_quick`` is deleted first: the runner resumes a folder whose
    config is unchanged (``--new`` only acts on a changed config), so a kept folder would report its old results
    and the few seconds of the resume after any change to the code."""
    folder = os.path.join(runs, f"{name}_quick")
    shutil.rmtree(folder, ignore_errors=True)
    cmd = [
        sys.executable,
        "-m",
        "pml_extensions",
        "run",
        name,
        "--variant",
        "quick",
        "--root_experiment_folder",
        runs,
        "--device",
        device,
    ]
    start = time.time()
    proc = subprocess.run(
        cmd,
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")),
    )
    wall = time.time() - start
    if proc.returncode != 0:
        return {"config": name, "failed": (proc.stderr.strip().splitlines() or ["?"])[-1][:200]}
    with open(os.path.join(folder, "results.json"), encoding="utf-8") as f:
        res = json.load(f)
    row = {"config": name, "seconds": res["seconds"], "wall_seconds": wall}
    for split, label in (("separate_128D", "128D"), ("concatenated_512D", "512D")):
        for m in METRICS:
            row[f"{m}_{label}"] = res["test"][split][m]
    return row


def render(rows, device) -> str:
    lines = [
        f"`python benchmarks/mlrc_quick.py` (`run NAME --variant quick --device {device}`: glyphs, one seed; "
        "128D = mean of the four fold models, 512D = their concatenation; seconds = the protocol's own time)",
        "",
        "| config | MAP@R 128D | P@1 128D | MAP@R 512D | P@1 512D | seconds |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "failed" in r:
            lines.append(f"| {r['config']} | failed: {r['failed']} | | | | |")
            continue
        cells = [r[f"{m}_{d}"] for d in ("128D", "512D") for m in METRICS]
        lines.append(f"| {r['config']} | " + " | ".join(f"{v:.3f}" for v in cells) + f" | {r['seconds']:.0f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=CONFIGS)
    p.add_argument("--device", default="cpu")
    p.add_argument("--runs", default=os.path.join("runs", "mlrc_quick"), help="experiment folder root")
    p.add_argument("--out", default=os.path.join(RESULTS, "mlrc_quick"), help="results path without extension")
    args = p.parse_args(argv)
    runs = os.path.abspath(args.runs)
    rows = []
    for name in args.configs:
        rows.append(run_config(name, runs, args.device))
        print(f"{name}: " + ("failed" if "failed" in rows[-1] else f"{rows[-1]['seconds']:.0f} s"), flush=True)
    atomic_write_json(args.out + ".json", {"args": vars(args), "rows": rows})
    atomic_write_text(args.out + ".md", render(rows, args.device))
    print(render(rows, args.device))
    return 1 if any("failed" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
