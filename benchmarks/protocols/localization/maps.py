"""What the ``localization`` protocol measures on a trained model: explanation maps of every method under both sign
conventions, scored as weakly supervised localisation (Zhu, Yang & Chen, TIP 2021, Sec. VI-A/B), P@1 and the
rectified Grad-CAM identity.

Each test image (query) is paired with its nearest test image of the same class (cosine of the embeddings); the
query's map is scored by :class:`~pml_extensions.explain.LocalizationEvaluator` (min-max -> bilinear resize ->
threshold grid -> largest connected component -> box; correct when IoU > 0.5). Methods (:data:`METHODS`):
Decomposition, Decomposition+Bias (the first two terms of eq. 5), Grad-CAM (of the cosine), Grad-CAM (no norm) (of
E^q · E^r), and the authors' demo variant (:data:`DEMO`: ReLU of each point-to-point term, then sum). Conventions
(:data:`CONVENTIONS`): ``signed`` (the map as the method defines it) and ``ReLU`` (clamped at 0, Grad-CAM's).

The threshold is a parameter of each method: :func:`held_out_choice` picks it on held-out composites (the grid value
with the highest held-out accuracy, the smallest on a tie) and reports the test accuracy there; the test images' own
best threshold (``best_accuracy``) is kept beside it as the optimistic figure. The centre box that needs no model
(:func:`centre_box`) chooses its side fraction the same way.

RGrad-CAM (rectified Grad-CAM, ``SimilarityGradCAM`` variant ``"rectified"``) equals ReLU(Decomposition+Bias) for a
linear head when GMP ties are broken as autograd breaks them (``gmp_ties="first"``); it is measured by autograd on
the first ``eval_batch`` pairs of every run (largest relative difference after ReLU, and whether the localisation
hits agree at every threshold), under both tie rules, instead of being scored as a near-duplicate row.

Example::

    >>> e = torch.tensor([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9]])
    >>> same_class_neighbours(e, np.array([0, 0, 1, 1])).tolist(), p_at_1(e, np.array([0, 0, 1, 1]))
    ([1, 0, 3, 2], 100.0)
    >>> held_out_choice([10.0, 30.0, 30.0], [50.0, 20.0, 40.0], [0.1, 0.2, 0.3])
    {'held_out_accuracy': 20.0, 'held_out_value': 0.2, 'validation_accuracy': 30.0}
"""

from typing import Any, Dict, List, Tuple

import numpy as np
import torch

from pml_extensions.explain.activation_decomposition import ActivationDecomposition
from pml_extensions.explain.folded_embedding import FoldedEmbedding
from pml_extensions.explain.localization_evaluator import LocalizationEvaluator
from pml_extensions.explain.similarity_grad_cam import SimilarityGradCAM

METHODS = ("Decomposition", "Decomposition+Bias", "Grad-CAM", "Grad-CAM (no norm)")
DEMO = "Decomposition (demo ReLU-then-sum)"
CONVENTIONS = ("signed", "ReLU")


def score_name(method: str, convention: str) -> str:
    """``"Grad-CAM [ReLU]"``: the key of one method under one convention in the results."""
    return f"{method} [{convention}]"


def same_class_neighbours(embeddings: torch.Tensor, labels: np.ndarray) -> np.ndarray:
    """``[N]`` index of each item's nearest other item of its class (cosine); of any class when it has none."""
    e = torch.nn.functional.normalize(embeddings.float(), dim=1)
    sim = e @ e.t()
    sim.fill_diagonal_(-float("inf"))
    same = torch.as_tensor(np.asarray(labels)[:, None] == np.asarray(labels)[None, :], device=sim.device)
    same.fill_diagonal_(False)
    masked = torch.where(same, sim, torch.full_like(sim, -float("inf")))
    has = same.any(dim=1)
    return torch.where(has, masked.argmax(dim=1), sim.argmax(dim=1)).cpu().numpy()


