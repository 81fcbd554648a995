"""AccuracyCalculator at scale: the exact k-NN engine against the float32 GEMM floor, faiss and stock PML.

Every measurement runs in a fresh subprocess so its peak RSS (``ru_maxrss``) is its own; "increase" is the peak minus
the peak before the timed call (embeddings and libraries already loaded). Embeddings: class centres + noise,
L2-normalised, 128-D (seeded). Metrics: MAP@R, P@1, R-precision with ``k="max_bin_count"``. A case ``N:classes`` is
self-retrieval (every embedding a query against all others); ``N:classes:q`` evaluates N separate queries against
N references (same classes). Rows per case:

- ``gemm_floor``: float32 GEMM of every query block against all references into one reused buffer, nothing else
  (the arithmetic any exact float32 method does);
- ``faiss``: ``faiss.IndexFlatIP.search`` for k + 1 (self) or k neighbours, nothing else;
- ``stock``: PML's ``AccuracyCalculator`` (faiss ``IndexFlatL2`` + its metrics), skipped (a row says why) when its
  projected peak RSS (:func:`stock_estimate_gib`) is above ``--max-gib`` (default 6);
- ``engine``: ``ChunkedAccuracyCalculator()`` (the exact engine + metrics), with the seconds of each stage summed
  over the engine's worker threads (``gemm``, ``selection``, ``rescore``, ``rank``, ``metrics``) and what it did;
- ``engine_before`` (with ``--before REF``): the same calculator from git revision REF, for the memory comparison
  (``--before-max-n N``: only for cases with at most N embeddings; larger ones get a row saying so);
- ``asymmetric_k_none`` (the 10,000-class memory case): ``AsymmetricAccuracyCalculator()`` ranking every reference.

    python benchmarks/accuracy_scale.py                      # CPU: the issue-25 sizes + the earlier memory cases
    python benchmarks/accuracy_scale.py --before 5414b06     # + the engine as of that revision
    python benchmarks/accuracy_scale.py --cases 100000:1000 100000:1000:q 20000:6 300000:1000 \
        --before 5414b06 --before-max-n 100000                # the issue-25 table
    python benchmarks/accuracy_scale.py --device cuda        # GPU: 100k/1000 (self, queries), 100k/6, 1M/1000
    python benchmarks/accuracy_scale.py --cases 20000:6 --methods engine stock

Writes benchmarks/results/accuracy_scale.json and the markdown table benchmarks/results/accuracy_scale.md
(``--device cuda`` writes accuracy_scale_cuda.*; without a CUDA device it says so and skips).
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results")
METRICS = ("mean_average_precision_at_r", "precision_at_1", "r_precision")
CPU_CASES = ["100000:1000", "100000:1000:q", "20000:6", "300000:1000", "100000:6", "30000:10000"]
CUDA_CASES = ["100000:1000", "100000:1000:q", "100000:6", "1000000:1000"]
ALL_METHODS = ["gemm_floor", "faiss", "stock", "engine", "engine_before", "asymmetric_k_none"]
STAGES = ("gemm", "selection", "rescore", "rank", "metrics")


def parse_case(text: str):
    """``N:classes`` or ``N:classes:q`` -> (N, classes, separate_queries)."""
    parts = text.split(":")
    if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] != "q") or not all(p.isdigit() for p in parts[:2]):
        raise SystemExit(f"--cases: expected N:classes or N:classes:q, got {text!r}")
    return int(parts[0]), int(parts[1]), len(parts) == 3


def make_data(n, classes, queries, dim, dev, seed, label_offset):
    """(query, query_labels, reference, reference_labels); reference is None for self-retrieval."""
    import torch

    g = torch.Generator(device=dev).manual_seed(seed)
    total = 2 * n if queries else n
    if classes * 3 == n and not queries:  # many small classes: exactly 3 items each
        labels = torch.randperm(n, generator=g, device=dev) // 3
    else:
        labels = torch.randint(0, classes, (total,), generator=g, device=dev)
    centers = torch.randn(classes, dim, generator=g, device=dev)
    emb = torch.nn.functional.normalize(centers[labels] + 2.0 * torch.randn(total, dim, generator=g, device=dev), dim=1)
    labels = labels + label_offset  # e.g. 10**9: beyond float32's exact integers
    if queries:
        return emb[:n], labels[:n], emb[n:], labels[n:]
    return emb, labels, None, None


def _child(method, n, classes, queries, dim, device, seed, label_offset) -> dict:
    import resource

    import torch

    dev = torch.device(device)
    q, ql, r, rl = make_data(n, classes, queries, dim, dev, seed, label_offset)
    ref = q if r is None else r
    ref_labels = ql if r is None else rl
    k = int(torch.unique(ref_labels, return_counts=True)[1].max()) - (r is None)  # k = "max_bin_count"
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    if dev.type == "cuda":
        sync()
        torch.cuda.reset_peak_memory_stats()
    load_before = os.getloadavg()[0]  # other work on the machine slows every row; recorded, not hidden
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB
    out = {}
    acc = {}
    t0 = time.perf_counter()
    if method == "gemm_floor":
        buf = torch.empty(2048, len(ref), device=dev)
        for s in range(0, len(q), 2048):
            block = q[s : s + 2048]
            torch.mm(block, ref.T, out=buf[: len(block)])
        sync()
    elif method == "faiss":
        import faiss

        index = faiss.IndexFlatIP(dim)
        index.add(ref.cpu().numpy())
        index.search(q.cpu().numpy(), k + (r is None))
    else:
        from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator

        from pml_extensions.knn import AsymmetricAccuracyCalculator, ChunkedAccuracyCalculator

        kwargs = dict(include=METRICS, k="max_bin_count", device=dev)
        if method == "stock":
            calc = AccuracyCalculator(**kwargs)
        elif method in ("engine", "engine_before"):
            calc = ChunkedAccuracyCalculator(**kwargs)
        elif method == "asymmetric_k_none":  # the default calculator of AsymmetricTester: ranks every reference
            calc = AsymmetricAccuracyCalculator(include=METRICS, device=dev)
        else:
            raise ValueError(f"unknown method {method!r}")
        engine = getattr(calc, "knn_func", None)
        if hasattr(engine, "profile_stages"):
            engine.profile_stages = True
        t0 = time.perf_counter()
        acc = calc.get_accuracy(q, ql) if r is None else calc.get_accuracy(q, ql, r, rl)
        sync()
        if hasattr(calc, "stage_seconds"):
            out["stages"] = {s: calc.stage_seconds.get(s, 0.0) for s in STAGES}
        if hasattr(engine, "last_plan"):
            out["plan"] = {a: b for a, b in engine.last_plan.items()}
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    out.update(
        method=method,
        n=n,
        classes=classes,
        queries=queries,
        k=k,
        label_offset=label_offset,
        dim=dim,
        device=device,
        seconds=seconds,
        peak_rss_gib=peak,
        rss_increase_gib=peak - rss_before,
        torch_threads=torch.get_num_threads(),
        load_average_before=load_before,
        **acc,
    )
    if dev.type == "cuda":
        out["peak_gpu_gib"] = torch.cuda.max_memory_allocated() / 2**30
        out["gpu"] = torch.cuda.get_device_name()
    return out


STOCK_BYTES_PER_NEIGHBOUR = 72  # measured: RSS increase ÷ (N·(k + 1)) of stock rows, 64 (20k/6) and 73 (100k/1000)
BASE_GIB = 0.7  # a row's RSS before its timed call (torch, faiss, PML, the embeddings), measured 0.6-0.65


def expected_k(n: int, classes: int, queries: bool) -> int:
    """A high estimate of ``k = "max_bin_count"`` for :func:`make_data`'s labels: exactly 3 per class in the
    3-items case, else the mean class size plus 4 standard deviations of a binomial count."""
    if classes * 3 == n and not queries:
        return 2
    mean = n / classes
    return int(mean + 4 * (mean * (1 - 1 / classes)) ** 0.5) + 1


def stock_estimate_gib(n: int, classes: int, queries: bool = False) -> float:
    """Projected peak RSS of the stock row: its [N, k + 1] faiss results and PML's [N, k] label, mask and
    cumulative-sum arrays at ``STOCK_BYTES_PER_NEIGHBOUR`` bytes per neighbour (calibrated on the measured rows),
    plus ``BASE_GIB``."""
    return BASE_GIB + n * (expected_k(n, classes, queries) + 1) * STOCK_BYTES_PER_NEIGHBOUR / 2**30


def _run_child(method, case, args, pythonpath=None):
    n, classes, queries = case
    cmd = [sys.executable, os.path.abspath(__file__), "--child", method, str(n), str(classes)]
    cmd += ["--queries"] if queries else []
    cmd += ["--dim", str(args.dim), "--device", args.device, "--seed", str(args.seed)]
    cmd += ["--label-offset", str(args.label_offset)]
    env = dict(os.environ, PYTHONPATH=pythonpath or os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not line:
        why = (proc.stderr.strip().splitlines() or ["killed"])[-1][:100]
        return dict(
            method=method, n=n, classes=classes, queries=queries, skipped=f"failed (exit {proc.returncode}): {why}"
        )
    return json.loads(line[0][7:])


def _key(r):
    return r["n"], r["classes"], r.get("queries", False), r.get("label_offset", 0)


def _ratio(r, rows, other):
    ref = next((x for x in rows if x["method"] == other and "skipped" not in x and _key(x) == _key(r)), None)
    return r["seconds"] / ref["seconds"] if ref and "skipped" not in r else None


def render(rows, device) -> str:
    lines = [
        "| N × D | classes | queries | device | method | seconds | ÷ GEMM floor | ÷ faiss | ÷ stock | peak RSS (GiB) | "
        "RSS increase (GiB) | MAP@R | P@1 | R-precision |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        labels = f" (labels {r['label_offset']:.0e} + c)" if r.get("label_offset") else ""
        who = "N others" if r.get("queries") else "self"
        head = f"| {r['n']:,} × {r.get('dim', 128)} | {r['classes']:,}{labels} | {who} | {device} | {r['method']} |"
        if "skipped" in r:
            lines.append(f"{head} – | – | – | – | – | – | {r['skipped']} | | |")
            continue
        ratios = []
        for other in ("gemm_floor", "faiss", "stock"):
            x = _ratio(r, rows, other) if r["method"] != other else None
            ratios.append(f"{x:.2f}" if x is not None else "–")
        mem = f"{r['peak_rss_gib']:.2f}" + (f" (GPU {r['peak_gpu_gib']:.2f})" if "peak_gpu_gib" in r else "")
        m = [f"{r[x]:.5f}" if x in r else "–" for x in METRICS]
        lines.append(
            f"{head} {r['seconds']:.1f} | {' | '.join(ratios)} | {mem} | {r['rss_increase_gib']:.2f} | "
            f"{' | '.join(m)} |"
        )
    stage_rows = [r for r in rows if "stages" in r and r["method"] == "engine"]
    if stage_rows:
        lines += [
            "",
            "Engine stages (seconds summed over its worker threads, so they add up to more than the wall time when "
            "the workers overlap; `plan`: method, bfloat16 proposals, symmetric sweep, proposals re-scored per "
            "query, queries redone by the rows method / by a full scan):",
            "",
            "| N | classes | queries | " + " | ".join(STAGES) + " | plan |",
            "|---|---|---|" + "---|" * len(STAGES) + "---|",
        ]
        for r in stage_rows:
            p = r.get("plan", {})
            nq = max(r["n"], 1)
            plan = (
                f"{p.get('method')}, bf16={p.get('low_precision')}, symmetric={p.get('symmetric')}, "
                f"{p.get('proposals', 0) / nq:.0f}, {p.get('redone_by_rows', 0)} / {p.get('redone_exactly', 0)}"
            )
            stages = " | ".join(f"{r['stages'][s]:.1f}" for s in STAGES)
            who = "N others" if r.get("queries") else "self"
            lines.append(f"| {r['n']:,} | {r['classes']:,} | {who} | {stages} | {plan} |")
    return "\n".join(lines) + "\n"


def _save(rows, args, base):
    same = {}
    for r in rows:
        if r["method"] != "engine" or "skipped" in r or r.get("label_offset"):
            continue  # labels 10^9 + c: stock PML merges classes when it casts them to float32
        s = next((x for x in rows if x["method"] == "stock" and "skipped" not in x and _key(x) == _key(r)), None)
        if s:
            same[f"{r['n']}:{r['classes']}" + (":q" if r.get("queries") else "")] = max(
                abs(r[m] - s[m]) for m in METRICS
            )
    cmd = "python benchmarks/accuracy_scale.py" + (" --device cuda" if args.device == "cuda" else "")
    cmd += f" --cases {' '.join(args.cases)}" if args.cases else ""
    cmd += f" --before {args.before}" if args.before else ""
    cmd += f" --before-max-n {args.before_max_n}" if args.before_max_n is not None else ""
    loads = [r["load_average_before"] for r in rows if "load_average_before" in r]
    load = f", 1-min load average before the rows {min(loads):.1f}–{max(loads):.1f}" if loads else ""
    text = (
        f'`{cmd}` (128-D, `k="max_bin_count"`, MAP@R / P@1 / R-precision; engine = `ChunkedAccuracyCalculator()` '
        "on the exact engine; one subprocess per row, "
        f"{rows[0].get('torch_threads', '?') if rows else '?'} torch threads, {os.cpu_count()} cores{load})\n\n"
        + render(rows, args.device)
    )
    if same:
        text += (
            "\nLargest |engine − stock| over the three metrics: "
            + ", ".join(f"{k}: {v:.1e}" for k, v in same.items())
            + " (both rank float32 scores: faiss's, and the engine's own kernel's, which differ in the last bits)\n"
        )
    if any(r.get("label_offset") for r in rows):
        text += (
            "\nRows with labels 10⁹ + c: stock PML casts labels to float32 and merges neighbouring classes, so "
            "its metrics (and its class count, hence memory) there are wrong; the engine keeps them exact.\n"
        )
    from pml_extensions.utils.atomic_io import atomic_write_json, atomic_write_text

    atomic_write_json(
        base + ".json",
        {
            "args": {k: v for k, v in vars(args).items() if k not in ("child", "queries")},
            "rows": rows,
            "max_abs_difference_vs_stock": same,
        },
    )
    atomic_write_text(base + ".md", text)


def _before_tree(ref: str) -> str:
    """A temporary directory holding ``pml_extensions`` as of git revision ``ref`` (for ``engine_before``)."""
    tmp = tempfile.mkdtemp(prefix="accuracy_scale_before_")
    archive = subprocess.run(["git", "-C", ROOT, "archive", ref, "pml_extensions"], capture_output=True)
    if archive.returncode != 0:
        raise SystemExit(f"--before: git archive {ref} failed: {archive.stderr.decode().strip()[:200]}")
    subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
    return tmp


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", nargs="+", help="N:classes or N:classes:q (default: the sizes for the device)")
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--max-gib", type=float, default=6.0, help="skip the stock path above this estimate")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--methods", nargs="+", choices=ALL_METHODS, help="subset to run")
    p.add_argument("--before", metavar="GIT_REF", help="also run the engine as of this revision (engine_before)")
    p.add_argument(
        "--before-max-n", type=int, metavar="N", help="run engine_before only for cases with at most N embeddings"
    )
    p.add_argument("--label-offset", type=int, default=0, help="add this to every label (e.g. 1000000000)")
    p.add_argument("--out", help="results path without extension (default benchmarks/results/accuracy_scale[_cuda])")
    p.add_argument("--child", nargs=3, metavar=("METHOD", "N", "CLASSES"), help=argparse.SUPPRESS)
    p.add_argument("--queries", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        m, n, c = args.child
        out = _child(m, int(n), int(c), args.queries, args.dim, args.device, args.seed, args.label_offset)
        print("RESULT " + json.dumps(out))
        return 0
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("no CUDA device on this machine: the --device cuda sizes are skipped; nothing written")
            return 0
    cases = [parse_case(c) for c in (args.cases or (CUDA_CASES if args.device == "cuda" else CPU_CASES))]
    base = args.out or os.path.join(RESULTS, "accuracy_scale" + ("_cuda" if args.device == "cuda" else ""))
    os.makedirs(os.path.dirname(os.path.abspath(base)), exist_ok=True)
    before = _before_tree(args.before) if args.before else None
    rows = []
    try:
        for case in cases:
            n, classes, queries = case
            methods = ["gemm_floor", "faiss", "stock", "engine"] + (["engine_before"] if before else [])
            if args.device == "cuda":
                methods.remove("faiss")  # faiss-cpu only here: a GPU row would time the CPU
            methods += ["asymmetric_k_none"] if classes * 3 == n and not queries else []
            methods = [m for m in methods if not args.methods or m in args.methods]
            for method in methods:
                est = stock_estimate_gib(n, classes, queries)
                if method == "stock" and est > args.max_gib:
                    why = (
                        f"not run: projected peak {est:.1f} GiB > --max-gib {args.max_gib:g} "
                        f"({STOCK_BYTES_PER_NEIGHBOUR} bytes per neighbour of [N, k + 1], k ≈ "
                        f"{expected_k(n, classes, queries)}, on a machine shared by several users)"
                    )
                    rows.append(dict(method=method, n=n, classes=classes, queries=queries, skipped=why))
                elif method == "engine_before" and args.before_max_n is not None and n > args.before_max_n:
                    why = f"not run: N > --before-max-n {args.before_max_n} (time)"
                    rows.append(dict(method=method, n=n, classes=classes, queries=queries, skipped=why))
                else:
                    t0 = time.time()
                    rows.append(_run_child(method, case, args, before if method == "engine_before" else None))
                    print(f"{n} {classes} {'q' if queries else 'self'} {method}: {time.time() - t0:.0f} s", flush=True)
                _save(rows, args, base)  # after every row, so a long run leaves its finished rows behind
    finally:
        if before:
            shutil.rmtree(before, ignore_errors=True)
    print(open(base + ".md").read())
    print(f"wrote {base}.json and {base}.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
