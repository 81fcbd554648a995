import json
import os
import subprocess
import sys

import pytest
import torch
from pytorch_metric_learning.distances import CosineSimilarity, LpDistance, SNRDistance
from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator
from pytorch_metric_learning.utils.inference import FaissKNN

from pml_extensions.knn import AsymmetricAccuracyCalculator, ChunkedAccuracyCalculator
from pml_extensions.knn.engine import BlockedKNN
from tests.knn import knn_brute_force as bf

CPU = torch.device("cpu")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PML_KNN = (
    "precision_at_1",
    "r_precision",
    "mean_average_precision_at_r",
    "mean_average_precision",
    "mean_reciprocal_rank",
)
OURS = ("recall_at_1", "mean_average_precision_trapezoidal")
CALCS = (ChunkedAccuracyCalculator, AsymmetricAccuracyCalculator)


def assert_same(got, want, rel=1e-6):
    """Equal metric dicts within float32 round-off; per-class lists compared element by element."""
    assert set(got) == set(want)
    for m in want:
        assert got[m] == pytest.approx(want[m], rel=rel, abs=1e-7, nan_ok=True), m


def blobs(n, d=6, classes=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, classes, (n,), generator=g)
    centers = torch.randn(classes, d, generator=g)
    return centers[labels] + 1.5 * torch.randn(n, d, generator=g), labels


