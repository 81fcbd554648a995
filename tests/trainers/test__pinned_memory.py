import unittest
import warnings

import torch

from pml_extensions.trainers._pinned_memory import to_data_device
from tests.trainers.test_resolution_distillation_trainer import make


class TestPinnedMemory(unittest.TestCase):
    def test_loader_pinned_only_for_a_cuda_data_device(self):
        cpu = make()
        cpu.initialize_dataloader()
        self.assertFalse(cpu.dataloader.pin_memory)
        cuda = make(data_device=torch.device("cuda"))  # no model is moved before training: builds without a GPU
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "pin_memory ... no accelerator" on a CPU-only machine
            cuda.initialize_dataloader()
        self.assertTrue(cuda.dataloader.pin_memory)

    def test_to_data_device_on_cpu(self):
        x = torch.arange(4.0)
        self.assertIs(to_data_device(x, torch.device("cpu")), x)
        self.assertEqual(to_data_device(x, "cpu", torch.float64).dtype, torch.float64)


if __name__ == "__main__":
    unittest.main()
