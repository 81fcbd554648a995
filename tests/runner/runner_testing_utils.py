"""Tiny data and a tiny MLRC-layout config for the runner tests (seconds on one CPU core).

Run as a script it registers :class:`TinyVectors` and calls the CLI, so a test can start it as a subprocess
(and SIGKILL it): ``python runner_testing_utils.py CONFIG_ROOT --root_experiment_folder DIR ...``.
"""

import os
import sys
import time

import numpy as np
import torch

#: this folder (the helper also runs as a script from here) and the checkout root
RUNNER_TESTS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(RUNNER_TESTS))


def dejavu_fonts():
    """matplotlib's DejaVu Sans font files: the glyph set on these alone has 248 of the 682 images of a split (every
    evaluation embeds its whole split), for tests whose assertions do not depend on the size."""
    from pml_extensions.datasets.glyph_dataset import matplotlib_font_files

    return matplotlib_font_files("DejaVuSans")


class TinyVectors(torch.utils.data.Dataset):
    """``num_classes`` Gaussian blobs of 4×4×1 float32 arrays (HWC, so ``ToTensor`` gives [1, 4, 4] unscaled).

    ``sleep`` seconds per item slow the run down; with ``progress_file`` each fetched item appends one byte
    there.
    """

    def __init__(self, num_classes=16, per_class=8, seed=0, sleep=0.0, progress_file=None, transform=None):
        rng = np.random.RandomState(seed)
        centers = rng.randn(num_classes, 16) * 2.0
        self.labels = np.repeat(np.arange(num_classes), per_class).astype(np.int64)
        self.data = (centers[self.labels] + rng.randn(len(self.labels), 16)).astype(np.float32).reshape(-1, 4, 4, 1)
        self.sleep = float(sleep)
        self.progress_file = progress_file
        self.transform = transform

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        if self.sleep:
            time.sleep(self.sleep)
        if self.progress_file:
            with open(self.progress_file, "a") as f:
                f.write(".")
        x = self.data[i]
        if self.transform is not None:
            x = self.transform(x)
        return x, int(self.labels[i])


class FixedLinear(torch.nn.Linear):
    """A Linear layer whose weights come from its own ``seed``: a stand-in for pretrained weights (the same in every
    run, whatever the global RNG), so a feature cache can serve every seed."""

    def __init__(self, in_features, out_features, seed=0):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            super().__init__(in_features, out_features)


class FixedConvNetBody(torch.nn.Module):
    """:class:`pml_extensions.trunks.ConvNetBody` with weights from its own ``seed`` (a stand-in for pretrained
    weights); ``features`` is its Sequential."""

    def __init__(self, seed=0, **kwargs):
        from pml_extensions.trunks import ConvNetBody

        super().__init__()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.features = ConvNetBody(**kwargs).features

    def forward(self, x):
        return self.features(x)


FILES = {
    "config_general/default.yaml": """
trainer:
  MetricLossOnly:
    iterations_per_epoch: 4
    dataloader_num_workers: 0
    batch_size: 8
    freeze_trunk_batchnorm: False
    set_min_label_to_zero: True
num_epochs_train: 3
save_interval: 1
patience: 5
check_untrained_accuracy: True
seed: 0
device: cpu
""",
    "config_models/default.yaml": """
models:
  trunk:
    - Flatten: null
    - Linear: {in_features: 16, out_features: 16}
  embedder:
    MLP:
      layer_sizes: [8]
""",
    "config_loss_and_miners/default.yaml": """
loss_funcs:
  metric_loss:
    ContrastiveLoss: {pos_margin: 0.0, neg_margin: 1.0}
mining_funcs: {}
sampler:
  MPerClassSampler: {m: 4}
""",
    "config_optimizers/default.yaml": """
optimizers:
  trunk_optimizer:
    RMSprop: {lr: 0.001, weight_decay: 0.0001, momentum: 0.9}
  embedder_optimizer:
    RMSprop: {lr: 0.001, weight_decay: 0.0001, momentum: 0.9}
""",
    "config_transforms/default.yaml": """
transforms:
  train: {ToTensor: {}}
  eval: {ToTensor: {}}
""",
    "config_eval/default.yaml": """
eval_batch_size: 64
eval_dataloader_num_workers: 0
eval_primary_metric: mean_average_precision_at_r
eval_accuracy_calculator:
  AccuracyCalculator:
    include: [mean_average_precision_at_r, precision_at_1, r_precision]
    k: max_bin_count
""",
    "config_dataset/default.yaml": """
dataset:
  TinyVectors: {num_classes: 16, per_class: 8}
test_size: 0.5
test_start_idx: 0.5
num_training_partitions: 4
num_training_sets: 4
""",
}


def write_tiny_config(root: str, files=None) -> str:
    """Write the tiny config (``FILES`` updated with ``files``) under ``root`` and return ``root``."""
    for rel, text in dict(FILES, **(files or {})).items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
    return root


def register_tiny():
    from pml_extensions.runner.config.registry import register

    register(TinyVectors, role="dataset")
    register(FixedLinear, role="model")
    register(FixedConvNetBody, role="model")


if __name__ == "__main__":
    register_tiny()
    from pml_extensions.cli.run import main
    from pml_extensions.runner.experiment.distributed import shutdown

    status = main(sys.argv[1:])
    if status == 0:
        shutdown()  # as python -m pml_extensions does: under torchrun the ranks leave the group together
    sys.exit(status)
