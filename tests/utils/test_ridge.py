import unittest

import torch

from pml_extensions.utils import ridge_prototypes
from tests.testing_utils import simplex_rows


class TestRidgePrototypes(unittest.TestCase):
    def test_hand_computed_one_prototype(self):
        # H = [[1], [1]], Y = [[2], [4]], ridge 1: primal (1+1+1)^-1 * (2+4) = 2.
        # kernel: H^T (H H^T + I)^-1 Y = [1 1] · (1/3)[[2,-1],[-1,2]] · [2,4]^T = [1 1]·[0, 2]^T = 2.
        h = torch.tensor([[1.0], [1.0]], dtype=torch.float64)
        y = torch.tensor([[2.0], [4.0]], dtype=torch.float64)
        for form in ("primal", "kernel", "auto"):
            v = ridge_prototypes(h, y, 1.0, form)
            self.assertEqual(v.shape, (1, 1))
            self.assertAlmostEqual(float(v), 2.0, places=12)

    def test_hand_computed_identity_histograms(self):
        # H = I_2, ridge 1: V = (I + I)^-1 Y = Y / 2.
        h = torch.eye(2, dtype=torch.float64)
        y = torch.tensor([[3.0, -1.0], [0.5, 2.0]], dtype=torch.float64)
        torch.testing.assert_close(ridge_prototypes(h, y, 1.0, "kernel"), y / 2, rtol=0, atol=1e-14)
        torch.testing.assert_close(ridge_prototypes(h, y, 1.0, "primal"), y / 2, rtol=0, atol=1e-14)

    def _forms_and_reference(self, batch, m):
        h = simplex_rows(batch, m, seed=batch).requires_grad_()
        y = torch.randn(batch, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1)).requires_grad_()
        ridge = 0.05
        # float64 least-squares reference: min ||[H; sqrt(r) I] V - [Y; 0]||
        aug_h = torch.cat([h, ridge**0.5 * torch.eye(m, dtype=torch.float64)])
        aug_y = torch.cat([y, torch.zeros(m, 3, dtype=torch.float64)])
        ref = torch.linalg.lstsq(aug_h, aug_y).solution
        outs = {form: ridge_prototypes(h, y, ridge, form) for form in ("primal", "kernel")}
        outs["reference"] = ref
        grads = {}
        for name, v in outs.items():
            gh, gy = torch.autograd.grad((v * torch.arange(v.numel(), dtype=v.dtype).view_as(v)).sum(), (h, y))
            grads[name] = (gh, gy)
        return outs, grads

    def test_primal_equals_kernel_equals_lstsq_values_and_gradients(self):
        for batch, m in ((3, 5), (6, 4), (5, 5)):
            outs, grads = self._forms_and_reference(batch, m)
            torch.testing.assert_close(outs["primal"], outs["reference"], rtol=1e-9, atol=1e-10)
            torch.testing.assert_close(outs["kernel"], outs["reference"], rtol=1e-9, atol=1e-10)
            for i in range(2):
                torch.testing.assert_close(grads["primal"][i], grads["reference"][i], rtol=1e-8, atol=1e-9)
                torch.testing.assert_close(grads["kernel"][i], grads["reference"][i], rtol=1e-8, atol=1e-9)

    def test_auto_picks_kernel_when_batch_smaller_than_m(self):
        h = simplex_rows(2, 6)
        y = torch.randn(2, 3, dtype=torch.float64)
        calls = []
        original = torch.linalg.solve

        def spy(a, b):
            calls.append(a.shape)
            return original(a, b)

        torch.linalg.solve = spy
        try:
            ridge_prototypes(h, y, 0.05)
            ridge_prototypes(simplex_rows(8, 3), torch.randn(8, 3, dtype=torch.float64), 0.05)
        finally:
            torch.linalg.solve = original
        self.assertEqual(calls, [torch.Size([2, 2]), torch.Size([3, 3])])

    def test_float16_inputs_solve_in_float32_under_autocast(self):
        h = simplex_rows(4, 6, dtype=torch.float32).to(torch.bfloat16)
        y = torch.randn(4, 3).to(torch.bfloat16)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            v = ridge_prototypes(h, y, 0.05)
        self.assertEqual(v.dtype, torch.float32)

    def test_linearity_in_targets(self):
        # fitting to Y W gives V W (methods.md A1, "useful identity")
        h = simplex_rows(5, 4)
        y = torch.randn(5, 3, dtype=torch.float64)
        w = torch.randn(3, 2, dtype=torch.float64)
        torch.testing.assert_close(ridge_prototypes(h, y @ w, 0.05), ridge_prototypes(h, y, 0.05) @ w)

    def test_bad_input(self):
        h, y = simplex_rows(3, 2), torch.zeros(3, 2, dtype=torch.float64)
        with self.assertRaisesRegex(ValueError, "ridge"):
            ridge_prototypes(h, y, -0.1)
        with self.assertRaisesRegex(ValueError, "form"):
            ridge_prototypes(h, y, 0.1, "dual")
        with self.assertRaisesRegex(ValueError, "same B"):
            ridge_prototypes(h, y[:2], 0.1)
