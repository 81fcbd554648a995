"""Run by tests/testers/test_sharded_tester.py, alone (one process) or under ``torchrun --nproc_per_node 2``
(gloo): evaluates fixed embeddings models with the sharded testers and a distributed calculator, and writes, per
rank, the accuracies and how many images that rank embedded."""

import json
import sys

import torch

from pml_extensions.knn import AsymmetricAccuracyCalculator, ChunkedAccuracyCalculator
from pml_extensions.testers import AsymmetricTester, ShardedGlobalEmbeddingSpaceTester

CPU = torch.device("cpu")
METRICS = (
    "precision_at_1",
    "mean_average_precision_at_r",
    "mean_average_precision",
    "mean_reciprocal_rank",
    "r_precision",
)


class Points(torch.utils.data.Dataset):
    """``n`` 5-D points in 4 classes (fixed seed)."""

    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.labels = torch.arange(n) % 4
        self.x = torch.randn(4, 5, generator=g)[self.labels] + torch.randn(n, 5, generator=g)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return self.x[i], self.labels[i]


def model(seed):
    torch.manual_seed(seed)
    return torch.nn.Linear(5, 3)


def run():
    counts = {"student": 0, "teacher": 0}
    student, teacher = model(0), model(1)
    student.register_forward_hook(lambda m, i, o: counts.__setitem__("student", counts["student"] + len(o)))
    teacher.register_forward_hook(lambda m, i, o: counts.__setitem__("teacher", counts["teacher"] + len(o)))
    data = {"val": Points(37, 0), "train": Points(22, 1)}
    kw = dict(data_device=CPU, dataloader_num_workers=0, batch_size=6)
    calc = ChunkedAccuracyCalculator(include=METRICS, k="max_bin_count", chunk_size=4, distributed=True)
    plain = ShardedGlobalEmbeddingSpaceTester(accuracy_calculator=calc, **kw).test(
        data, 0, student, splits_to_eval=[("val", ["val", "train"]), ("train", ["train"])]
    )
    asym_calc = AsymmetricAccuracyCalculator(
        include=METRICS + ("mean_average_precision_trapezoidal",), chunk_size=5, distributed=True
    )
    asym = AsymmetricTester(accuracy_calculator=asym_calc, **kw).test(data, 0, student, reference_trunk_model=teacher)
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(101, 4, generator=g), torch.randint(0, 5, (101,), generator=g)
    direct = AsymmetricAccuracyCalculator(
        include=METRICS, chunk_size=3, distributed=True, avg_of_avgs=True
    ).get_accuracy(x, y)
    return {"plain": plain, "asymmetric": asym, "direct": direct, "embedded": counts}


def main(out_path):
    distributed = torch.distributed.is_available() and "WORLD_SIZE" in __import__("os").environ
    if distributed:
        torch.distributed.init_process_group("gloo")
    result = run()
    if distributed:
        result["world_size"] = torch.distributed.get_world_size()
        gathered = [None] * result["world_size"]
        torch.distributed.all_gather_object(gathered, result)
        if torch.distributed.get_rank() == 0:
            with open(out_path, "w") as f:
                json.dump(gathered, f)
        torch.distributed.destroy_process_group()
    else:
        with open(out_path, "w") as f:
            json.dump([result], f)


if __name__ == "__main__":
    main(sys.argv[1])
