import unittest

import torch

from pml_extensions.trunks import FrozenPrefix


class TestFrozenPrefix(unittest.TestCase):
    def _prefix(self):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            prefix = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU())
        prefix[1].running_mean.fill_(0.3)
        return prefix

    def test_stays_in_eval_mode_without_gradients_when_the_model_trains(self):
        prefix = self._prefix()
        rest = torch.nn.Sequential(torch.nn.Conv2d(4, 2, 1), torch.nn.Flatten())
        model = torch.nn.Sequential(FrozenPrefix(prefix), rest).train()
        self.assertTrue(model[0].training)
        self.assertFalse(any(m.training for m in prefix.modules()))
        self.assertFalse(any(p.requires_grad for p in prefix.parameters()))
        x = torch.randn(5, 3, 6, 6, dtype=torch.float32)
        out = model(x)
        out.square().sum().backward()
        self.assertTrue(torch.equal(prefix[1].running_mean, torch.full((4,), 0.3)))  # no batch statistics used
        self.assertTrue(all(p.grad is None for p in prefix.parameters()))
        self.assertIsNotNone(rest[0].weight.grad)
        # eval-mode prefix: its output equals the plain prefix in eval mode, exactly
        with torch.no_grad():
            self.assertTrue(torch.equal(model[0](x), prefix.eval()(x)))
        model.eval()
        self.assertFalse(model[0].training)

    def test_rejects_a_non_module(self):
        with self.assertRaisesRegex(TypeError, "prefix must be a torch.nn.Module, got function"):
            FrozenPrefix(lambda x: x)
