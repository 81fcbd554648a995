import unittest

import torch
from pytorch_metric_learning.distances import CosineSimilarity, DotProductSimilarity, LpDistance
from pytorch_metric_learning.reducers import SumReducer

from pml_extensions.losses.resolution_distillation_loss import ResolutionDistillationLoss
from tests.testing_utils import angle_to_coord

# Two source images x three augmentations, 2-D unit vectors at multiples of 90 degrees so every dot product is
# 0 or +-1 and every term can be written out by hand (eps0 = 0).
# Image A (id 0): teacher v = 0, 90, 180 deg; student u = 0, 0, 90 deg.
#   abs   : u1.v1 = 1, u2.v2 = 0, u3.v3 = 0             -> (0 + 1 + 1) / 3 = 2/3
#   rel-ts: (u_i.v_j - v_i.v_j)^2 for (i,j) = 12,13,21,23,31,32 = 0,0,1,1,1,1 -> 4 / (3*2) = 2/3
#   rel-ss: (u_i.u_j - v_i.v_j)^2 for pairs 12,13,23 (each twice) = 1,1,0 -> 4 / 6 = 2/3
# Image B (id 1): teacher v = 90, 0, 90 deg; student u = 90, 90, 90 deg.
#   abs   : 1, 0, 1 -> (0 + 1 + 0) / 3 = 1/3
#   rel-ts: 12: 0-0, 13: 1-1, 21: 1-0, 23: 1-0, 31: 1-1, 32: 0-0 -> 2 / 6 = 1/3
#   rel-ss: 12: 1-0, 13: 1-1, 23: 1-0 (each twice) -> 4 / 6 = 2/3
# With lambda_ts = lambda_ss = 0.7: A = 2/3 * 2.4 = 1.6, B = 1/3 + 0.7/3 + 1.4/3 = 31/30, mean = 79/60.
TEACHER = {0: [0, 90, 180], 1: [90, 0, 90]}
STUDENT = {0: [0, 0, 90], 1: [90, 90, 90]}
EXPECTED = {"abs": [2 / 3, 1 / 3], "rel_ts": [2 / 3, 1 / 3], "rel_ss": [2 / 3, 2 / 3]}


def toy(order=None, dtype=torch.float64):
    rows = [(img, k) for img in (0, 1) for k in range(3)]
    if order is not None:
        rows = [rows[i] for i in order]
    u = angle_to_coord([STUDENT[i][k] for i, k in rows], dtype=dtype)
    v = angle_to_coord([TEACHER[i][k] for i, k in rows], dtype=dtype)
    labels = torch.tensor([i for i, _ in rows])
    return u, v, labels