def p_at_1(embeddings: torch.Tensor, labels: np.ndarray) -> float:
    """Precision at 1 (%) of cosine retrieval, every item a query against the others."""
    e = torch.nn.functional.normalize(embeddings.float(), dim=1)
    s = e @ e.t()
    s.fill_diagonal_(-float("inf"))
    labels = np.asarray(labels)
    return 100.0 * float(np.mean(labels[s.argmax(1).cpu().numpy()] == labels))


@torch.no_grad()
def embed(trunk, embedder, images: torch.Tensor, device, batch_size: int = 64) -> torch.Tensor:
    """``[N, D]`` embeddings of ``images`` in eval mode (on the CPU)."""
    trunk.eval()
    embedder.eval()
    return torch.cat(
        [embedder(trunk(images[i : i + batch_size].to(device))).cpu() for i in range(0, len(images), batch_size)]
    )


def fold_queries(dec: ActivationDecomposition, images: torch.Tensor, device, batch_size: int) -> FoldedEmbedding:
    """The folded embeddings of every image (batches of ``batch_size``), concatenated."""
    folds = [dec.fold_query(images[i : i + batch_size].to(device)) for i in range(0, len(images), batch_size)]

    def cat(name):
        return torch.cat([getattr(f, name) for f in folds])

    return FoldedEmbedding(
        cat("features"),
        cat("bias"),
        cat("embedding"),
        cat("feature_map"),
        folds[0].image_size,
        folds[0].normalised,
        folds[0].exact,
    )


def compute_maps(dec, cam, x, fold, fr, nn_idx, eval_batch, device, boxes, size, dec_first=None, identity=True):
    """Signed maps of every method ``[N, h, w]``, and the RGrad-CAM = ReLU(Decomposition+Bias) identity measured by
    autograd on the first ``eval_batch`` pairs (relative max difference after ReLU, and whether the localisation
    hits agree at every threshold), for ``dec`` (GMP ties shared) and for ``dec_first`` (``gmp_ties="first"``);
    ``identity=False``: the maps only (``None`` for the identity)."""
    maps = {
        "Decomposition": dec.overall_maps(fold, fr)["query"],
        "Decomposition+Bias": dec.overall_maps(fold, fr, bias=True)["query"],
        DEMO: dec.overall_maps(fold, fr, relu_then_sum=True)["query"],
    }
    nn_idx = torch.as_tensor(nn_idx, device=x.device)
    for name, variant in (("Grad-CAM", "cosine"), ("Grad-CAM (no norm)", "dot")):
        parts = []
        for i in range(0, len(x), eval_batch):
            q = x[i : i + eval_batch].to(device)
            r = x[nn_idx[i : i + eval_batch]].to(device)
            parts.append(cam.maps(q, r, variant=variant, relu=False)["query"])
        maps[name] = torch.cat(parts)
    if not identity:
        return maps, None
    n = min(eval_batch, len(x))
    q, r = x[:n].to(device), x[nn_idx[:n]].to(device)
    rgc = cam.maps(q, r, variant="rectified", relu=True)["query"]
    ev = LocalizationEvaluator()
    hits_rgc = [ev.correct(m, boxes[i], size) for i, m in enumerate(rgc.cpu())]

    def compare(dot_bias):
        scale = dot_bias.abs().amax().clamp_min(1e-30)
        hits_dec = [ev.correct(m, boxes[i], size) for i, m in enumerate(dot_bias.relu().cpu())]
        return (
            float((rgc - dot_bias.relu()).abs().max() / scale),
            bool(all(np.array_equal(a, b) for a, b in zip(hits_rgc, hits_dec))),
        )

    identity: Dict[str, Any] = {"n_pairs": n}
    first_n = torch.arange(n, device=fold.embedding.device)
    identity["max_rel_diff_relu"], identity["same_hits_every_threshold"] = compare(
        dec.overall_maps(fold[first_n], fr[first_n], bias=True, scale="dot")["query"]
    )
    if dec_first is not None:
        identity["max_rel_diff_relu_first"], identity["same_hits_every_threshold_first"] = compare(
            dec_first.overall_maps(q, r, bias=True, scale="dot")["query"]
        )
    return maps, identity


