"""Explanation figures (issue 23, item 3): true rank and cosine in titles, colour bars that name their quantity,
same / other class marks, +Bias panels only when they add something, a readable semi-transparent map layer."""

import unittest

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from pml_extensions.explain.overlay import (  # noqa: E402
    COSINE_QUANTITY,
    LEGEND,
    bias_difference,
    explanation_panels,
    format_cosines,
    pair_figure,
)

IMAGE = np.zeros((8, 10, 3))  # a black drawing: the dark case


def _figure(**kwargs):
    m = torch.zeros(4, 5)
    m[1, 2] = 2e-3
    m[3, 4] = -1e-3
    panels = kwargs.pop(
        "panels", [[("Decomposition (query)", "query", m, (3.0, 4.0)), ("pm", "reference", m, None, True)]]
    )
    refs = kwargs.pop("refs", [IMAGE] * len(panels))
    return pair_figure(IMAGE, refs, panels, **kwargs)


def _colorbars(fig):
    return [ax for ax in fig.axes if ax.get_label() == "<colorbar>"]


class TestTitles(unittest.TestCase):
    def tearDown(self):
        plt.close("all")

    def test_true_rank_and_cosine(self):
        fig = _figure(similarities=[0.98209], ranks=[3])
        self.assertEqual(fig.axes[1].get_title(), "rank 3 · cos 0.9821")
        fig = _figure(similarities=[0.5, 0.25], refs=[IMAGE, IMAGE], panels=[[], []])
        self.assertEqual([fig.axes[c].get_title() for c in (1, 3)], ["rank 1 · cos 0.5000", "rank 2 · cos 0.2500"])

    def test_near_one_cosines_are_told_apart(self):
        # the "cos 1.000 for all neighbours": values below 1 never print as 1, distinct values stay distinct
        self.assertEqual(format_cosines([0.99996, 0.99993, 0.99991]), ["0.99996", "0.99993", "0.99991"])
        self.assertEqual(format_cosines([0.9999996]), ["0.999999"])  # as close as 6 decimals allow, not "1.0000"
        self.assertEqual(format_cosines([1.0000001, 0.87654]), ["1.0000", "0.8765"])

    def test_same_and_other_class_marks(self):
        fig = _figure(
            similarities=[0.9, 0.8, 0.7],
            refs=[IMAGE] * 3,
            panels=[[], [], []],
            reference_labels=["birds", "fish", None],
            same_class=[True, False, None],
            query_label="birds",
        )
        ref_axes = [fig.axes[1], fig.axes[3], fig.axes[5]]
        self.assertEqual(
            [ax.get_title() for ax in ref_axes],
            [
                "rank 1 · cos 0.9000\nclass birds · same class",
                "rank 2 · cos 0.8000\nclass fish · other class",
                "rank 3 · cos 0.7000",
            ],
        )
        self.assertEqual(fig.axes[0].get_title(), "query\nclass birds")
        frames = [matplotlib.colors.to_hex(ax.spines["top"].get_edgecolor()) for ax in ref_axes[:2]]
        self.assertEqual(frames, ["#1a7f37", "#c62828"])  # green frame: same class; red: other class
        with self.assertRaisesRegex(ValueError, "same_class must have one entry per reference"):
            _figure(same_class=[True, False])


