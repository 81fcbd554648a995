"""Issue 13 items 3, 5, 7, 8: batched top-k maps, any map geometry through the hook and overlays, one verb."""

import doctest
import os
import tempfile
import unittest
from unittest import mock

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

import pml_extensions.explain as explain
from pml_extensions.explain import ActivationDecomposition, ExplanationHook, overlay, topk_overall_maps
from pml_extensions.explain.overlay import save_pair_overlay, to_display_image
from tests.explain.explain_testing_utils import images, make_model


def empty_file(fig, path, **kwargs):
    """Stands in for ``overlay.atomic_savefig`` where no assertion reads a figure's pixels: no PNG is encoded."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    open(path, "wb").close()


class FakeTester:
    def __init__(self, embeddings, labels):
        self.embeddings_and_labels = {"val": (embeddings, labels)}
        self.all_accuracies = {"val": {"epoch": 1}}


class Spectrograms(torch.utils.data.Dataset):
    """6 one-channel 128 x 431 'spectrograms' with a bright band whose box is known."""

    def __init__(self):
        g = torch.Generator().manual_seed(0)
        self.x = torch.rand(6, 1, 128, 431, generator=g, dtype=torch.float64) * 0.1
        self.boxes = np.zeros((6, 4), dtype=np.int64)
        for n in range(6):
            y0, x0 = 16 + 8 * n, 40 * n
            self.x[n, 0, y0 : y0 + 32, x0 : x0 + 150] += 1.0
            self.boxes[n] = (x0, y0, x0 + 150, y0 + 32)

    def __len__(self):
        return 6

    def __getitem__(self, i):
        return self.x[i], i % 2


def frequency_trunk():
    """Downsamples only the frequency axis: [N, 1, 128, 431] -> [N, 4, 16, 431] (strides 8 and 1)."""
    torch.manual_seed(0)  # the test's own module initialisation
    conv = nn.Conv2d(1, 4, (8, 1), stride=(8, 1))
    return (
        nn.Sequential(conv, nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten()).double(),
        nn.Linear(4, 3).double(),
    )


class TestTopkMaps(unittest.TestCase):
    def test_batch_equals_one_by_one(self):
        trunk, emb = make_model("gmp")
        dec = ActivationDecomposition(trunk, emb)
        q, r = images(5, seed=2), images(7, seed=3)
        nb = torch.tensor([[0, 1, 2], [3, 4, 5], [6, 0, 1], [2, 3, 4], [5, 6, 0]])
        out = topk_overall_maps(dec, q, r, nb, batch_size=2)
        for i in range(5):
            plain = dec.overall_maps(q[i : i + 1], r[nb[i]])
            bias = dec.overall_maps(q[i : i + 1], r[nb[i]], bias=True)
            torch.testing.assert_close(out["query"][i], plain["query"], rtol=1e-12, atol=1e-14)
            torch.testing.assert_close(out["reference"][i], plain["reference"], rtol=1e-12, atol=1e-14)
            torch.testing.assert_close(out["query_bias"][i], bias["query"], rtol=1e-12, atol=1e-14)
            torch.testing.assert_close(out["similarity"][i], plain["similarity"], rtol=1e-12, atol=1e-14)
        with self.assertRaisesRegex(ValueError, "neighbours must be"):
            topk_overall_maps(dec, q, r, torch.tensor([0, 1]))

    @pytest.mark.slow  # over 3 s on 2 cores: tox runs it, -m 'not slow' leaves it out
    def test_hook_anisotropic_spectrograms(self):
        trunk, emb = frequency_trunk()
        ds = Spectrograms()
        with torch.no_grad():
            e = emb(trunk(ds.x))
        with tempfile.TemporaryDirectory() as tmp:
            hook = ExplanationHook(trunk, emb, {"val": ds}, tmp, n_queries=None, k=2, batch_size=4)
            save = overlay.atomic_savefig

            def query0_only(fig, path, **kwargs):  # the one PNG read below is encoded; the others' files are made
                if os.path.basename(path) == "val_epoch1_query0.png":
                    save(fig, path, **kwargs)
                else:
                    empty_file(fig, path)

            with mock.patch.object(overlay, "atomic_savefig", query0_only):
                hook.explain(FakeTester(e, torch.tensor([i % 2 for i in range(6)])))
            self.assertEqual(tuple(hook.last_maps["query"].shape), (6, 2, 16, 431))
            self.assertEqual(tuple(hook.last_maps["reference"].shape), (6, 2, 16, 431))
            self.assertIsNotNone(hook.last_localization)
            png = os.path.join(tmp, "val_epoch1_query0.png")
            with Image.open(png) as im:
                width, height = im.size
            self.assertGreater(width, 1500)  # readable: 7 panels at 300 px
            self.assertLess(height, width / 2)

    def test_overlay_keeps_aspect_and_shows_one_channel(self):
        x = Spectrograms().x[0]
        disp = to_display_image(x)
        self.assertEqual(disp.shape, (128, 431, 3))
        m = torch.zeros(16, 431)
        m[2:6, 40:190] = 1.0
        m[10, 300] = -0.5
        with tempfile.TemporaryDirectory() as tmp:
            path = save_pair_overlay(
                os.path.join(tmp, "o.png"),
                disp,
                [disp],
                [[("map", "query", m, (40.0, 100.0), True)]],
                similarities=[0.5],
            )
            with Image.open(path) as im:
                w, h = im.size
        self.assertGreater(w / h, 2.0)  # 3 panels of a 128 x 431 image side by side, not squashed to squares
        with self.assertRaisesRegex(ValueError, "one value per channel"):
            to_display_image(x, mean=(0.5, 0.5, 0.5), std=(0.2, 0.2, 0.2))

    def test_docstring_examples_run(self):
        from pml_extensions.explain import (
            activation_decomposition,
            base,
            fidelity,
            head_folder,
            similarity_grad_cam,
            topk_maps,
        )

        for module in (base, activation_decomposition, similarity_grad_cam, fidelity, topk_maps, head_folder):
            with self.subTest(module=module.__name__):
                res = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE, verbose=False)
                self.assertGreater(res.attempted, 0)
                self.assertEqual(res.failed, 0)

    def test_one_verb(self):
        trunk, emb = make_model("gap")
        q, r = images(2, seed=4), images(2, seed=5)
        for ex in (
            explain.ActivationDecomposition(trunk, emb),
            explain.SimilarityGradCAM(trunk, emb),
            explain.RandomExplainer(seed=1),
        ):
            self.assertIsInstance(ex, explain.SimilarityExplainer)
            out = ex.attribute(q, r)
            self.assertEqual(set(out) >= {"query", "reference", "similarity"}, True)
            self.assertEqual(out["query"].shape[0], 2)


def test_explain_retrieval_one_figure_or_one_per_reference(tmp_path, monkeypatch):
    """The command's layout (a figure per reference, its own point) and the hook's (one figure, the top-1's point)
    explain the same pairs: equal maps, records in rank order, the given point in every record."""
    trunk, emb = make_model("gap")
    dec = ActivationDecomposition(trunk, emb)
    q, refs = images(1, seed=4)[0], list(images(3, seed=5))
    # the figures are built and their files made; no assertion reads their pixels, so no PNG is encoded
    monkeypatch.setattr(overlay, "atomic_savefig", empty_file)
    each = explain.explain_retrieval(dec, q, refs, [str(tmp_path / f"{m}.png") for m in range(3)], point=(2.0, 3.0))
    one = explain.explain_retrieval(dec, q, refs, str(tmp_path / "all.png"), point=(2.0, 3.0), reference_labels="aab")
    assert [r["overlay"] for r in each] == [str(tmp_path / f"{m}.png") for m in range(3)]
    assert {r["overlay"] for r in one} == {str(tmp_path / "all.png")} and all(
        os.path.isfile(r["overlay"]) for r in each
    )
    assert [r["rank"] for r in one] == [1, 2, 3] and [r["point"] for r in one] == [[2.0, 3.0]] * 3
    assert [r["label"] for r in one] == ["a", "a", "b"] and [r["same_class"] for r in one] == [None] * 3
    for a, b in zip(each, one):
        torch.testing.assert_close(a["maps"]["point_specific"], b["maps"]["point_specific"])
        assert a["cosine_similarity"] == pytest.approx(b["cosine_similarity"])
    with pytest.raises(ValueError, match=r"paths must be one string or one per reference \(3\), got 2"):
        explain.explain_retrieval(dec, q, refs, ["a.png", "b.png"])
    with pytest.raises(ValueError, match=r"titles must be one string or one per reference \(3\), got 1"):
        explain.explain_retrieval(dec, q, refs, ["a.png", "b.png", "c.png"], titles=["a"])
    with pytest.raises(ValueError, match=r"references must hold at least one image"):
        explain.explain_retrieval(dec, q, [], "a.png")


if __name__ == "__main__":
    unittest.main()
