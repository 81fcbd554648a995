"""Brute-force float64 references for the k-NN engine and the retrieval metrics (python loops, tiny inputs)."""

import torch


def scores(q, r, inner_product=False):
    """float64 scores ``[Nq, M]`` (smaller is nearer): squared L2, or the negated inner product; every pair is
    reduced the same way, so equal rows give bitwise equal scores."""
    q, r = q.double(), r.double()
    if inner_product:
        return -(q[:, None, :] * r[None, :, :]).sum(-1)
    return ((q[:, None, :] - r[None, :, :]) ** 2).sum(-1)


def ranking(q, r, self_indices=None, inner_product=False, given=None):
    """Per query: reference indices ordered by float64 distance (or by the ``given`` ``[Nq, M]`` scores, e.g. the
    engine's float32 ones), ties by increasing index, own row removed."""
    scores_ = scores(q, r, inner_product) if given is None else given.double()
    out = []
    for i in range(len(q)):
        order = torch.sort(scores_[i], stable=True).indices.tolist()
        if self_indices is not None:
            order.remove(int(self_indices[i]))
        out.append(order)
    return out


def metrics(q, ql, r, rl, k=None, self_indices=None, inner_product=False, same=None, avg_of_avgs=False, given=None):
    """Every metric by its definition, in float64; lone queries skipped; ``same(a, b)`` compares two labels;
    ``given``: rank by these ``[Nq, M]`` scores instead of float64 distances."""
    same = same or (lambda a, b: a == b)
    ql, rl = ql.tolist(), rl.tolist()
    ranks = ranking(q, r, self_indices, inner_product, given)
    per = {
        m: []
        for m in (
            "precision_at_1",
            "r_precision",
            "mean_average_precision_at_r",
            "mean_average_precision",
            "mean_reciprocal_rank",
            "trapezoidal",
        )
    }
    groups = []
    for i, order in enumerate(ranks):
        num_rel = sum(same(ql[i], b) for b in rl) - (self_indices is not None)
        if num_rel <= 0:
            continue
        kk = len(order) if k is None else min(k, len(order))
        rel = [same(ql[i], rl[j]) for j in order[:kk]]
        hits, ap, ap_r, trap = 0, 0.0, 0.0, 0.0
        for pos, is_rel in enumerate(rel, start=1):
            if is_rel:
                hits += 1
                ap += hits / pos
                if pos <= num_rel:
                    ap_r += hits / pos
                trap += ((hits - 1) / (pos - 1) if pos > 1 else 1.0) + hits / pos
        first = next((p for p, x in enumerate(rel, start=1) if x), None)
        per["precision_at_1"].append(float(rel[0]))
        per["r_precision"].append(sum(rel[:num_rel]) / min(num_rel, kk))
        per["mean_average_precision_at_r"].append(ap_r / num_rel)
        per["mean_average_precision"].append(ap / num_rel)
        per["mean_reciprocal_rank"].append(0.0 if first is None else 1.0 / first)
        per["trapezoidal"].append(trap / (2 * num_rel))
        groups.append(ql[i])
    out = {}
    for m, values in per.items():
        if avg_of_avgs:
            classes = sorted(set(groups))
            out[m] = sum(sum(v for v, g in zip(values, groups) if g == c) / groups.count(c) for c in classes) / len(
                classes
            )
        else:
            out[m] = sum(values) / len(values)
    out["mean_average_precision_trapezoidal"] = out.pop("trapezoidal")
    out["recall_at_1"] = out["precision_at_1"]
    return out
