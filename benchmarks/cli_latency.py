"""How fast the command line answers when it trains nothing (issue 21, item 6: "about one second on 2 cores").

Each row is a fresh ``python -m pml_extensions ...`` process, timed from start to exit (median of --repeats runs),
with the exit status it must have; next to it, in the same run, the interpreter alone (``python -c pass``) and the
import of torch (``python -c "import torch"``), the floor and the cost the command line avoids. The class index
(``pml_extensions.runner.config.registry``) is warm for every row (built once before the rows), and one row times
the cold start: ``--dry-run`` with an empty cache folder, which builds the index once (what a first call costs).

    python benchmarks/cli_latency.py                 # --repeats 5
    python benchmarks/cli_latency.py --repeats 9

Writes benchmarks/results/cli_latency.json and .md. Timings on a shared machine are noisy: read the ratios.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from pml_extensions.utils.atomic_io import atomic_write_json, atomic_write_text

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: (label, argv after ``python -m pml_extensions``, expected exit status)
ROWS = [
    ("run --help", ["run", "--help"], 0),
    ("job --help", ["job", "--help"], 0),
    ("explain --help", ["explain", "--help"], 0),
    ("run --list", ["run", "--list"], 0),
    ("run --list loss", ["run", "--list", "loss"], 0),
    ("run contrastive --variant quick --dry-run", ["run", "contrastive", "--variant", "quick", "--dry-run"], 0),
    ("config error: top-level typo (--num_epoch 3)", ["run", "contrastive", "--num_epoch", "3"], 2),
    (
        "config error: class argument typo (xml_wieght)",
        ["run", "contrastive_xml", "--variant", "quick", "--loss_funcs~APPLY~3", "{xml_wieght: 0.1}"],
        2,
    ),
    ("config error: --patience -1", ["run", "contrastive", "--variant", "quick", "--patience", "-1"], 2),
    ("config error: malformed YAML value", ["run", "contrastive", "--trainer~APPLY~2", "{batch_size: [}"], 2),
    (
        "config error: dataset without ~OVERRIDE~",
        ["run", "contrastive", "--variant", "quick", "--dataset", "{ImageFolderSplit: {root: photos}}"],
        2,
    ),
]


def timed(argv, env, status=None, cwd=None) -> float:
    start = time.perf_counter()
    out = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=600)
    seconds = time.perf_counter() - start
    if status is not None and out.returncode != status:
        raise SystemExit(f"{' '.join(argv)}: exit {out.returncode}, expected {status}: {out.stderr[-500:]}")
    return seconds


def median_of(repeats, argv, env, status=None, cwd=None) -> float:
    return statistics.median(timed(argv, env, status, cwd) for _ in range(repeats))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default=os.path.join(REPO, "benchmarks", "results"))
    args = p.parse_args(argv)
    python = sys.executable
    cache = tempfile.mkdtemp(prefix="cli_latency_cache_")
    env = dict(os.environ, PYTHONPATH=REPO, OMP_NUM_THREADS="1", PML_EXTENSIONS_CACHE_DIR=cache)
    work = tempfile.mkdtemp(prefix="cli_latency_run_")  # nothing is written, but never in the checkout
    cold_rows = []
    for _ in range(max(1, min(3, args.repeats))):  # each cold run starts with an empty cache folder
        env_cold = dict(env, PML_EXTENSIONS_CACHE_DIR=tempfile.mkdtemp(prefix="cli_latency_cold_"))
        cold_rows.append(timed([python, "-m", "pml_extensions"] + ROWS[5][1], env_cold, 0, work))
    timed([python, "-m", "pml_extensions", "run", "--list"], env, 0, work)  # warms the index for the rows
    floor = median_of(args.repeats, [python, "-c", "pass"], env)
    torch_import = median_of(args.repeats, [python, "-c", "import torch"], env)
    rows = []
    for label, cli, status in ROWS:
        seconds = median_of(args.repeats, [python, "-m", "pml_extensions"] + cli, env, status, work)
        rows.append({"command": label, "seconds": seconds, "exit": status})
        print(f"{label}: {seconds:.3f} s", flush=True)
    cold = statistics.median(cold_rows)
    results = {
        "repeats": args.repeats,
        "cpu_count": os.cpu_count(),
        "python_pass_seconds": floor,
        "import_torch_seconds": torch_import,
        "cold_dry_run_seconds": cold,
        "rows": rows,
        "max_warm_seconds": max(r["seconds"] for r in rows),
        "note": "shared machine; medians of fresh processes",
    }
    os.makedirs(args.out, exist_ok=True)
    atomic_write_json(os.path.join(args.out, "cli_latency.json"), results, indent=2)
    lines = [
        f"`python benchmarks/cli_latency.py` ({os.cpu_count()} CPU cores, shared with other work; median of "
        f"{args.repeats} fresh processes; class index warm unless said):",
        "",
        "| command | time (s) | / `python -c pass` | / `import torch` | exit |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| `{r['command']}` | {r['seconds']:.3f} | {r['seconds'] / floor:.1f} | "
            f"{r['seconds'] / torch_import:.2f} | {r['exit']} |"
        )
    lines += [
        f"| `run contrastive --variant quick --dry-run`, cold (builds the class index) | {cold:.3f} | "
        f"{cold / floor:.1f} | {cold / torch_import:.2f} | 0 |",
        "",
        f'Floor: `python -c pass` {floor:.3f} s; `python -c "import torch"` {torch_import:.3f} s (what every '
        "command above used to load before printing). The cold row is paid once per installed torch / torchvision / "
        "PML versions and per edit of the package; the index lives in `~/.cache/pml_extensions` "
        "(`PML_EXTENSIONS_CACHE_DIR`).",
        "",
    ]
    atomic_write_text(os.path.join(args.out, "cli_latency.md"), "\n".join(lines))
    print(json.dumps({k: v for k, v in results.items() if k != "rows"}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
