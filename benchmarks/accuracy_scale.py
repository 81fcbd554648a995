"""AccuracyCalculator at scale: stock PML vs the blocked torch k-NN engine (time, peak memory, metrics).

Every measurement runs in a fresh subprocess so its peak RSS (``ru_maxrss``) is its own; "increase" is the peak
minus the RSS just before ``get_accuracy`` (the embeddings and torch are already loaded). Embeddings: class
centres + noise, L2-normalised, 128-D (seeded). Metrics: MAP@R, P@1, R-precision with ``k="max_bin_count"``.
The stock path (PML's ``AccuracyCalculator``, faiss) is skipped when its estimated ``[N, k]`` buffers exceed
``--max-gib``; where both run, the ratio of times is in the same run and the metrics are compared.

    python benchmarks/accuracy_scale.py                    # CPU: 20k/6 classes (with stock), 100k/6, 300k/1000,
                                                           # 30k items in 10,000 classes of 3 (memory)
    python benchmarks/accuracy_scale.py --device cuda      # GPU: 100k/6 classes and 1M/1000 classes
    python benchmarks/accuracy_scale.py --cases 20000:6    # any N:classes list

Writes benchmarks/results/accuracy_scale.json and the markdown table benchmarks/results/accuracy_scale.md
(``--device cuda`` writes accuracy_scale_cuda.*; without a CUDA device it says so and skips).
"""

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from pml_extensions.utils.atomic_io import atomic_write_json, atomic_write_text  # noqa: E402

RESULTS = os.path.join(ROOT, "benchmarks", "results")
METRICS = ("mean_average_precision_at_r", "precision_at_1", "r_precision")
CPU_CASES = ["20000:6", "100000:6", "300000:1000", "30000:10000"]
CUDA_CASES = ["100000:6", "1000000:1000"]


def _child(method: str, n: int, classes: int, dim: int, device: str, seed: int, label_offset: int) -> dict:
    import resource

    import torch
    from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator

    from pml_extensions.utils import AsymmetricAccuracyCalculator, ChunkedAccuracyCalculator

    dev = torch.device(device)
    g = torch.Generator(device=dev).manual_seed(seed)
    if classes * 3 == n:  # many small classes: exactly 3 items each
        labels = torch.randperm(n, generator=g, device=dev) // 3
    else:
        labels = torch.randint(0, classes, (n,), generator=g, device=dev)
    centers = torch.randn(classes, dim, generator=g, device=dev)
    emb = torch.nn.functional.normalize(centers[labels] + 2.0 * torch.randn(n, dim, generator=g, device=dev), dim=1)
    labels = labels + label_offset  # e.g. 10**9: beyond float32's exact integers
    kwargs = dict(include=METRICS, k="max_bin_count", device=dev)
    if method == "stock":
        calc = AccuracyCalculator(**kwargs)
    elif method == "engine":
        calc = ChunkedAccuracyCalculator(**kwargs)
    elif method == "asymmetric_k_none":  # the default calculator of AsymmetricTester: ranks every reference
        calc = AsymmetricAccuracyCalculator(include=METRICS, device=dev)
    else:
        raise ValueError(f"unknown method {method!r}")
    if dev.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    load_before = os.getloadavg()[0]  # other work on the machine slows every row; recorded, not hidden
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB
    t0 = time.perf_counter()
    acc = calc.get_accuracy(emb, labels)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    out = {
        "method": method,
        "n": n,
        "classes": classes,
        "label_offset": label_offset,
        "dim": dim,
        "device": device,
        "seconds": seconds,
        "peak_rss_gib": peak,
        "rss_increase_gib": peak - rss_before,
        "torch_threads": torch.get_num_threads(),
        "load_average_before": load_before,
        **acc,
    }
    if dev.type == "cuda":
        out["peak_gpu_gib"] = torch.cuda.max_memory_allocated() / 2**30
        out["gpu"] = torch.cuda.get_device_name()
    return out


def stock_estimate_gib(n: int, classes: int) -> float:
    """Stock path: [N, k] distances (float32) + indices (int64) + labels (float32) + masks, k ≈ N / classes."""
    return n * (n / classes) * (4 + 8 + 4 + 2) / 2**30


def _run_child(method, n, classes, args):
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--child",
        method,
        str(n),
        str(classes),
        "--dim",
        str(args.dim),
        "--device",
        args.device,
        "--seed",
        str(args.seed),
        "--label-offset",
        str(args.label_offset),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not line:
        why = (proc.stderr.strip().splitlines() or ["killed"])[-1][:100]
        return {"method": method, "n": n, "classes": classes, "skipped": f"failed (exit {proc.returncode}): {why}"}
    return json.loads(line[0][7:])


