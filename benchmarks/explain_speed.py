"""Speed of the explanation maps (pml_extensions.explain) relative to plain model passes.

Rows (median wall time of --repeats runs, after a warm-up; ratios are the targets of issue 6):
1. overall maps (Decomposition + Decomposition+Bias, both images) for a query and its top-10, from ONE folded
   batch of the 11 images, divided by one batched no-grad forward of the same 11 images (target <= 1.2); also
   the variant that folds the query and the 10 references in two calls;
2. point-to-point maps D(i, j, x, y) at 14 x 14 features (L = 512), one einsum, divided by the four nested
   Python loops of the authors' demo (NumPy dot per entry) (target <= 0.01);
3. Grad-CAM (cosine) for the query against its top-10 divided by a forward + backward of the same 11 images;
4. maps at evaluation scale: overall maps (Decomposition and Decomposition+Bias) for N queries x their top-5
   with ``explain.topk_overall_maps`` (batches of --batch-queries queries) divided by the batched no-grad
   embedding pass over the same N x 6 images (target <= 1.3), for two N; the peak working memory above the
   start of the call (CPU: resident set sampled every 2 ms; CUDA: ``torch.cuda.max_memory_allocated``) is
   reported for both N (flat in N: the larger N must not need more).

    python benchmarks/explain_speed.py        # --quick (default): 224 px, MobileNetV2, <= 2 CPU threads
    python benchmarks/explain_speed.py --size 320 --device cuda --repeats 20 --queries 64 256

Writes benchmarks/results/explain_speed{,_cuda}.json and .md (the table the README shows).
"""

import argparse
import os
import statistics
import time

import numpy as np
import torch
from torch import nn

from pml_extensions.explain.activation_decomposition import ActivationDecomposition
from pml_extensions.explain.similarity_grad_cam import SimilarityGradCAM
from pml_extensions.explain.topk_maps import topk_overall_maps
from pml_extensions.utils.atomic_io import atomic_write_json, atomic_write_text


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_memory(fn, device) -> int:
    """Bytes of working memory above the level at the start of ``fn()`` (peak)."""
    import threading

    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        start = torch.cuda.memory_allocated(device)
        fn()
        torch.cuda.synchronize(device)
        return int(torch.cuda.max_memory_allocated(device) - start)
    start, peak, done = rss_bytes(), [0], threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], rss_bytes())
            done.wait(0.002)

    t = threading.Thread(target=sample)
    t.start()
    try:
        fn()
    finally:
        done.set()
        t.join()
    return int(max(peak[0], rss_bytes()) - start)


def build_model(pretrained: bool, dim: int = 512):
    from pml_extensions.trunks.pretrained import mobilenet_v2_features

    try:
        features = mobilenet_v2_features(pretrained=pretrained)
    except FileNotFoundError:
        features = mobilenet_v2_features(pretrained=False)
    trunk = nn.Sequential(features, nn.AdaptiveAvgPool2d(1), nn.Flatten())
    embedder = nn.Linear(1280, dim)
    return trunk.eval(), embedder.eval()