class TestColourBars(unittest.TestCase):
    def tearDown(self):
        plt.close("all")

    def test_every_bar_names_its_quantity_and_unit(self):
        fig = _figure(similarities=[0.5])
        labels = [ax.get_ylabel().replace("\n", " ") for ax in _colorbars(fig)]
        # both maps peak at 2e-3: values read in units of 1e-3
        self.assertEqual(labels, [f"{COSINE_QUANTITY} (× 1e-3)"] * 2)
        fig = _figure(colorbar_label="contribution to dot product")
        self.assertTrue(
            all("contribution to dot product" in ax.get_ylabel().replace("\n", " ") for ax in _colorbars(fig))
        )
        self.assertIn(LEGEND, [t.get_text() for t in fig.texts])

    def test_symmetric_fixed_scale_and_transparent_zero(self):
        q = torch.zeros(4, 5)
        q[0, 0] = 4e-2
        q_bias = q.clone()
        q_bias[2, 2] = -1e-2
        r = torch.full((4, 5), 1.5e-2)
        fig = _figure(
            panels=[[("a", "query", q, None), ("b", "query", q_bias, None), ("c", "reference", r, None)]],
            alpha=0.8,
        )
        limits = [ax.get_ylim() for ax in _colorbars(fig)]
        # symmetric; the two maps on the query share ±4e-2; the reference's map has its own ±1.5e-2 (values × 1e-2)
        self.assertEqual([tuple(round(v, 6) for v in lim) for lim in limits], [(-4.0, 4.0), (-4.0, 4.0), (-1.5, 1.5)])
        layer = fig.axes[2].images[1].get_array()  # [H, W, 4] RGBA map layer over the lightened drawing
        self.assertEqual(layer.shape, (8, 10, 4))
        self.assertAlmostEqual(float(layer[..., 3].max()), 0.8)  # the strongest value: opacity alpha
        self.assertEqual(float(layer[7, 9, 3]), 0.0)  # where the map is 0 the drawing shows unchanged
        base = fig.axes[2].images[0].get_array()
        self.assertAlmostEqual(float(base.min()), 0.5)  # a black drawing is drawn mid-grey under the colours

    def test_one_power_of_ten_for_every_bar_of_a_figure(self):
        """An explain figure read "× 1e-2" beside one panel and raw numbers beside the next (each bar took the power
        of ten of its own maximum); the figure's largest |value| now sets one for every bar."""
        q, r = torch.zeros(4, 5), torch.full((4, 5), 0.005)
        q[0, 0] = 0.2
        fig = _figure(panels=[[("a", "query", q, None), ("b", "reference", r, None, True)]])
        bars = _colorbars(fig)
        self.assertEqual([ax.get_ylabel().replace("\n", " ") for ax in bars], [COSINE_QUANTITY] * 2)
        self.assertEqual([tuple(round(v, 6) for v in ax.get_ylim()) for ax in bars], [(-0.2, 0.2), (-0.005, 0.005)])
        q[0, 0] = 0.04  # largest 4e-2: every bar in units of 1e-2, the small map's too
        bars = _colorbars(_figure(panels=[[("a", "query", q, None), ("b", "reference", r, None, True)]]))
        self.assertEqual([ax.get_ylabel().replace("\n", " ") for ax in bars], [f"{COSINE_QUANTITY} (× 1e-2)"] * 2)
        self.assertEqual([tuple(round(v, 6) for v in ax.get_ylim()) for ax in bars], [(-4.0, 4.0), (-0.5, 0.5)])


class TestExplanationPanels(unittest.TestCase):
    def test_bias_panels_only_when_they_add_something(self):
        q, r = torch.rand(3, 3) + 0.5, torch.rand(4, 4) + 0.5
        panels, note = explanation_panels(q, r, q, r, (1.0, 1.0), r)
        self.assertEqual(
            [p[0] for p in panels], ["Decomposition (query)", "Decomposition (reference)", "point-specific: match of ×"]
        )
        self.assertEqual(note, "Decomposition+Bias not shown: equal to Decomposition (the head adds no bias)")
        # +0.5 % of the map: still left out, and the note says by how much they differ
        top = float(max(q.max(), r.max()))
        panels, note = explanation_panels(q, r, q + 0.005 * top, r, (1.0, 1.0), r)
        self.assertEqual(len(panels), 3)
        self.assertIn("within 0.5 % of Decomposition", note)
        # +10 %: shown, with titles that say what the bias adds
        qb = q + 0.1 * top
        self.assertAlmostEqual(bias_difference(q, r, qb, r), 0.1, places=6)
        panels, note = explanation_panels(q, r, qb, r, (1.0, 1.0), r, reference_name="retrieved")
        self.assertIsNone(note)
        self.assertEqual(
            [p[0] for p in panels],
            [
                "Decomposition (query)",
                "Decomposition+Bias (query):\n+ match with the reference's bias",
                "Decomposition (retrieved)",
                "Decomposition+Bias (retrieved):\n+ match with the query's bias",
                "point-specific: match of ×",
            ],
        )
        self.assertEqual(len(explanation_panels(q, r, q, r, (1.0, 1.0), r, show_bias=True)[0]), 5)


if __name__ == "__main__":
    unittest.main()


def test_the_best_match_star_sits_at_the_centre_of_the_maximal_cell():
    """A user trial: on a 3 x 3 map upsampled to the image, the star of the "point-specific" panel sat half off the
    image, at the top-left pixel of the maximal cell (argmax's first pixel)."""
    import numpy as np

    from pml_extensions.explain.overlay import max_point

    cells = np.array([[0.0, 0.1, 0.0], [0.9, 0.2, 0.0], [0.0, 0.0, 0.3]])
    assert max_point(np.kron(cells, np.ones((32, 32)))) == (47.5, 15.5)  # the middle of cell (1, 0): 32 + 15.5, 15.5
    # two maximal cells apart: the star takes the region of the first one, not the point between them
    cells[2, 2] = 0.9
    assert max_point(np.kron(cells, np.ones((2, 2)))) == (2.5, 0.5)
    # a map with one maximal pixel: that pixel
    smooth = np.zeros((5, 7))
    smooth[4, 6] = 1.0
    assert max_point(smooth) == (4.0, 6.0)
