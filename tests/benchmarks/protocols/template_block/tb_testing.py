"""A tiny template_block config for the tests: ``benchmarks/configs/template_block_table1`` on a few Fashion-MNIST
images per class (10 classes), 2 epochs of 3 iterations, batch 8."""

from benchmarks.protocols import config_path
from pml_extensions.runner.config.loader import select_variants
from pml_extensions.runner.protocols import load_config


def tiny_config(variants=("baseline", "block", "aux_only", "wider"), seeds=(0, 1), name="template_block_table1"):
    config, sources = load_config(config_path(name), {"config_general": ["default", "quick"]})
    config = select_variants(config, list(variants))
    config.update(
        seeds=list(seeds), num_epochs=2, iterations_per_epoch=3, batch_size=8, device="cpu", eval_batch_size=16
    )
    config["split"] = {"train": 6, "val": 2, "seed": 1234}
    config["test_dataset"]["FashionMNIST"]["max_per_class"] = 2
    return config, sources
