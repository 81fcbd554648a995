"""Builds the tiny test cache in a subprocess: ``torchrun ... feature_cache_script.py FOLDER dist`` (each rank its
shard, ranks from torch.distributed) or ``python feature_cache_script.py FOLDER slow`` (one batch per 0.3 s, to be
killed mid-build)."""

import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from pml_extensions.datasets import FeatureCache  # noqa: E402
from tests.datasets.cache_testing_utils import TinyImages, tiny_split, train_transform  # noqa: E402

KW = dict(num_views=3, dtype="float32", chunk_size=2, batch_size=3, dataset_key="tiny")


def make_cache(folder):
    _, prefix, _ = tiny_split()
    return FeatureCache(folder, prefix, TinyImages(n=10), train_transform(), **KW), prefix


def main(folder, mode):
    cache, prefix = make_cache(folder)
    if mode == "dist":
        torch.distributed.init_process_group("gloo")
        complete = cache.build()
        done = cache.chunks_done()
        print(f"rank {torch.distributed.get_rank()} complete={complete} computed={cache.last_build['chunks_computed']}")
        torch.distributed.destroy_process_group()
        return 0 if complete and len(done) == cache.num_chunks else 1
    prefix.register_forward_hook(lambda *a: time.sleep(0.3))
    cache.build()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