def render(rows, device) -> str:
    def key(r):
        return r["n"], r["classes"], r.get("label_offset", 0)

    stock = {key(r): r for r in rows if r["method"] == "stock" and "skipped" not in r}
    lines = [
        "| N × D | classes | device | method | seconds | time / stock | peak RSS (GiB) | RSS increase (GiB) | "
        "MAP@R | P@1 | R-precision |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        labels = f" (labels {r['label_offset']:.0e} + c)" if r.get("label_offset") else ""
        head = f"| {r['n']:,} × {r.get('dim', 128)} | {r['classes']:,}{labels} | {device} | {r['method']} |"
        if "skipped" in r:
            lines.append(f"{head} – | – | – | – | {r['skipped']} | | |")
            continue
        ref = stock.get(key(r))
        ratio = f"{r['seconds'] / ref['seconds']:.2f}" if ref and r["method"] == "engine" else "–"
        mem = f"{r['peak_rss_gib']:.2f}" + (f" (GPU {r['peak_gpu_gib']:.2f})" if "peak_gpu_gib" in r else "")
        lines.append(
            f"{head} {r['seconds']:.1f} | {ratio} | {mem} | {r['rss_increase_gib']:.2f} | "
            f"{r['mean_average_precision_at_r']:.5f} | {r['precision_at_1']:.5f} | {r['r_precision']:.5f} |"
        )
    return "\n".join(lines) + "\n"


def _save(rows, args, base):
    same = {}
    for r in rows:
        if r["method"] != "engine" or "skipped" in r or r.get("label_offset"):
            continue  # labels 10^9 + c: stock PML merges classes when it casts them to float32
        s = next(
            (
                x
                for x in rows
                if x["method"] == "stock"
                and "skipped" not in x
                and not x.get("label_offset")
                and (x["n"], x["classes"]) == (r["n"], r["classes"])
            ),
            None,
        )
        if s:
            same[f"{r['n']}:{r['classes']}"] = max(abs(r[m] - s[m]) for m in METRICS)
    cmd = "python benchmarks/accuracy_scale.py" + (" --device cuda" if args.device == "cuda" else "")
    loads = [r["load_average_before"] for r in rows if "load_average_before" in r]
    load = f", 1-min load average before the rows {min(loads):.1f}–{max(loads):.1f}" if loads else ""
    text = (
        f'`{cmd}` (128-D, `k="max_bin_count"`, MAP@R / P@1 / R-precision; engine = '
        "`ChunkedAccuracyCalculator()` on the torch k-NN engine; one subprocess per row, "
        f"{rows[0].get('torch_threads', '?') if rows else '?'} torch threads, {os.cpu_count()} cores{load})\n\n"
        + render(rows, args.device)
    )
    if same:
        text += (
            "\nLargest |engine − stock| over the three metrics: "
            + ", ".join(f"{k}: {v:.1e}" for k, v in same.items())
            + "\n"
        )
    if any(r.get("label_offset") for r in rows):
        text += (
            "\nRows with labels 10⁹ + c: stock PML casts labels to float32 and merges neighbouring classes, so "
            "its metrics (and its class count, hence memory) there are wrong; the engine keeps them exact.\n"
        )
    atomic_write_json(
        base + ".json",
        {
            "args": {k: v for k, v in vars(args).items() if k != "child"},
            "rows": rows,
            "max_abs_difference_vs_stock": same,
        },
    )
    atomic_write_text(base + ".md", text)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", nargs="+", help="N:classes pairs (default: the issue's sizes for the device)")
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--max-gib", type=float, default=6.0, help="skip the stock path above this estimate")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--methods", nargs="+", choices=["stock", "engine", "asymmetric_k_none"], help="subset to run")
    p.add_argument("--label-offset", type=int, default=0, help="add this to every label (e.g. 1000000000)")
    p.add_argument("--out", help="results path without extension (default benchmarks/results/accuracy_scale[_cuda])")
    p.add_argument("--child", nargs=3, metavar=("METHOD", "N", "CLASSES"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        out = _child(
            args.child[0], int(args.child[1]), int(args.child[2]), args.dim, args.device, args.seed, args.label_offset
        )
        print("RESULT " + json.dumps(out))
        return 0
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print(
                "no CUDA device on this machine: the --device cuda sizes (1M x 128 / 1000 classes, "
                "100k x 128 / 6 classes) are skipped; nothing written"
            )
            return 0
    cases = [
        tuple(int(v) for v in c.split(":"))
        for c in (args.cases or (CUDA_CASES if args.device == "cuda" else CPU_CASES))
    ]
    base = args.out or os.path.join(RESULTS, "accuracy_scale" + ("_cuda" if args.device == "cuda" else ""))
    os.makedirs(os.path.dirname(os.path.abspath(base)), exist_ok=True)
    rows = []
    for n, classes in cases:
        methods = ["stock", "engine"] + (["asymmetric_k_none"] if classes * 3 == n else [])
        methods = [m for m in methods if not args.methods or m in args.methods]
        for method in methods:
            est = stock_estimate_gib(n, classes)
            if method == "stock" and est > args.max_gib:
                rows.append(
                    {
                        "method": method,
                        "n": n,
                        "classes": classes,
                        "skipped": f"not run: estimated {est:.1f} GiB > {args.max_gib} GiB",
                    }
                )
            else:
                t0 = time.time()
                rows.append(_run_child(method, n, classes, args))
                print(f"{n} {classes} {method}: {time.time() - t0:.0f} s", flush=True)
            _save(rows, args, base)  # after every row, so a long run leaves its finished rows behind
    print(open(base + ".md").read())
    print(f"wrote {base}.json and {base}.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
