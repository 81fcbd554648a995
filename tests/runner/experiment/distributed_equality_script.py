"""Run by tests/runner/experiment/test_distributed.py under ``torchrun --nproc_per_node 2`` (gloo): each process takes
its slice of one global batch through the runner's distributed helpers and rank 0 writes the loss and
gradients as JSON.

``distributed_equality_script.py OUT [CLI ARGS...]``: with CLI arguments the processes first run that tiny-config
command as ``tests/runner/runner_testing_utils.py`` does (one torchrun launch serves two tests), then the equality
check in the group the run joined, then leave it.
"""

import json
import sys

import torch

from pml_extensions.runner.experiment import distributed as d
from tests.runner.experiment.test_distributed import global_batch, make_losses, make_model


def main(out_path):
    assert d.init_from_env("gloo"), "expected torchrun with WORLD_SIZE > 1"
    x, y, h = global_batch()
    models = d.wrap_models({"embedder": make_model()}, torch.device("cpu"))
    losses = d.wrap_losses(make_losses())
    idx = list(d.DistributedBatchSliceSampler(list(range(len(y))), global_batch_size=len(y)))
    result = {"rank_indices": idx, "world_size": d.world_size()}
    for name, loss_fn in losses.items():
        models["embedder"].zero_grad()
        emb = models["embedder"](x[idx])
        kwargs = {"histograms": h[idx]} if name == "xml" else {}
        loss = loss_fn(emb, y[idx], **kwargs)
        loss.backward()
        # the wrapper returns world_size x loss(gathered batch) (PML's convention; DDP then averages
        # gradients)
        result[name] = {
            "loss": loss.item() / d.world_size(),
            "grad": [p.grad.tolist() for p in d.unwrap(models["embedder"]).parameters()],
        }
    gathered = [None] * d.world_size()
    torch.distributed.all_gather_object(gathered, result)
    if d.is_main():
        with open(out_path, "w") as f:
            json.dump(gathered, f)
    del models, losses, emb, loss  # DDP wrappers first, then the group they hold
    d.shutdown()


if __name__ == "__main__":
    if len(sys.argv) > 2:
        from pml_extensions.cli.run import main as run_main
        from tests.runner.runner_testing_utils import register_tiny

        register_tiny()
        status = run_main(sys.argv[2:])
        if status:
            sys.exit(status)
    main(sys.argv[1])
