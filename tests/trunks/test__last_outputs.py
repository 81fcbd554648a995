"""The mixin that leaves a module's last forward outputs out of its copies (issue 22, item 3)."""

import copy
import pickle
import unittest

import torch

from pml_extensions.trunks._last_outputs import _KeepsLastOutputs


class Scaler(_KeepsLastOutputs, torch.nn.Module):
    _last_outputs = ("last_output",)

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.tensor([2.0]))
        self.last_output = None
        self.note = torch.tensor([1.0])  # a plain tensor attribute that is not a last output: copied

    def forward(self, x):
        self.last_output = x * self.weight
        return self.last_output


class TestKeepsLastOutputs(unittest.TestCase):
    def test_copies_get_none_and_the_original_keeps_its_output(self):
        module = Scaler()
        module(torch.ones(3))
        self.assertIsNotNone(module.last_output.grad_fn)
        for copier in (copy.deepcopy, lambda m: pickle.loads(pickle.dumps(m)), copy.copy):
            twin = copier(module)
            self.assertIsNone(twin.last_output)
            self.assertTrue(torch.equal(twin.note, module.note))
            self.assertEqual(float(twin.weight), 2.0)
            self.assertIsNotNone(module.last_output)
        self.assertTrue(torch.equal(module(torch.ones(1)), torch.tensor([2.0])))

    def test_without_the_mixin_deepcopy_fails(self):
        # what the mixin prevents (PyTorch deep-copies only graph leaves)
        module = torch.nn.Linear(1, 1)
        module.last_output = module(torch.ones(1, 1))
        with self.assertRaisesRegex(RuntimeError, "graph leaves"):
            copy.deepcopy(module)