def score_maps(maps: Dict[str, torch.Tensor], boxes, size: Tuple[int, int]) -> Dict[str, Dict[str, Any]]:
    """``{"<method> [<convention>]": {"best_accuracy" (%), "best_threshold", "accuracy" (% per threshold)}}``; the
    demo variant only signed (it is non-negative already)."""
    ev = LocalizationEvaluator()
    scores = {}
    for name, m in maps.items():
        for conv in CONVENTIONS:
            if name == DEMO and conv == "ReLU":
                continue  # non-negative already: the ReLU score is the signed score
            mm = m.relu() if conv == "ReLU" else m
            r = ev.evaluate(list(mm.cpu()), boxes, size)
            scores[score_name(name, conv)] = {
                "best_accuracy": 100.0 * r["best_accuracy"],
                "best_threshold": r["best_threshold"],
                "accuracy": (100.0 * r["accuracy"]).tolist(),
            }
    return scores


def held_out_choice(validation_accuracy, test_accuracy, values) -> Dict[str, float]:
    """The grid value with the highest accuracy on the held-out composites (the first, i.e. smallest, on a tie) and
    the test accuracy there: ``{"held_out_accuracy", "held_out_value", "validation_accuracy"}`` (accuracies as
    given, e.g. %).

    Raises:
        ValueError: the three sequences differ in length or are empty.
    """
    va, ta, vs = (np.asarray(a, dtype=np.float64) for a in (validation_accuracy, test_accuracy, values))
    if va.ndim != 1 or va.size == 0 or va.shape != ta.shape or va.shape != vs.shape:
        raise ValueError(
            f"validation_accuracy, test_accuracy and values must be equally long non-empty lists, got lengths "
            f"{va.size}, {ta.size}, {vs.size}"
        )
    i = int(np.argmax(va))
    return {"held_out_accuracy": float(ta[i]), "held_out_value": float(vs[i]), "validation_accuracy": float(va[i])}


def choose_on_held_out(test_scores: Dict[str, Dict[str, Any]], validation_scores: Dict[str, Dict[str, Any]]):
    """``test_scores`` (:func:`score_maps`) with, per method and convention, the threshold chosen on the held-out
    composites (:func:`held_out_choice`): ``held_out_accuracy`` (test %, at that threshold), ``held_out_threshold``
    and ``validation_accuracy`` (% per threshold on the held-out composites)."""
    grid = thresholds()
    out = {}
    for k, t in test_scores.items():
        v = validation_scores[k]["accuracy"]
        c = held_out_choice(v, t["accuracy"], grid)
        out[k] = dict(
            t, held_out_accuracy=c["held_out_accuracy"], held_out_threshold=c["held_out_value"], validation_accuracy=v
        )
    return out


@torch.no_grad()
def prefix_features(trunk, boundary, images: torch.Tensor, device, batch_size: int = 64):
    """``(rest, features)``: ``trunk`` split after the module ``boundary``
    (:func:`pml_extensions.trunks.split_trunk`) and the prefix's outputs for ``images`` in eval mode (on ``device``),
    so that ``rest(features)`` is ``trunk(images)``: every explanation of ``rest`` on the features equals that of
    ``trunk`` on the images (the explained layer lies after the boundary), with the prefix computed once."""
    from pml_extensions.trunks import split_trunk

    prefix, rest = split_trunk(trunk, boundary if isinstance(boundary, int) else str(boundary))
    was = trunk.training
    trunk.eval()
    try:
        out = torch.cat([prefix(images[i : i + batch_size].to(device)) for i in range(0, len(images), batch_size)])
    finally:
        trunk.train(was)
    return rest, out