def timed(fn, repeats: int, sync) -> float:
    fn()
    sync()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def loop_point_to_point(Fq: np.ndarray, Fr: np.ndarray) -> np.ndarray:
    h, w, _ = Fq.shape
    D = np.zeros((h, w, h, w))
    for i in range(h):
        for j in range(w):
            for x in range(h):
                for y in range(w):
                    D[i, j, x, y] = np.dot(Fq[i, j], Fr[x, y])
    return D


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="default size (224 px, 5 repeats)")
    p.add_argument("--size", type=int, default=224, help="input side in pixels (default 224)")
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--device", default="cpu")
    p.add_argument("--queries", type=int, nargs=2, default=[8, 32], help="the two N of row 4 (default 8 32)")
    p.add_argument("--topk-size", type=int, default=160, help="image side of row 4 (default 160)")
    p.add_argument("--batch-queries", type=int, default=4, help="queries per batch in row 4 (default 4)")
    p.add_argument("--threads", type=int, default=min(2, torch.get_num_threads()))
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    trunk, embedder = build_model(True)
    trunk.to(device)
    embedder.to(device)
    g = torch.Generator().manual_seed(0)
    images = torch.randn(args.k + 1, 3, args.size, args.size, generator=g, device=g.device).to(device)
    q, refs = images[:1], images[1:]
    dec = ActivationDecomposition(trunk, embedder)
    cam = SimilarityGradCAM(trunk, embedder)
    rows = []

    def forward():
        with torch.no_grad():
            embedder(trunk(images))

    def maps_one_fold():
        f = dec.fold_query(images)
        dec.overall_maps(f[0], f[1:])
        dec.overall_maps(f[0], f[1:], bias=True)

    def maps_two_folds():
        fq, fr = dec.fold_query(q), dec.fold_reference(refs)
        dec.overall_maps(fq, fr)
        dec.overall_maps(fq, fr, bias=True)

    t_fwd = timed(forward, args.repeats, sync)
    t_one = timed(maps_one_fold, args.repeats, sync)
    t_two = timed(maps_two_folds, args.repeats, sync)
    rows.append(("overall maps, query + top-%d, one fold" % args.k, t_one, t_fwd, t_one / t_fwd, "<= 1.2"))
    rows.append(("overall maps, query + top-%d, two folds" % args.k, t_two, t_fwd, t_two / t_fwd, "<= 1.2"))

    # point-to-point at 14 x 14, L = 512 (real folded features of a 448-px MobileNetV2 input)
    f14 = dec.fold_query(torch.randn(2, 3, 448, 448, generator=g, device=g.device).to(device))
    assert f14.feature_size == (14, 14)
    t_ein = timed(lambda: dec.point_to_point(f14[0], f14[1]), args.repeats, sync)
    Fq, Fr = f14.features[0].double().cpu().numpy(), f14.features[1].double().cpu().numpy()
    t0 = time.perf_counter()
    D_loop = loop_point_to_point(Fq, Fr)
    t_loop = time.perf_counter() - t0
    D = dec.point_to_point(f14[0], f14[1])[0].double().cpu().numpy()
    max_err = float(np.abs(D - D_loop).max() / np.abs(D_loop).max())
    rows.append(("point-to-point 14x14 (einsum / 4 loops)", t_ein, t_loop, t_ein / t_loop, "<= 0.01"))

    def fwd_bwd():
        trunk.zero_grad(set_to_none=True)
        embedder.zero_grad(set_to_none=True)
        e = embedder(trunk(images))
        torch.nn.functional.cosine_similarity(e[:1], e[1:]).sum().backward()

    t_fb = timed(fwd_bwd, args.repeats, sync)
    trunk.zero_grad(set_to_none=True)
    embedder.zero_grad(set_to_none=True)
    t_cam = timed(lambda: cam.maps(q, refs, variant="cosine"), args.repeats, sync)
    rows.append(("Grad-CAM (cosine), query + top-%d" % args.k, t_cam, t_fb, t_cam / t_fb, "-"))

    # 4. maps at evaluation scale
    k5 = 5
    memory = {}
    for n_q in args.queries:
        pool = torch.randn(n_q * (1 + k5), 3, args.topk_size, args.topk_size, generator=g, device=g.device).to(device)
        queries = pool[:n_q]
        neighbours = (n_q + torch.arange(n_q * k5, device=pool.device)).view(n_q, k5)  # distinct references per query

        def embed_pass(pool=pool):
            with torch.no_grad():
                for start in range(0, pool.shape[0], args.batch_queries * (1 + k5)):
                    embedder(trunk(pool[start : start + args.batch_queries * (1 + k5)]))

        def topk_maps(queries=queries, pool=pool, neighbours=neighbours):
            topk_overall_maps(dec, queries, pool, neighbours, batch_size=args.batch_queries, device=device)

        t_emb = timed(embed_pass, args.repeats, sync)
        t_maps = timed(topk_maps, args.repeats, sync)
        rows.append(
            (
                f"overall maps, {n_q} queries x top-{k5} ({args.topk_size} px, batched)",
                t_maps,
                t_emb,
                t_maps / t_emb,
                "<= 1.3",
            )
        )
        memory[n_q] = peak_memory(topk_maps, device)
        del pool, queries, embed_pass, topk_maps

    print(
        f"\nexplain_speed: MobileNetV2 + GAP + Linear(1280, 512), {args.size}-px inputs, device "
        f"{args.device}, "
        f"{args.threads} threads, median of {args.repeats}\n"
    )
    print("| measurement | time (s) | baseline (s) | ratio | target |")
    print("|---|---|---|---|---|")
    for name, t, b, r, target in rows:
        print(f"| {name} | {t:.4f} | {b:.4f} | {r:.4f} | {target} |")
    print(
        f"\nbaselines: one batched forward of {args.k + 1} images; the demo's four nested loops (NumPy); "
        f"forward + backward of {args.k + 1} images. Point-to-point relative max difference vs loops: "
        f"{max_err:.2e}"
    )
    mem_line = ", ".join(f"N={n}: {b / 2**20:.1f} MiB" for n, b in memory.items())
    print(f"peak working memory of the batched top-5 maps above the start: {mem_line}")
    os.makedirs(args.out, exist_ok=True)
    table = [
        f"`python benchmarks/explain_speed.py{' --device ' + args.device if args.device != 'cpu' else ''}` "
        f"(MobileNetV2 + GAP + Linear(1280, 512), {args.size} px, device {args.device}, "
        f"{args.threads} threads, "
        f"median of {args.repeats}):",
        "",
        "| measurement | time (s) | baseline (s) | ratio | target |",
        "|---|---|---|---|---|",
    ]
    table += [f"| {name} | {t:.4f} | {b:.4f} | {r:.3f} | {target} |" for name, t, b, r, target in rows]
    table += [
        "",
        f"Baselines: one batched forward of the {args.k + 1} images; the authors' four nested loops (NumPy); "
        f"forward + backward of the {args.k + 1} images; the batched embedding pass over the same N x 6 "
        "images. "
        f"Peak working memory of the batched top-5 maps: {mem_line}.",
    ]
    name = "explain_speed" if device.type == "cpu" else f"explain_speed_{device.type}"
    atomic_write_text(os.path.join(args.out, name + ".md"), "\n".join(table) + "\n")
    result = {
        "size": args.size,
        "k": args.k,
        "device": args.device,
        "threads": args.threads,
        "repeats": args.repeats,
        "rows": [dict(name=n, seconds=t, baseline_seconds=b, ratio=r, target=tg) for n, t, b, r, tg in rows],
        "point_to_point_rel_max_diff": max_err,
        "topk_peak_memory_bytes": {str(n): b for n, b in memory.items()},
    }
    atomic_write_json(os.path.join(args.out, name + ".json"), result)
    return result


if __name__ == "__main__":
    main()
