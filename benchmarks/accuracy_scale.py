"""AccuracyCalculator at scale: stock PML vs ``ChunkedAccuracyCalculator`` (time and peak RSS).

Upstream, ``AccuracyCalculator(k="max_bin_count")`` on 100k x 128 embeddings with 6 classes asks faiss for
~16.7k neighbours of every query at once and runs out of memory. Each measurement runs in a fresh subprocess
so its peak RSS (``ru_maxrss``) is its own. The stock path is skipped when its estimated k-NN buffers exceed
``--max-gib``.

    python benchmarks/accuracy_scale.py               # quick default: N = 5k and 20k (both paths), ~3 min
    python benchmarks/accuracy_scale.py --sizes 100000 --chunk-size 2048   # the issue's size (stock skipped:
    >8 GiB)

Prints a markdown table and writes benchmarks/results/accuracy_scale.json.
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pml_extensions.utils.atomic_io import atomic_write_json

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def _child(method: str, n: int, dim: int, classes: int, chunk_size: int, seed: int) -> dict:
    import resource

    import torch

    from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator

    from pml_extensions.utils.chunked_accuracy_calculator import ChunkedAccuracyCalculator

    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, classes, (n,), generator=g)
    centers = torch.randn(classes, dim, generator=g)
    emb = torch.nn.functional.normalize(centers[labels] + 2.0 * torch.randn(n, dim, generator=g), dim=1)
    kwargs = dict(
        include=("mean_average_precision_at_r", "precision_at_1", "r_precision"),
        k="max_bin_count",
        device=torch.device("cpu"),
    )
    calc = (
        AccuracyCalculator(**kwargs)
        if method == "stock"
        else ChunkedAccuracyCalculator(chunk_size=chunk_size, **kwargs)
    )
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    t0 = time.perf_counter()
    acc = calc.get_accuracy(emb, labels)
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB
    return {
        "method": method,
        "n": n,
        "seconds": seconds,
        "peak_rss_gib": peak,
        "rss_before_gib": rss_before,
        **acc,
    }


def stock_estimate_gib(n: int, classes: int) -> float:
    """k-NN buffers of the stock path: distances (float32) + indices (int64) + labels (float32) + masks, ~[N,
    N/c]."""
    k = n / classes
    return n * k * (4 + 8 + 4 + 2) / 2**30


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--sizes", type=int, nargs="+", default=[5000, 20000], help="numbers of embeddings (quick: 5k, 20k)"
    )
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--classes", type=int, default=6)
    p.add_argument("--chunk-size", type=int, default=1024)
    p.add_argument("--max-gib", type=float, default=8.0, help="skip the stock path above this estimate")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=os.path.join(RESULTS, "accuracy_scale.json"))
    p.add_argument("--child", nargs=2, metavar=("METHOD", "N"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        out = _child(args.child[0], int(args.child[1]), args.dim, args.classes, args.chunk_size, args.seed)
        print("RESULT " + json.dumps(out))
        return 0
    print(
        "quick default: --sizes 5000 20000; the issue's size: "
        f"--sizes 100000 (stock skipped above {args.max_gib} GiB)"
    )
    rows = []
    for n in args.sizes:
        for method in ("stock", "chunked"):
            est = stock_estimate_gib(n, args.classes)
            if method == "stock" and est > args.max_gib:
                rows.append(
                    {"method": method, "n": n, "skipped": f"estimated {est:.1f} GiB > {args.max_gib} GiB"}
                )
                continue
            cmd = [
                sys.executable,
                os.path.abspath(__file__),
                "--child",
                method,
                str(n),
                "--dim",
                str(args.dim),
                "--classes",
                str(args.classes),
                "--chunk-size",
                str(args.chunk_size),
                "--seed",
                str(args.seed),
            ]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
            if proc.returncode != 0 or not line:
                rows.append(
                    {
                        "method": method,
                        "n": n,
                        "skipped": f"failed (exit {proc.returncode}): "
                        + (proc.stderr.strip().splitlines() or ["killed"])[-1][:80],
                    }
                )
                continue
            rows.append(json.loads(line[0][7:]))
    print("| N | method | seconds | peak RSS (GiB) | MAP@R | P@1 | R-precision |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        if "skipped" in r:
            print(f"| {r['n']} | {r['method']} | – | – | {r['skipped']} | | |")
        else:
            print(
                f"| {r['n']} | {r['method']} | {r['seconds']:.1f} | {r['peak_rss_gib']:.2f} | "
                f"{r['mean_average_precision_at_r']:.5f} | "
                f"{r['precision_at_1']:.5f} | {r['r_precision']:.5f} |"
            )
    path = args.out
    atomic_write_json(path, {"args": {k: v for k, v in vars(args).items() if k != "child"}, "rows": rows})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