class TestResolutionDistillationLoss(unittest.TestCase):
    def test_each_term_by_hand(self):
        u, v, labels = toy()
        weights = {"abs": (1, 0, 0), "rel_ts": (0, 1, 0), "rel_ss": (0, 0, 1)}
        for term, (wa, wt, ws) in weights.items():
            loss_fn = ResolutionDistillationLoss(lambda_abs=wa, lambda_ts=wt, lambda_ss=ws, eps0=0.0)
            self.assertEqual(loss_fn.sub_loss_names(), [f"{term}_loss"])
            value = loss_fn(u, labels, ref_emb=v)
            self.assertAlmostEqual(value.item(), sum(EXPECTED[term]) / 2, places=12, msg=term)
            # per-image values, through compute_loss
            d = loss_fn.compute_loss(u, labels, None, v, None)[f"{term}_loss"]
            self.assertEqual(d["reduction_type"], "element")
            torch.testing.assert_close(d["losses"], torch.tensor(EXPECTED[term], dtype=torch.float64))
            self.assertEqual(d["indices"].tolist(), [0, 3])

    def test_total_eq10_mean_and_sum(self):
        u, v, labels = toy()
        loss_fn = ResolutionDistillationLoss(eps0=0.0)
        self.assertAlmostEqual(loss_fn(u, labels, ref_emb=v).item(), 79 / 60, places=12)
        self.assertAlmostEqual(loss_fn.abs_loss, 0.5, places=12)
        self.assertAlmostEqual(loss_fn.rel_ts_loss, 0.5, places=12)
        self.assertAlmostEqual(loss_fn.rel_ss_loss, 2 / 3, places=12)
        summed = ResolutionDistillationLoss(eps0=0.0, reducer=SumReducer())
        self.assertAlmostEqual(summed(u, labels, ref_emb=v).item(), 79 / 30, places=12)

    def test_rows_grouped_by_label_not_position(self):
        u, v, labels = toy(order=[3, 0, 4, 1, 5, 2])
        self.assertAlmostEqual(ResolutionDistillationLoss(eps0=0.0)(u, labels, ref_emb=v).item(), 79 / 60, places=12)

    def test_student_equals_teacher(self):
        # exactly unit-norm rows: every per-image term is eps0^2, so L = (1 + 0.7 + 0.7) eps0^2 per image (mean)
        torch.manual_seed(0)
        v = torch.nn.functional.normalize(torch.randn(12, 5, dtype=torch.float64), dim=1)
        labels = torch.arange(4).repeat_interleave(3)
        loss_fn = ResolutionDistillationLoss()
        value = loss_fn(v.clone(), labels, ref_emb=v)
        self.assertAlmostEqual(value.item(), 2.4e-12, delta=1e-16)
        for term in ("abs_loss", "rel_ts_loss", "rel_ss_loss"):
            self.assertAlmostEqual(getattr(loss_fn, term), 1e-12, delta=1e-16)
        self.assertLess(ResolutionDistillationLoss(eps0=0.0)(v.clone(), labels, ref_emb=v).item(), 1e-28)

    def test_relations_unaffected_by_other_images(self):
        u, v, labels = toy()
        loss_fn = ResolutionDistillationLoss(eps0=1e-6)
        before = loss_fn.compute_loss(u, labels, None, v, None)
        u2, v2 = u.clone(), v.clone()
        u2[3:] = torch.nn.functional.normalize(torch.randn(3, 2, dtype=torch.float64), dim=1)
        v2[3:] = torch.nn.functional.normalize(torch.randn(3, 2, dtype=torch.float64), dim=1)
        after = loss_fn.compute_loss(u2, labels, None, v2, None)
        for key in ("abs_loss", "rel_ts_loss", "rel_ss_loss"):
            self.assertEqual(before[key]["losses"][0].item(), after[key]["losses"][0].item())
            self.assertNotEqual(before[key]["losses"][1].item(), after[key]["losses"][1].item())

    def test_gradient_reaches_student_only_through_embeddings(self):
        u, v, labels = toy(dtype=torch.float32)
        u.requires_grad_(True)
        ResolutionDistillationLoss()(u, labels, ref_emb=v).backward()
        self.assertTrue(torch.isfinite(u.grad).all())
        self.assertGreater(u.grad.abs().sum().item(), 0)

    def test_cosine_similarity_option(self):
        u, v, labels = toy()
        scaled = ResolutionDistillationLoss(eps0=0.0, distance=CosineSimilarity())(3 * u, labels, ref_emb=2 * v)
        self.assertAlmostEqual(scaled.item(), 79 / 60, places=12)

    def test_default_similarity_works_on_cosines(self):
        # the default DotProductSimilarity() L2-normalises: scaling the rows changes nothing (79/60 as for cosines)
        u, v, labels = toy()
        scaled = ResolutionDistillationLoss(eps0=0.0)(3 * u, labels, ref_emb=2 * v)
        self.assertAlmostEqual(scaled.item(), 79 / 60, places=12)
        raw = ResolutionDistillationLoss(eps0=0.0, distance=DotProductSimilarity(normalize_embeddings=False))
        self.assertNotAlmostEqual(raw(3 * u, labels, ref_emb=2 * v).item(), 79 / 60, places=3)

    def test_variable_number_of_augmentations(self):
        # image 0 keeps its first two rows only: abs (0 + 1)/2, rel-ts 12: 0 and 21: (1 - 0)^2 -> 1/2,
        # rel-ss 12 and 21: (1 - 0)^2 -> 1
        u, v, labels = toy()
        keep = [0, 1, 3, 4, 5]
        loss_fn = ResolutionDistillationLoss(eps0=0.0)
        d = loss_fn.compute_loss(u[keep], labels[keep], None, v[keep], None)
        self.assertAlmostEqual(d["abs_loss"]["losses"][0].item(), 0.5)
        self.assertAlmostEqual(d["rel_ts_loss"]["losses"][0].item(), 0.7 * 0.5)
        self.assertAlmostEqual(d["rel_ss_loss"]["losses"][0].item(), 0.7 * 1.0)

    def test_empty_batch_is_zero(self):
        empty = torch.zeros(0, 2, dtype=torch.float64)
        self.assertEqual(ResolutionDistillationLoss()(empty, torch.zeros(0, dtype=torch.long), ref_emb=empty).item(), 0)

    def test_bad_input(self):
        u, v, labels = toy()
        loss_fn = ResolutionDistillationLoss()
        with self.assertRaisesRegex(ValueError, "ref_emb is required"):
            loss_fn(u, labels)
        with self.assertRaisesRegex(ValueError, "aligned one to one"):
            loss_fn(u, labels, ref_emb=v[:5])
        with self.assertRaisesRegex(ValueError, "D=2 but ref_emb have D=3"):
            loss_fn(u, labels, ref_emb=torch.zeros(6, 3, dtype=torch.float64))
        with self.assertRaisesRegex(ValueError, "at least 2 augmentations"):
            loss_fn(u, torch.arange(6), ref_emb=v)
        # L_abs alone accepts single augmentations
        ResolutionDistillationLoss(lambda_ts=0, lambda_ss=0)(u, torch.arange(6), ref_emb=v)
        with self.assertRaisesRegex(ValueError, "labels"):
            loss_fn(u, None, ref_emb=v)
        with self.assertRaisesRegex(ValueError, "ref_labels must equal labels"):
            loss_fn(u, labels, ref_emb=v, ref_labels=labels.flip(0))
        with self.assertRaisesRegex(TypeError, "floating-point"):
            loss_fn(u.long(), labels, ref_emb=v)
        bad = u.clone()
        bad[0, 0] = float("nan")
        with self.assertRaisesRegex(ValueError, "NaN"):
            loss_fn(bad, labels, ref_emb=v)
        with self.assertRaisesRegex(ValueError, "lambda_ts"):
            ResolutionDistillationLoss(lambda_ts=-1)
        with self.assertRaisesRegex(ValueError, "at least one"):
            ResolutionDistillationLoss(lambda_abs=0, lambda_ts=0, lambda_ss=0)
        with self.assertRaisesRegex(ValueError, "similarity"):
            ResolutionDistillationLoss(distance=LpDistance())