def measure(
    trunk,
    embedder,
    test_images: torch.Tensor,
    test_set,
    device,
    eval_batch: int,
    validation_images=None,
    validation_set=None,
    prefix=None,
) -> Dict[str, Any]:
    """Everything the protocol reports about one trained model on the test composites: the scores of every method
    and convention (each threshold chosen on the held-out ``validation_images`` / ``validation_set``, whose
    queries are paired within themselves, when given), the RGrad-CAM identity, test P@1 and the map size.
    ``prefix``: a module path of the trunk before the explained layer (e.g. the frozen prefix ``"0.13"``): its
    outputs are computed once per image (:func:`prefix_features`) instead of in every pass, the same numbers.

    Raises:
        ValueError: held-out images of another size than the test images.
    """
    size = (int(test_images.shape[-2]), int(test_images.shape[-1]))
    if validation_set is not None:
        vsize = (int(validation_images.shape[-2]), int(validation_images.shape[-1]))
        if vsize != size:
            raise ValueError(f"validation images must be {size[0]}x{size[1]} like the test images, got {vsize}")
    if prefix is not None:
        rest, test_images = prefix_features(trunk, prefix, test_images, device)
        if validation_set is not None:
            validation_images = prefix_features(trunk, prefix, validation_images, device)[1]
        trunk = rest
    dec = ActivationDecomposition(trunk, embedder)
    dec_first = ActivationDecomposition(trunk, embedder, gmp_ties="first")
    cam = SimilarityGradCAM(trunk, embedder)

    def maps_of(images, dataset, identity):
        fold = fold_queries(dec, images, device, eval_batch)
        nn_idx = same_class_neighbours(fold.embedding.cpu(), np.asarray(dataset.labels))
        fr = fold[torch.as_tensor(nn_idx, device=fold.embedding.device)]
        first = dec_first if identity else None
        m, ident = compute_maps(
            dec, cam, images, fold, fr, nn_idx, eval_batch, device, dataset.boxes, size, first, identity=identity
        )
        return m, ident, fold

    maps, identity, fold = maps_of(test_images, test_set, True)
    scores = score_maps(maps, test_set.boxes, size)
    out: Dict[str, Any] = {}
    if validation_set is not None:
        vmaps, _, vfold = maps_of(validation_images, validation_set, False)
        scores = choose_on_held_out(scores, score_maps(vmaps, validation_set.boxes, size))
        out["validation_p_at_1"] = p_at_1(vfold.embedding.cpu(), np.asarray(validation_set.labels))
    return {
        "scores": scores,
        "identity_rgradcam_vs_relu_decomposition_bias": identity,
        "test_p_at_1": p_at_1(fold.embedding.cpu(), np.asarray(test_set.labels)),
        "feature_size": list(fold.feature_size),
        **out,
    }


def centre_box(test_set, size: Tuple[int, int], validation_set=None) -> Dict[str, Any]:
    """The baseline that needs no model: a centred box covering a fraction of each side (accuracy in %):
    ``best_accuracy`` / ``best_fraction`` (the fraction best on the test composites, optimistic), ``accuracy`` (test,
    per fraction of ``fractions``) and, with ``validation_set``, the fraction chosen on the held-out composites
    (:func:`held_out_choice`: ``held_out_accuracy``, ``held_out_fraction``, ``validation_accuracy`` per fraction)."""
    centre = LocalizationEvaluator.centre_box_accuracy(test_set.boxes, size)
    out = {
        "best_accuracy": 100.0 * centre["best_accuracy"],
        "best_fraction": centre["best_fraction"],
        "fractions": [round(float(f), 4) for f in centre["fractions"]],
        "accuracy": (100.0 * centre["accuracy"]).tolist(),
    }
    if validation_set is not None:
        v = (100.0 * LocalizationEvaluator.centre_box_accuracy(validation_set.boxes, size)["accuracy"]).tolist()
        c = held_out_choice(v, out["accuracy"], out["fractions"])
        out.update(held_out_accuracy=c["held_out_accuracy"], held_out_fraction=c["held_out_value"])
        out["validation_accuracy"] = v
    return out


def thresholds() -> List[float]:
    return LocalizationEvaluator().thresholds.tolist()
