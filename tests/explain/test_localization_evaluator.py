import unittest

import numpy as np
import torch

from pml_extensions.explain.localization_evaluator import LocalizationEvaluator


class TestLocalizationEvaluator(unittest.TestCase):
    def test_iou_hand_computed(self):
        # [0, 4) x [0, 4) and [2, 6) x [2, 6): intersection 2 x 2 = 4, union 16 + 16 - 4 = 28
        self.assertAlmostEqual(LocalizationEvaluator.iou((0, 0, 4, 4), (2, 2, 6, 6)), 4 / 28)
        self.assertEqual(LocalizationEvaluator.iou((0, 0, 2, 2), (2, 2, 4, 4)), 0.0)
        self.assertEqual(LocalizationEvaluator.iou((1, 2, 5, 7), (1, 2, 5, 7)), 1.0)
        with self.assertRaisesRegex(ValueError, "box_a"):
            LocalizationEvaluator.iou((3, 0, 1, 4), (0, 0, 1, 1))

    def test_largest_component_and_box(self):
        mask = np.zeros((6, 7), dtype=bool)
        mask[0:2, 0:2] = True  # 4 pixels
        mask[3:6, 3:5] = True  # 6 pixels
        mask[2, 5] = True  # touches the second blob diagonally (8-connected) -> 7 pixels
        largest = LocalizationEvaluator.largest_component(mask)
        self.assertEqual(int(largest.sum()), 7)
        self.assertFalse(largest[0, 0])
        self.assertEqual(LocalizationEvaluator.mask_to_box(largest), (3, 2, 6, 6))
        self.assertIsNone(LocalizationEvaluator.mask_to_box(np.zeros((3, 3), dtype=bool)))
        self.assertFalse(LocalizationEvaluator.largest_component(np.zeros((3, 3), dtype=bool)).any())

    def test_ground_truth_mask_gives_accuracy_one(self):
        rng = np.random.default_rng(0)
        maps, boxes = [], []
        for _ in range(5):
            m = np.zeros((40, 50))
            y0, x0 = rng.integers(0, 20), rng.integers(0, 25)
            y1, x1 = y0 + rng.integers(5, 20), x0 + rng.integers(5, 25)
            m[y0:y1, x0:x1] = 1.0
            maps.append(torch.from_numpy(m))
            boxes.append((x0, y0, x1, y1))
        res = LocalizationEvaluator().evaluate(maps, boxes, (40, 50))
        np.testing.assert_array_equal(res["accuracy"], np.ones(19))
        self.assertEqual(res["best_accuracy"], 1.0)
        self.assertEqual(res["n"], 5)

    def test_low_resolution_map_is_resized(self):
        # a 4 x 4 map with one hot cell in a 40 x 40 image: min-max, bilinear resize, threshold 0.5 ->
        # about the cell
        m = torch.zeros(4, 4, dtype=torch.float64)
        m[1, 2] = 1.0
        ev = LocalizationEvaluator(thresholds=[0.5])
        (box,) = ev.predict_boxes(m, (40, 40))
        self.assertGreater(ev.iou(box, (20, 10, 30, 20)), 0.5)
        self.assertTrue(ev.correct(m, (20, 10, 30, 20), (40, 40))[0])
        self.assertFalse(ev.correct(m, (0, 0, 10, 10), (40, 40))[0])

    def test_threshold_grid_and_best(self):
        m = torch.tensor([[0.0, 0.5], [0.5, 1.0]], dtype=torch.float64)
        ev = LocalizationEvaluator(thresholds=[0.25, 0.9])
        # at 0.9 only the [1, 1] cell: box (1, 1, 2, 2) (map already at image size)
        res = ev.evaluate([m], [(1, 1, 2, 2)], (2, 2))
        np.testing.assert_array_equal(res["accuracy"], [0.0, 1.0])
        self.assertEqual(res["best_threshold"], 0.9)
        both = ev.evaluate_methods({"a": [m], "b": [1 - m]}, [(1, 1, 2, 2)], (2, 2))
        self.assertEqual(both["a"]["best_accuracy"], 1.0)
        self.assertEqual(both["b"]["best_accuracy"], 0.0)

    def test_centre_box_baseline(self):
        res = LocalizationEvaluator.centre_box_accuracy([(25, 25, 75, 75), (0, 0, 10, 10)], (100, 100))
        self.assertEqual(res["best_accuracy"], 0.5)
        # a centred 30 x 30 box has IoU 900 / 2500 = 0.36 with the first box; 40 x 40: 1600 / 2500 = 0.64
        self.assertEqual(res["accuracy"][0], 0.0)
        self.assertAlmostEqual(res["best_fraction"], 0.4, places=6)

    def test_anisotropic_strides_spectrogram(self):
        # issue 13: a trunk that downsamples only the frequency axis of 1 x 128 x 431 spectrograms -> 16 x 431
        # map (strides 8 and 1). Map = 1 on rows 4..7 (pixels 32..63 after the per-axis resize) and columns
        # 100..199, 0 elsewhere; box (x0, y0, x1, y1) = (100, 32, 200, 64).
        m = torch.zeros(16, 431, dtype=torch.float64)
        m[4:8, 100:200] = 1.0
        ev = LocalizationEvaluator(thresholds=[0.5])
        boxes = ev.predict_boxes(m, (128, 431))
        # bilinear (half-pixel) resize along y: pixel y reads map row u = (y + 0.5) / 8 - 0.5; pixel 31 -> u =
        # 3.4375 (value 0.4375), pixel 32 -> 3.5625 (0.5625); pixel 63 -> 7.4375 (0.5625), 64 -> 7.5625
        # (0.4375); x is unchanged (stride 1)
        self.assertEqual(boxes[0], (100, 32, 200, 64))
        res = ev.evaluate([m], [(100, 32, 200, 64)], (128, 431))
        self.assertEqual(res["best_accuracy"], 1.0)

    def test_bad_inputs(self):
        ev = LocalizationEvaluator()
        with self.assertRaisesRegex(ValueError, "larger than the image"):
            ev.evaluate([torch.zeros(10, 10)], [(0, 0, 5, 5)], (8, 8))
        with self.assertRaisesRegex(ValueError, "boxes"):
            ev.evaluate([torch.zeros(4, 4)], [], (8, 8))
        with self.assertRaisesRegex(ValueError, "2-D"):
            ev.evaluate([torch.zeros(1, 4, 4)], [(0, 0, 2, 2)], (8, 8))
        with self.assertRaisesRegex(ValueError, "thresholds"):
            LocalizationEvaluator(thresholds=[1.5])


if __name__ == "__main__":
    unittest.main()