class TestResolutionDistillationLossAlone(unittest.TestCase):
    """Issue 12: used alone (outside the trainer) the loss must not train the teacher; mixed dtypes are promoted."""

    def test_no_gradient_reaches_ref_emb_by_default(self):
        u, v, labels = toy(dtype=torch.float32)
        teacher = torch.nn.Linear(2, 2, bias=False)
        with torch.no_grad():
            teacher.weight.copy_(torch.eye(2))
        u.requires_grad_(True)
        v.requires_grad_(True)
        ref_emb = teacher(v)  # a teacher forward WITH autograd graph, as a user calling the loss by hand would have
        ResolutionDistillationLoss()(u, labels, ref_emb=ref_emb).backward()
        self.assertIsNone(v.grad)
        self.assertIsNone(teacher.weight.grad)
        self.assertGreater(u.grad.abs().sum().item(), 0)
        # opt-in: the graph into the teacher rows is kept
        u.grad = None
        ResolutionDistillationLoss(detach_ref_emb=False)(u, labels, ref_emb=teacher(v)).backward()
        self.assertGreater(teacher.weight.grad.abs().sum().item(), 0)
        self.assertGreater(v.grad.abs().sum().item(), 0)
        with self.assertRaisesRegex(TypeError, "detach_ref_emb"):
            ResolutionDistillationLoss(detach_ref_emb="yes")

    def test_mixed_dtypes_are_promoted(self):
        # float32 student with float64 teacher: computed in float64, the hand value 79/60 (eps0 = 0).
        u, v, labels = toy()
        loss_fn = ResolutionDistillationLoss(eps0=0.0)
        mixed = loss_fn(u.float(), labels, ref_emb=v)
        self.assertEqual(mixed.dtype, torch.float64)
        self.assertAlmostEqual(mixed.item(), 79 / 60, places=6)  # u rounded to float32 (cos 90 deg = 6e-17 -> 4e-8)
        swapped = loss_fn(u, labels, ref_emb=v.float())
        self.assertEqual(swapped.dtype, torch.float64)
        self.assertAlmostEqual(swapped.item(), 79 / 60, places=6)

    def test_half_precision_and_autocast(self):
        # rows are 0/±1 up to rounding, exact in float16/bfloat16 after rounding; computed in float32 inside.
        u, v, labels = toy()
        loss_fn = ResolutionDistillationLoss(eps0=0.0)
        for dtype in (torch.float16, torch.bfloat16):
            uu = u.to(dtype).requires_grad_(True)
            value = loss_fn(uu, labels, ref_emb=v.to(dtype))
            self.assertEqual(value.dtype, torch.float32)
            self.assertAlmostEqual(value.item(), 79 / 60, places=5)
            value.backward()
            self.assertEqual(uu.grad.dtype, dtype)
            self.assertTrue(torch.isfinite(uu.grad).all())
        with torch.autocast("cpu", dtype=torch.bfloat16):
            value = loss_fn(u.float(), labels, ref_emb=v.float())
        self.assertEqual(value.dtype, torch.float32)
        self.assertAlmostEqual(value.item(), 79 / 60, places=5)
