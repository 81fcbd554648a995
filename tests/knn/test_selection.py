"""Tests of the engine's selection machinery (:mod:`pml_extensions.knn.selection`), each piece against a
direct computation on small inputs; both array paths (NumPy views on the CPU, torch for other devices)."""

import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from pml_extensions.knn import scores as K
from pml_extensions.knn import selection as S
from pml_extensions.knn.ops import NumpyOps, TorchOps

OPS = [NumpyOps, TorchOps]


def test_rounding_helpers_round_in_the_named_direction():
    g = torch.Generator().manual_seed(0)
    scale = 10.0 ** torch.randint(-6, 6, (2000,), generator=g)
    special = torch.tensor([0.0, -0.0, 1e-45, -1e-45, math.inf, -math.inf], dtype=torch.float64)
    t = torch.cat([torch.randn(2000, generator=g, dtype=torch.float64) * scale, special])
    up, down = K.up32(t), K.down32(t)
    assert bool((up.double() >= t).all()) and bool((down.double() <= t).all())
    assert bool((torch.nextafter(up, torch.full_like(up, -math.inf)).double() < t)[torch.isfinite(t)].all())
    floor = K.bf16_floor(t).float().double()
    assert bool((floor <= t).all())
    finite = torch.isfinite(t)
    step_up = K.bf16_floor(t).view(torch.int16)
    # the next bfloat16 above the floor is above t (the floor is the largest one at or below t)
    nxt = torch.where(step_up >= 0, step_up + 1, step_up - 1).view(torch.bfloat16).float().double()
    assert bool((nxt > t)[finite & (t != 0)].all())


def test_keys_sort_like_score_then_index():
    scores = torch.tensor([1.5, -2.0, 1.5, -0.0, 0.0, math.inf, -1e-30, 3.0])
    cols = torch.tensor([7, 3, 2, 9, 1, 0, 4, 5])
    order = torch.argsort(K.ordered_keys(scores, cols))
    want = sorted(range(8), key=lambda i: (float(scores[i]) + 0.0, int(cols[i])))
    assert order.tolist() == want
    assert torch.equal(K.key_scores(K.ordered_keys(scores, cols)), scores + 0.0)
    for ops in OPS:
        a = ops.arr
        assert np.array_equal(np.asarray(ops.keys(a(scores), a(cols))), K.ordered_keys(scores, cols).numpy())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_kth_largest_rows_over_several_strips(dtype):
    g = torch.Generator().manual_seed(1)
    p = (torch.randn(2500, 300, generator=g) * 3).to(dtype)  # > 1024 rows: the bfloat16 path works in strips
    p[::7, 5] = -math.inf
    for k in (1, 17, 299):
        want = p.float().topk(k, dim=1).values[:, -1].double()
        assert torch.equal(K.kth_largest_rows(p, k), want)