def integer_points(n, d=3, seed=0):
    """Embeddings with entries in {0, 1, 2}: every distance is exact in float32 and many tie."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 3, (n, d), generator=g).float(), torch.randint(0, 3, (n,), generator=g)


class TestEngine:
    @pytest.mark.parametrize("inner_product", [False, True])
    @pytest.mark.parametrize("block_size, budget", [(1, 2**29), (3, 2**29), (64, 2**29), (64, 16 * 40 * 2)])
    def test_ties_by_reference_index_against_brute_force(self, inner_product, block_size, budget):
        # the last case re-ranks the tied rows 2 at a time (budget // (16·M) = 2): the same neighbours
        x, _ = integer_points(40)
        knn = BlockedKNN("inner_product" if inner_product else "euclidean", block_size=block_size, memory_budget=budget)
        for k in (1, 5, 38, 39):  # 39 = every reference but the own row
            want = [order[:k] for order in bf.ranking(x, x, torch.arange(40), inner_product)]
            dist, idx = knn(x, k, x, ref_includes_query=True)
            assert idx.tolist() == want
            exact = bf.ranking(x, x, None, inner_product)  # distances follow the indices
            d64 = -(x.double() @ x.double().T) if inner_product else torch.cdist(x.double(), x.double()) ** 2
            assert torch.allclose(dist.double(), (-d64 if inner_product else d64).gather(1, idx), atol=1e-5)
            assert exact  # brute force ran

    def test_same_neighbours_as_faiss_without_ties(self):
        x, _ = blobs(200, d=8)
        _, want = FaissKNN()(x, 7, x, True)
        _, got = BlockedKNN(block_size=17)(x, 7, x, True)
        assert torch.equal(got, want)

    def test_block_size_from_budget(self):
        assert BlockedKNN(memory_budget=4 * 1000 + 144 * 11).block_size(1000, 10) == 1
        assert BlockedKNN(memory_budget=10 * (4 * 1000 + 144 * 11)).block_size(1000, 10) == 10
        assert BlockedKNN(memory_budget=10 * (4 * 1000 + 144 * 11) - 1).block_size(1000, 10) == 9

    def test_distance_objects(self):
        assert (BlockedKNN(CosineSimilarity()).inner_product, BlockedKNN(CosineSimilarity()).normalize) == (True, True)
        assert BlockedKNN(LpDistance(normalize_embeddings=False)).inner_product is False
        for bad in (SNRDistance(), "manhattan", LpDistance(p=1)):
            with pytest.raises(ValueError, match="distance"):
                BlockedKNN(bad)

    def test_bad_input(self):
        knn = BlockedKNN()
        with pytest.raises(ValueError, match="k must lie"):
            knn(torch.zeros(3, 2), 3, torch.zeros(3, 2), True)
        with pytest.raises(ValueError, match="NaN"):
            knn(torch.full((3, 2), float("nan")), 1)
        with pytest.raises(ValueError, match="memory_budget"):
            BlockedKNN(memory_budget=0)


class TestSameNumbersAsPML:
    @pytest.mark.parametrize("calc_cls", CALCS)
    @pytest.mark.parametrize("k", [None, "max_bin_count", 7])
    @pytest.mark.parametrize("option", [{}, {"avg_of_avgs": True}, {"return_per_class": True}])
    def test_compared_to_self(self, calc_cls, k, option):
        x, y = blobs(120)
        stock = AccuracyCalculator(include=PML_KNN, k=k, device=CPU, **option).get_accuracy(x, y)
        ours = calc_cls(include=PML_KNN, k=k, device=CPU, memory_budget=50_000, **option).get_accuracy(x, y)
        assert_same(ours, stock)

    @pytest.mark.parametrize("calc_cls", CALCS)
    def test_separate_reference_with_lone_queries(self, calc_cls):
        x, y = blobs(90)
        q, ql, r, rl = x[:30], y[:30].clone(), x[30:], y[30:]
        ql[:4] = 99  # a label the reference lacks: those queries are lone
        for option in ({}, {"avg_of_avgs": True}, {"return_per_class": True}):
            stock = AccuracyCalculator(include=PML_KNN, k="max_bin_count", device=CPU, **option)
            ours = calc_cls(include=PML_KNN, k="max_bin_count", device=CPU, chunk_size=4, **option)
            assert_same(ours.get_accuracy(q, ql, r, rl), stock.get_accuracy(q, ql, r, rl))

    @pytest.mark.parametrize("calc_cls", CALCS)
    def test_ref_includes_query_and_label_comparison_fn(self, calc_cls):
        x, y = blobs(100, classes=8)

        def same_pair(a, b):  # labels 2c and 2c + 1 count as one class
            return (a // 2) == (b // 2)

        for fn in (None, same_pair):
            kw = dict(include=PML_KNN, k="max_bin_count", device=CPU, label_comparison_fn=fn)
            stock = AccuracyCalculator(**kw).get_accuracy(x[:40], y[:40], x, y, ref_includes_query=True)
            ours = calc_cls(chunk_size=9, **kw).get_accuracy(x[:40], y[:40], x, y, ref_includes_query=True)
            assert_same(ours, stock)

    def test_two_dimensional_labels_with_a_custom_comparison(self):
        x, y = blobs(60)
        labels = torch.stack([y, y % 2], dim=1)

        def first_column(a, b):
            return a[..., 0] == b[..., 0]

        kw = dict(include=PML_KNN, k="max_bin_count", device=CPU, label_comparison_fn=first_column)
        stock = AccuracyCalculator(**kw).get_accuracy(x, labels)
        assert ChunkedAccuracyCalculator(**kw).get_accuracy(x, labels) == pytest.approx(stock, rel=1e-6)

    @pytest.mark.parametrize("avg_of_avgs", [False, True])
    def test_ours_and_ties_against_brute_force(self, avg_of_avgs):
        x, y = integer_points(50)  # heavy ties: the rule (reference index) decides every metric
        want = bf.metrics(x, y, x, y, k=None, self_indices=torch.arange(50), avg_of_avgs=avg_of_avgs)
        for calc_cls in CALCS:
            names = PML_KNN + (OURS if calc_cls is AsymmetricAccuracyCalculator else ())
            got = calc_cls(include=names, device=CPU, avg_of_avgs=avg_of_avgs, chunk_size=7).get_accuracy(x, y)
            assert got == pytest.approx({m: want[m] for m in names}, rel=1e-6)

    def test_inner_product_against_brute_force(self):
        x, y = blobs(70)
        x = torch.nn.functional.normalize(x, dim=1)
        want = bf.metrics(x, y, x, y, k=10, self_indices=torch.arange(70), inner_product=True)
        got = AsymmetricAccuracyCalculator(include=PML_KNN + OURS, k=10, distance="inner_product").get_accuracy(x, y)
        assert got == pytest.approx({m: want[m] for m in got}, rel=1e-6)

    def test_inner_product_matches_stock_with_faiss_index_flat_ip(self):
        import faiss

        x, y = blobs(90)  # not normalised: inner-product and L2 rankings differ
        stock = AccuracyCalculator(
            include=PML_KNN, k="max_bin_count", device=CPU, knn_func=FaissKNN(index_init_fn=faiss.IndexFlatIP)
        ).get_accuracy(x, y)
        ours = ChunkedAccuracyCalculator(include=PML_KNN, k="max_bin_count", distance="inner_product")
        assert_same(ours.get_accuracy(x, y), stock)
        l2 = ChunkedAccuracyCalculator(include=PML_KNN, k="max_bin_count").get_accuracy(x, y)
        assert l2 != ours.get_accuracy(x, y)
        cosine = ChunkedAccuracyCalculator(include=PML_KNN, k="max_bin_count", distance=CosineSimilarity())
        xn = torch.nn.functional.normalize(x, dim=1)
        assert_same(cosine.get_accuracy(x, y), ours.get_accuracy(xn, y))

    def test_faiss_stays_usable_as_knn_func(self):
        x, y = blobs(80)
        stock = AccuracyCalculator(include=PML_KNN, k="max_bin_count", device=CPU).get_accuracy(x, y)
        ours = ChunkedAccuracyCalculator(
            include=PML_KNN, k="max_bin_count", device=CPU, knn_func=FaissKNN(), chunk_size=16
        ).get_accuracy(x, y)
        assert_same(ours, stock)


class TestIssueInputs:
    def test_mrr_alone(self):
        torch.manual_seed(0)
        x = torch.nn.functional.normalize(torch.randn(20, 4), dim=1)
        y = torch.arange(20) % 4
        want = bf.metrics(x, y, x, y, self_indices=torch.arange(20))["mean_reciprocal_rank"]
        for calc_cls in CALCS:
            got = calc_cls(include=("mean_reciprocal_rank",)).get_accuracy(x, y)
            assert got["mean_reciprocal_rank"] == pytest.approx(want, rel=1e-6)

    @pytest.mark.parametrize("calc_cls", CALCS)
    def test_k_larger_than_the_references_is_clamped(self, calc_cls):
        torch.manual_seed(0)
        q, ref = torch.randn(4, 8), torch.randn(6, 8)
        ql, rl = torch.zeros(4, dtype=torch.long), torch.tensor([1, 1, 1, 0, 1, 0])
        names = ("mean_average_precision", "mean_reciprocal_rank", "precision_at_1")
        got = calc_cls(k=10, include=names).get_accuracy(q, ql, ref, rl)
        want = bf.metrics(q, ql, ref, rl, k=None)  # all 6 references ranked: the clamp
        assert got == pytest.approx({m: want[m] for m in names}, rel=1e-6)
        assert got["mean_average_precision"] <= 1.0
        # with self exclusion the clamp is M - 1
        x = torch.cat([q, ref])
        y = torch.cat([ql, rl])
        got = calc_cls(k=50, include=names).get_accuracy(x, y)
        want = bf.metrics(x, y, x, y, k=None, self_indices=torch.arange(10))
        assert got == pytest.approx({m: want[m] for m in names}, rel=1e-6)

    @pytest.mark.parametrize("base", [10**9, 2**40 - 2])
    def test_large_integer_labels_stay_distinct(self, base):
        x, y = blobs(30, classes=3)
        big = y + base
        want = bf.metrics(x, y, x, y, k=None, self_indices=torch.arange(30))
        for calc_cls in CALCS:
            got = calc_cls(include=PML_KNN).get_accuracy(x, big)
            assert got == pytest.approx({m: want[m] for m in PML_KNN}, rel=1e-6)
            per_class = calc_cls(include=PML_KNN, return_per_class=True).get_accuracy(x, big)
            assert len(per_class["precision_at_1"]) == 3


class TestSeveralReferenceSets:
    @pytest.mark.parametrize("calc_cls", CALCS)
    def test_equals_one_call_per_set(self, calc_cls):
        x, y = blobs(90)
        calc = calc_cls(include=PML_KNN, k="max_bin_count")
        out = calc.get_accuracy_multi(
            x[:30],
            y[:30],
            {
                "self": dict(reference=x[:30], reference_labels=y[:30], ref_includes_query=True),
                "rest": (x[30:], y[30:]),
                "all": dict(reference=x, reference_labels=y, self_indices=torch.arange(30)),
            },
        )
        assert out["self"] == calc.get_accuracy(x[:30], y[:30])
        assert out["rest"] == calc.get_accuracy(x[:30], y[:30], x[30:], y[30:])
        assert out["all"] == calc.get_accuracy(x[:30], y[:30], x, y, ref_includes_query=True)
        with pytest.raises(ValueError, match="unknown keys"):
            calc.get_accuracy_multi(x, y, {"a": dict(reference=x, labels=y)})


MEMORY_SCRIPT = r"""
import json, resource, sys, torch
from pml_extensions.knn import AsymmetricAccuracyCalculator, ChunkedAccuracyCalculator
g = torch.Generator().manual_seed(0)
labels = torch.randperm(30000, generator=g) // 3 + 10**9   # 10,000 classes of 3
emb = torch.randn(30000, 16, generator=g)
cls = ChunkedAccuracyCalculator if sys.argv[1] == "chunked" else AsymmetricAccuracyCalculator
calc = cls(k="max_bin_count", chunk_size=1024, include=("precision_at_1", "mean_average_precision_at_r"))
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
acc = calc.get_accuracy(emb, labels)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"increase_mib": (after - before) / 1024, **acc}))
"""


@pytest.mark.parametrize("which", ["chunked", "asymmetric"])
def test_peak_memory_many_small_classes(which):
    """30,000 items in 10,000 classes of 3: PML's label counts alone would add ~2.9 GiB; ours stays O(block + N).

    1024-row blocks (~50 MiB here) rather than 256 (~37 MiB): the sweep has 16x fewer tiles, 3.5 s instead of ~19 s
    per case, and the peak stays far from the bound."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=REPO)
    proc = subprocess.run(
        [sys.executable, "-c", MEMORY_SCRIPT, which], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["increase_mib"] < 400, out
    assert 0.0 <= out["precision_at_1"] <= 1.0


@pytest.mark.parametrize("calc_cls", [ChunkedAccuracyCalculator, AsymmetricAccuracyCalculator])
def test_nan_embeddings_are_named_before_any_metric_runs(calc_cls):
    """A NaN in the query (or an inf in a separate reference) is reported as such, also with the default metrics
    (PML's NMI/AMI path used to fail first with a message about ref_includes_query)."""
    x, y = torch.randn(20, 4, generator=torch.Generator().manual_seed(0)), torch.arange(20) % 4
    bad = x.clone()
    bad[3, 1] = float("nan")
    with pytest.raises(ValueError, match="^query contains NaN or infinite values$"):
        calc_cls(k=10).get_accuracy(bad, y)
    with pytest.raises(ValueError, match="^query contains NaN or infinite values$"):
        calc_cls().get_accuracy(bad, y, x, y, ref_includes_query=False)
    ref = x.clone()
    ref[0, 0] = float("inf")
    with pytest.raises(ValueError, match="^reference contains NaN or infinite values$"):
        calc_cls().get_accuracy(x, y, ref, y)


# ----------------------------------------------------------------------------------------------------------------
# issue 25: exact results for every method, precision and path; the certified fallback; the proposal bound
# ----------------------------------------------------------------------------------------------------------------
def engine(method="threshold", low_precision=True, inner_product=False, ops="numpy", block=64):
    knn = BlockedKNN(
        "inner_product" if inner_product else "euclidean",
        method=method,
        low_precision=low_precision,
        block_size=block if method == "threshold" else None,
    )
    knn._force_torch_ops = ops == "torch"
    return knn


def near_tie_set(n_ref=300, n_query=60, d=16, seed=0):
    """References in a cluster whose scores against every query differ by ~1e-7 (far below float32 resolution of
    a 16-term dot product), exact duplicates among them, and farther references; queries near the cluster."""
    g = torch.Generator().manual_seed(seed)
    v = torch.nn.functional.normalize(torch.randn(d, generator=g), dim=0)
    cluster = v + 1e-7 * torch.randn(n_ref // 2, d, generator=g)
    cluster[::7] = cluster[3]  # exact duplicates
    far = 0.9 * torch.nn.functional.normalize(v + 0.5 * torch.randn(n_ref - n_ref // 2, d, generator=g), dim=1)
    ref = torch.cat([cluster, far])[torch.randperm(n_ref, generator=g)]
    query = v + 1e-3 * torch.randn(n_query, d, generator=g)
    return query, ref


def check(knn, q, r, k, self_indices=None, inner_product=False):
    """The engine's neighbours equal a brute force on its float32 scores (ties by index); its distances are within
    float32 round-off of the float64 ones."""
    want = [o[:k] for o in bf.ranking(q, r, self_indices, given=knn.float32_scores(q, r))]
    qp, rp = knn.prepare(q, "query"), knn.prepare(r, "reference")
    idx, dist = knn.search(qp, k, rp, self_indices, True)
    assert idx.tolist() == want
    s = bf.scores(q, r, inner_product).gather(1, idx)
    expect = -s if inner_product else s
    scale = q.double().norm(dim=1, keepdim=True) * r.double().norm(dim=1).max() + 1
    assert bool(((dist.double() - expect).abs() <= 1e-5 * scale**2).all())
    return knn.last_plan


PATHS = [
    ("rows", False, "numpy"),
    ("threshold", False, "numpy"),
    ("threshold", True, "numpy"),
    ("threshold", True, "torch"),  # the device-generic path (CUDA's), run on the CPU
]


class TestExactEverywhere:
    @pytest.mark.parametrize("method, low_precision, ops", PATHS)
    @pytest.mark.parametrize("inner_product", [False, True])
    def test_random_self_retrieval_and_query_set(self, method, low_precision, ops, inner_product):
        x, _ = blobs(300, d=16, classes=6)
        knn = engine(method, low_precision, inner_product, ops)
        for k in (1, 7, 20):
            plan = check(knn, x, x, k, torch.arange(300), inner_product)
            assert plan["method"] == method and plan["symmetric"] == (method == "threshold")
            assert plan["low_precision"] == (low_precision and method == "threshold")
            check(knn, x[:90], x[90:], k, None, inner_product)  # query set != reference set
            # own rows anywhere in the reference (a permutation), as AsymmetricAccuracyCalculator passes them
            perm = torch.randperm(300, generator=torch.Generator().manual_seed(k))
            check(knn, x[perm[:120]], x, k, perm[:120], inner_product)

    @pytest.mark.parametrize("method, low_precision, ops", PATHS)
    @pytest.mark.parametrize("inner_product", [False, True])
    def test_near_ties_within_1e7_and_duplicates(self, method, low_precision, ops, inner_product):
        q, r = near_tie_set()
        knn = engine(method, low_precision, inner_product, ops)
        scores = knn.float32_scores(q, r)
        top = torch.sort(scores, dim=1, stable=True).values[:, :31]
        assert bool((top[:, 1:] == top[:, :-1]).any())  # equal float32 scores: the index decides
        for k in (5, 30):  # the k-th neighbour inside the cluster
            check(knn, q, r, k, None, inner_product)
        both = torch.cat([q, r])
        check(knn, both, both, 12, torch.arange(len(both)), inner_product)  # exact with the default workers
        if method == "threshold" and inner_product:  # 150 equal float32 scores overflow the buffers (1.25k + 32)
            # which rows overflow depends on how the worker threads interleave (their shared bounds tighten in
            # either order; the results do not change): one worker makes the redo path certain
            threads = torch.get_num_threads()
            torch.set_num_threads(1)
            try:
                plan = check(knn, both, both, 12, torch.arange(len(both)), inner_product)
            finally:
                torch.set_num_threads(threads)
            assert plan["redone_by_rows"] > 0

    @pytest.mark.parametrize("method, low_precision, ops", PATHS)
    def test_unnormalised_embeddings_with_spread_norms(self, method, low_precision, ops):
        g = torch.Generator().manual_seed(1)
        x = torch.randn(300, 16, generator=g) * torch.logspace(-2, 2, 300)[torch.randperm(300, generator=g)][:, None]
        for inner_product in (False, True):
            knn = engine(method, low_precision, inner_product, ops)
            check(knn, x, x, 9, torch.arange(300), inner_product)
            check(knn, x[:100], x[100:], 9, None, inner_product)

    def test_duplicate_queries_and_references(self):
        x, _ = blobs(200, d=16)
        x = torch.cat([x, x[:50], x[:50]])  # every one of the first 50 rows three times
        for method, low_precision, ops in PATHS:
            check(engine(method, low_precision, False, ops), x, x, 6, torch.arange(len(x)))

    def test_float64_embeddings(self):
        x, _ = blobs(250, d=16)
        x = x.double()
        for method, low_precision, ops in PATHS:
            knn = engine(method, low_precision, False, ops)
            check(knn, x, x, 8, torch.arange(250))
            assert knn(x, 8, x, True)[0].dtype == torch.float64

    def test_two_workers_give_the_same_result_and_restore_torch_threads(self):
        x, _ = blobs(400, d=16)
        before = torch.get_num_threads()
        torch.set_num_threads(2)
        try:
            knn = engine(block=48)
            check(knn, x, x, 10, torch.arange(400))
            check(knn, x[:200], x[200:], 10)
            assert torch.get_num_threads() == 2
        finally:
            torch.set_num_threads(before)

    def test_group_sweep_when_the_buffers_do_not_fit_the_budget(self):
        # a budget for ~2 tiles of buffers: the symmetric sweep runs in groups of rows (cross tiles one-sided)
        x, _ = blobs(400, d=16)
        knn = BlockedKNN(method="threshold", low_precision=True, block_size=48, memory_budget=2 * 48 * 8 * 80)
        check(knn, x, x, 10, torch.arange(400))


class TestCertifiedFallback:
    def test_more_tied_references_than_the_buffer_holds_are_redone_exactly(self):
        # 120 copies of one reference: every query's k-th score is tied 120 ways; the buffer (1.5k + 32) overflows
        g = torch.Generator().manual_seed(0)
        r = torch.cat([torch.randn(1, 16, generator=g).repeat(120, 1), torch.randn(200, 16, generator=g) * 3])
        q = r[:1] + 0.01 * torch.randn(40, 16, generator=g)
        for method, low_precision, ops in PATHS[1:]:
            plan = check(engine(method, low_precision, False, ops), q, r, 5)
            assert plan["redone_by_rows"] == 40 and plan["redone_exactly"] == 0
        # more ties than even the rows method buffers (4k + 4096): a float64 scan of every reference
        r = torch.cat([r[:1].repeat(4200, 1), r[120:]])
        plan = check(engine("rows", False), q, r, 5)
        assert plan["redone_exactly"] == 40

    def test_small_buffers_force_failures_and_stay_exact(self, monkeypatch):
        monkeypatch.setattr(BlockedKNN, "capacity", staticmethod(lambda k: k - 1))  # can never hold k
        x, _ = blobs(300, d=16)
        for method, low_precision, ops in PATHS[1:]:
            plan = check(engine(method, low_precision, False, ops), x, x, 8, torch.arange(300))
            assert plan["redone_by_rows"] == 300

    def test_embeddings_whose_products_could_overflow_take_the_full_scan(self):
        x, _ = blobs(80, d=8)
        x = (x * 1e16).double()  # squared norms ~1e33: their float32 products could overflow
        knn = engine("threshold")
        idx, _ = knn.search(x, 4, x, torch.arange(80))
        assert idx.tolist() == [o[:4] for o in bf.ranking(x, x, torch.arange(80), given=knn.float32_scores(x, x))]
        assert knn.last_plan["method"] == "rows" and knn.last_plan["redone_exactly"] == 80

    def test_a_broken_bound_is_detected_on_the_rescored_pairs(self, monkeypatch):
        import pml_extensions.knn.engine as knn_engine

        monkeypatch.setattr(knn_engine, "pass_error_bound", lambda *a, **kw: 0.0)
        x, _ = blobs(300, d=16)
        knn = engine()
        knn.search(knn.prepare(x, "x"), 8, knn.prepare(x, "x"), torch.arange(300))
        assert knn.last_plan["redone_by_rows"] > 0


class TestProposalBound:
    def test_bfloat16_gemm_error_stays_within_the_bound(self):
        from pml_extensions.knn.engine import pass_error_bound

        g = torch.Generator().manual_seed(0)
        d = 128
        c = pass_error_bound(d)
        worst = torch.full((4, d), 1 + 2.0**-8 - 2.0**-20)  # each entry rounds down by almost u: errors align
        sets = [torch.randn(256, d, generator=g), torch.rand(256, d, generator=g) * 10, worst]
        seen = 0.0
        for x in sets:
            approx = torch.mm(x.bfloat16(), x.bfloat16().T).double()
            exact = x.double() @ x.double().T
            n = torch.linalg.vector_norm(x.double(), dim=1)
            scale = n[:, None] * n[None, :]
            eta = 2 * d * 2.0**-126 * (1 + n[:, None]) * (1 + n[None, :])
            assert bool(((approx - exact).abs() <= c * scale + eta).all())
            seen = max(seen, float(((approx - exact).abs() / scale).max()))
        assert seen > c / 2  # the aligned-rounding set comes within a factor 2 of the bound: it is not vacuous

    def test_bound_constants(self):
        from pml_extensions.knn.engine import pass_error_bound

        u = 2.0**-8
        assert pass_error_bound(128) == pytest.approx(3 * u + 128 * 2.0**-24, rel=1e-2)
        assert pass_error_bound(128, "cuda") == pytest.approx(3 * u + 128 * 2.0**-23, rel=1e-2)
        assert pass_error_bound(128, low_precision=False) == pytest.approx(128 * 2.0**-24, rel=1e-3)

    def test_low_precision_speedup_is_measured_once(self):
        from pml_extensions.knn import engine as knn_engine

        knn_engine.low_precision_speedup(torch.device("cpu"))
        cached = dict(knn_engine._SPEEDUP)
        knn_engine.low_precision_speedup(torch.device("cpu"))
        assert knn_engine._SPEEDUP == cached and ("cpu", None) in cached

    def test_bad_arguments(self):
        with pytest.raises(ValueError, match="method"):
            BlockedKNN(method="faiss")
        with pytest.raises(ValueError, match="low_precision"):
            BlockedKNN(low_precision="yes")
        x = torch.randn(50, 4)
        with pytest.raises(ValueError, match="2k \\+ 2"):
            BlockedKNN(method="threshold", block_size=8)(x, 5, x, True)


class TestDeviceClean:
    FACTORIES = {"empty", "zeros", "ones", "full", "arange", "tensor", "rand", "randn", "randint", "eye", "linspace"}

    @pytest.mark.parametrize("module", ["engine", "scores", "selection", "ops", "metrics"])
    def test_every_tensor_factory_names_a_device(self, module):
        import ast

        path = os.path.join(REPO, "pml_extensions", "knn", module + ".py")
        tree = ast.parse(open(path, encoding="utf-8").read())
        bare = []
        for node in ast.walk(tree):
            f = getattr(node, "func", None)
            if isinstance(f, ast.Attribute) and f.attr in self.FACTORIES and getattr(f.value, "id", "") == "torch":
                if not any(kw.arg == "device" for kw in node.keywords):
                    bare.append(node.lineno)
        assert bare == [], f"{module}.py: torch factories without device= at lines {bare}"

    @pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
    def test_cuda_equals_the_float64_brute_force(self):
        x, _ = blobs(300, d=16)
        q, r = near_tie_set()
        for method, low_precision, _ in PATHS:
            knn = engine(method, low_precision)
            want = [o[:10] for o in bf.ranking(x, x, torch.arange(300))]
            xc = x.cuda()
            idx, _ = knn.search(xc, 10, xc, torch.arange(300, device="cuda"))
            assert idx.cpu().tolist() == want
            idx, _ = knn.search(q.cuda(), 20, r.cuda())
            assert idx.cpu().tolist() == [o[:20] for o in bf.ranking(q, r)]


class TestTheEngineScores:
    """The one kernel every ranked score comes from: deterministic per pair, within the float32 bound."""

    def test_a_pair_gets_the_same_score_wherever_it_is_computed(self):
        from pml_extensions.knn.scores import pair_dots

        g = torch.Generator().manual_seed(0)
        for d in (7, 16, 128):
            x = torch.randn(400, d, generator=g)
            i = torch.arange(40).repeat_interleave(400)
            j = torch.arange(400).repeat(40)
            base = pair_dots(x, x, i, j)
            perm = torch.randperm(len(j), generator=g)  # another order of the same pattern within rows
            order = torch.sort(i[perm], stable=True).indices
            again = torch.empty_like(base)
            again[perm[order]] = pair_dots(x, x, i[perm][order], j[perm][order])
            assert torch.equal(base, again)
            assert torch.equal(base, pair_dots(x[:40], x, i, j))  # a smaller left operand
            swapped = pair_dots(x, x[:40], torch.sort(j, stable=True).values, i[torch.sort(j, stable=True).indices])
            assert torch.equal(base[torch.sort(j, stable=True).indices], swapped)  # q·r == r·q
            assert torch.equal(pair_dots(x, x[100:200], i, j % 100), pair_dots(x, x, i, j % 100 + 100))

    @pytest.mark.parametrize("inner_product", [False, True])
    def test_scores_are_within_their_bound_of_the_exact_ones(self, inner_product):
        from pml_extensions.knn.selection import Geometry

        g = torch.Generator().manual_seed(2)
        x = torch.randn(200, 128, generator=g) * torch.logspace(-1, 1, 200)[:, None]
        x = torch.cat([x, x[:20] + 1e-6 * torch.randn(20, 128, generator=g)])  # near-duplicates: tiny distances
        knn = BlockedKNN("inner_product" if inner_product else "euclidean")
        got = knn.float32_scores(x, x).double()
        exact = bf.scores(x, x, inner_product)
        eps = Geometry(x, x, inner_product, False, 0.0, True, False).eps64
        assert bool(((got - exact).abs() <= Geometry.canon(exact, eps[:, None])).all())
        if not inner_product:  # near-duplicates (distances ~1e-10) keep 3 digits; a float32 |r|² − 2q·r keeps none
            near = exact[200:, :20].diagonal()
            assert bool(((got[200:, :20].diagonal() - near).abs() <= 1e-3 * near).all())
            g32 = (x * x).sum(1)[None, :] - 2 * x @ x.T + (x * x).sum(1)[:, None]
            assert not bool(((g32[200:, :20].diagonal().double() - near).abs() <= 1e-3 * near).all())


# ----------------------------------------------------------------------------------------------------------------
# large k (a sixth of the references, as 6 classes): the rows method's float64 GEMM, the symmetric sweep and the
# bfloat16 proposal pass forced on and off
# ----------------------------------------------------------------------------------------------------------------
class TestLargeK:
    @pytest.mark.parametrize("dense", [False, True])
    @pytest.mark.parametrize("ops", ["numpy", "torch"])
    @pytest.mark.parametrize("inner_product", [False, True])
    def test_rows_method_float64_gemm_on_and_off(self, dense, ops, inner_product):
        x, _ = blobs(300, d=16, classes=6)
        knn = engine("rows", False, inner_product, ops)
        knn.dense_float64 = dense
        for k in (1, 50, 299):
            check(knn, x, x, k, torch.arange(300), inner_product)
        check(knn, x[:90], x[90:], 35, None, inner_product)
        perm = torch.randperm(300, generator=torch.Generator().manual_seed(3))
        check(knn, x[perm[:120]], x, 50, perm[:120], inner_product)
        q, r = near_tie_set()
        plan = check(knn, q, r, 50, None, inner_product)
        assert plan["method"] == "rows"

    def test_float64_gemm_is_the_default_on_the_cpu_for_large_k_only(self):
        knn = BlockedKNN()
        assert knn._dense64(CPU, 50, 300) and not knn._dense64(CPU, 5, 300)
        assert not knn._dense64(torch.device("cuda"), 50, 300)  # accelerators: float64 is slow on many GPUs
        knn.dense_float64 = False
        assert not knn._dense64(CPU, 50, 300)

    def test_float64_gemm_pairs_near_a_rounding_boundary_are_rescored_by_the_kernel(self, monkeypatch):
        # a margin 10^9 times too wide declares every candidate ambiguous: all of them go through pair_dots
        monkeypatch.setattr(BlockedKNN, "_DENSE_MARGIN", 4e9)
        x, _ = blobs(200, d=16, classes=6)
        for inner_product in (False, True):
            knn = engine("rows", False, inner_product)
            knn.dense_float64 = True
            plan = check(knn, x, x, 40, torch.arange(200), inner_product)
            assert plan["rescored_dense"] >= 200 * 40
            check(knn, x.double(), x.double(), 40, torch.arange(200), inner_product)

    def test_float64_gemm_with_float64_and_duplicate_embeddings(self):
        x, _ = blobs(150, d=16, classes=6)
        x = torch.cat([x, x[:50], x[:50]])
        knn = engine("rows", False)
        knn.dense_float64 = True
        check(knn, x, x, 60, torch.arange(len(x)))
        check(knn, x.double(), x.double(), 60, torch.arange(len(x)))

    @pytest.mark.parametrize("low_precision", [False, True])
    @pytest.mark.parametrize("inner_product", [False, True])
    def test_symmetric_sweep_with_large_k(self, low_precision, inner_product):
        x, _ = blobs(300, d=16, classes=6)
        knn = engine("threshold", low_precision, inner_product, block=120)  # tiles of 120 rows hold 2k + 2
        for k in (40, 59):
            plan = check(knn, x, x, k, torch.arange(300), inner_product)
            assert plan["symmetric"] and plan["low_precision"] == low_precision and plan["tile"] == 120
        plan = check(knn, x[:100], x[100:], 59, None, inner_product)
        assert not plan["symmetric"]

    def test_metrics_equal_the_brute_force_with_large_k(self):
        x, labels = blobs(240, d=16, classes=6)
        want = bf.metrics(x, labels, x, labels, None, torch.arange(240), given=BlockedKNN().float32_scores(x, x))
        for dense in (False, True):
            calc = ChunkedAccuracyCalculator(include=PML_KNN)
            calc.knn_func.dense_float64 = dense
            got = calc.get_accuracy(x, labels)
            assert calc.knn_func.last_plan["method"] == "rows"
            assert_same(got, {m: want[m] for m in PML_KNN})