@pytest.mark.parametrize("ops", OPS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_select_matches_a_float_comparison(ops, dtype):
    g = torch.Generator().manual_seed(2)
    p = torch.randn(70, 50, generator=g).to(dtype)
    t_rows = torch.randn(70, generator=g) + 1.0
    t_cols = torch.randn(50, generator=g) + 1.0
    t_rows[3], t_cols[4], t_rows[5], t_cols[6] = -0.5, -math.inf, 0.0, -0.0  # compared as floats, not bits
    t_rows, t_cols = (t.to(dtype).float() for t in (t_rows, t_cols))  # thresholds already in the tile's values
    want = torch.nonzero(((p.float() >= t_rows[:, None]) | (p.float() >= t_cols[None, :])).reshape(-1)).flatten()
    masks = (np.empty(70 * 50, bool), np.empty(70 * 50, bool))
    buffers = lambda n: (masks[0][:n], masks[1][:n])  # noqa: E731
    if ops is NumpyOps:
        for strip in (1, 16, 1024):
            got = ops.select(p, t_rows, t_cols, buffers, strip)
            assert np.array_equal(got, want.numpy())
        got = ops.select(p, t_rows, None, buffers, 16)
        assert np.array_equal(got, torch.nonzero((p.float() >= t_rows[:, None]).reshape(-1)).flatten().numpy())
    else:
        assert torch.equal(ops.select(p, t_rows, t_cols, buffers), want)


def test_run_tasks_never_runs_two_tasks_of_one_block_together_and_reraises():
    active, seen, lock = set(), [], threading.Lock()

    def task(blocks, name):
        with lock:
            assert not active.intersection(blocks), (active, blocks)
            active.update(blocks)
        time.sleep(0.002)
        with lock:
            active.difference_update(blocks)
            seen.append(name)

    tasks = [((x, y), lambda x=x, y=y: task((x, y), (x, y))) for x in range(6) for y in range(x + 1, 6)]
    with ThreadPoolExecutor(3) as pool:
        S.run_tasks(tasks, pool, 3)
        assert sorted(seen) == sorted(t[0] for t in tasks)

        def boom():
            raise RuntimeError("tile failed")

        with pytest.raises(RuntimeError, match="tile failed"):
            S.run_tasks([((0,), boom), ((1,), lambda: None)], pool, 2)


@pytest.mark.parametrize("ops", OPS)
def test_buffers_keep_every_candidate_up_to_the_kth_and_fail_when_ties_overflow(ops):
    g = torch.Generator().manual_seed(3)
    n, k, cap = 6, 4, 9
    st = S.State(n, cap, k, torch.zeros(n, dtype=torch.float64), torch.device("cpu"), ops)
    everything = {r: [] for r in range(n)}
    for step in range(8):  # candidates arrive in batches, rows ascending
        rows = torch.sort(torch.randint(0, n, (15,), generator=g)).values
        d = torch.randint(0, 40, (15,), generator=g).float()
        d[rows == 5] = 7.0  # row 5: every candidate ties, more than the buffer holds
        refs = torch.arange(15) + 15 * step
        for r, x, j in zip(rows.tolist(), d.tolist(), refs.tolist()):
            everything[r].append((x, j))
        a = ops.arr
        st.add(a(rows), a(d), a(refs), 0, n)
    keys = np.asarray(st.keys)
    for r in range(n - 1):
        want = sorted(everything[r])[:k]
        kept = sorted(
            (float(K.key_scores(torch.tensor([x]))[0]), int(x & K.LOW32)) for x in keys[r] if x != K.INT64_MAX
        )
        assert want == kept[:k]  # the k best (ties by reference) are always there
        assert float(np.asarray(st.U)[r]) >= want[-1][0]  # U bounds the k-th score from above
    assert bool(np.asarray(st.failed)[5]) and not np.asarray(st.failed)[:5].any()


def test_per_query_metrics_against_their_definitions():
    from pml_extensions.knn.metrics import per_query_metrics

    g = torch.Generator().manual_seed(4)
    rel = torch.rand(40, 12, generator=g) < 0.3
    rel[0] = False  # no relevant neighbour in the top k
    num_relevant = rel.sum(1) + torch.randint(1, 5, (40,), generator=g)  # some relevant ones beyond k
    names = ("precision_at_1", "r_precision", "mean_average_precision_at_r", "mean_average_precision",
             "mean_reciprocal_rank", "mean_average_precision_trapezoidal")  # fmt: skip
    got = per_query_metrics(rel, num_relevant, names)
    for i in range(40):
        r, R = rel[i].tolist(), int(num_relevant[i])
        hits, ap, ap_r, trap, first = 0, 0.0, 0.0, 0.0, None
        for pos, x in enumerate(r, start=1):
            if x:
                hits += 1
                ap += hits / pos
                ap_r += hits / pos if pos <= R else 0.0
                trap += ((hits - 1) / (pos - 1) if pos > 1 else 1.0) + hits / pos
                first = first or pos
        want = {
            "precision_at_1": float(r[0]),
            "r_precision": sum(r[:R]) / min(R, 12),
            "mean_average_precision_at_r": ap_r / R,
            "mean_average_precision": ap / R,
            "mean_reciprocal_rank": 0.0 if first is None else 1 / first,
            "mean_average_precision_trapezoidal": trap / (2 * R),
        }
        for m in names:
            assert float(got[m][i]) == pytest.approx(want[m], rel=1e-14, abs=1e-15), (m, i)
