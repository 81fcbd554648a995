import json
import os
import subprocess
import sys

import pytest
import torch
from pytorch_metric_learning.losses import ContrastiveLoss
from pytorch_metric_learning.samplers import MPerClassSampler

from pml_extensions.losses.xml_wrapper import XMLWrapper
from pml_extensions.runner.experiment import distributed as d
from tests.runner.runner_testing_utils import REPO, RUNNER_TESTS


def global_batch():
    """16 samples, 4 classes x 4, 5-D inputs and 6-bin histograms (fixed seed)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(16, 5, generator=g)
    y = torch.arange(4).repeat_interleave(4)
    h = torch.softmax(torch.randn(16, 6, generator=g), dim=1)
    return x, y, h


def make_model():
    g = torch.Generator().manual_seed(1)
    model = torch.nn.Linear(5, 3)
    with torch.no_grad():
        model.weight.copy_(torch.randn(3, 5, generator=g))
        model.bias.copy_(torch.randn(3, generator=g))
    return model


def make_losses():
    return {
        "contrastive": ContrastiveLoss(pos_margin=0.0, neg_margin=1.0),
        "xml": XMLWrapper(ContrastiveLoss(pos_margin=0.0, neg_margin=1.0), xml_weight=0.5, seed=0),
    }


class TestBatchSliceSampler:
    def test_slices_of_each_global_batch(self):
        base = list(range(10))
        r0 = list(d.DistributedBatchSliceSampler(base, 4, rank=0, world_size=2))
        r1 = list(d.DistributedBatchSliceSampler(base, 4, rank=1, world_size=2))
        # global batches [0..3], [4..7]; the incomplete [8, 9] is dropped
        assert r0 == [0, 1, 4, 5] and r1 == [2, 3, 6, 7]
        assert len(d.DistributedBatchSliceSampler(base, 4, rank=1, world_size=2)) == 4

    def test_keeps_m_per_class_structure_across_ranks(self):
        labels = torch.arange(8).repeat_interleave(5)
        import numpy as np

        np.random.seed(0)
        full = list(MPerClassSampler(labels, m=4, batch_size=8, length_before_new_iter=32))
        np.random.seed(0)
        r0 = list(
            d.DistributedBatchSliceSampler(
                MPerClassSampler(labels, m=4, batch_size=8, length_before_new_iter=32), 8, 0, 2
            )
        )
        np.random.seed(0)
        r1 = list(
            d.DistributedBatchSliceSampler(
                MPerClassSampler(labels, m=4, batch_size=8, length_before_new_iter=32), 8, 1, 2
            )
        )
        rebuilt = [i for b in range(4) for i in r0[4 * b : 4 * b + 4] + r1[4 * b : 4 * b + 4]]
        assert rebuilt == full

    @pytest.mark.parametrize(
        "kwargs",
        [dict(global_batch_size=5, rank=0, world_size=2), dict(global_batch_size=4, rank=2, world_size=2)],
    )
    def test_errors(self, kwargs):
        with pytest.raises(ValueError):
            d.DistributedBatchSliceSampler(list(range(8)), **kwargs)

    def test_noops_outside_torchrun(self):
        assert not d.is_active() and d.world_size() == 1 and d.rank() == 0
        losses = make_losses()
        assert d.wrap_losses(losses) is losses


SCRIPT = os.path.join(RUNNER_TESTS, "runner_testing_utils.py")
TINY_MLRC = ["--num_training_sets", "1", "--num_epochs_train", "1", "--check_untrained_accuracy", "false"]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """``(config root, experiment folder)``: the tiny MLRC config and its one-process run, the baseline that the
    torchrun tests below compare with (run once for them)."""
    from pml_extensions.cli.run import main
    from tests.runner.runner_testing_utils import register_tiny, write_tiny_config

    register_tiny()
    tmp = tmp_path_factory.mktemp("one_process")
    root = write_tiny_config(str(tmp / "cfg"))
    # the reference run in this process (the command runs as the script would; the torchrun runs are the children)
    assert main([root, *TINY_MLRC, "--root_experiment_folder", str(tmp / "one")]) == 0
    return root, tmp / "one"


@pytest.fixture(scope="module")
def single_node_torchrun(tmp_path_factory, one_process):
    """``(equality JSON, experiment folder)`` of one ``torchrun --standalone --nproc_per_node 2`` launch (2 gloo
    processes) that serves two tests: the tiny MLRC command of :func:`one_process` (as ``runner_testing_utils.py``
    runs it), then ``distributed_equality_script.py``'s check in the same group (3 processes, not 6)."""
    from tests.conftest import child_env

    root, _ = one_process
    tmp = tmp_path_factory.mktemp("single_node_torchrun")
    out, two = str(tmp / "dist.json"), tmp / "two"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    cmd += [os.path.join(RUNNER_TESTS, "experiment", "distributed_equality_script.py"), out]
    cmd += [root, *TINY_MLRC, "--root_experiment_folder", str(two)]
    proc = subprocess.run(cmd, env=child_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, two


@pytest.mark.slow
def test_torchrun_two_processes_gloo_equal_one_process(single_node_torchrun):
    """Same global batch: 2 gloo processes (each with half of it) give the one-process loss and gradients."""
    out, _ = single_node_torchrun
    ranks = json.load(open(out))
    assert [r["world_size"] for r in ranks] == [2, 2]
    assert sorted(ranks[0]["rank_indices"] + ranks[1]["rank_indices"]) == list(range(16))

    x, y, h = global_batch()
    for name, loss_fn in make_losses().items():
        model = make_model()
        kwargs = {"histograms": h} if name == "xml" else {}
        loss = loss_fn(model(x), y, **kwargs)
        loss.backward()
        want_grad = [p.grad for p in model.parameters()]
        for r in ranks:
            assert r[name]["loss"] == pytest.approx(loss.item(), rel=1e-5, abs=1e-6), name
            for got, want in zip(r[name]["grad"], want_grad):
                assert torch.allclose(torch.tensor(got), want, rtol=1e-4, atol=1e-6), name


@pytest.mark.slow
def test_runner_under_torchrun_logs_the_one_process_losses(one_process, single_node_torchrun):
    """The same CLI command under torchrun (2 gloo processes) trains on the same global batches: equal loss
    rows."""
    (_, one), (_, two) = one_process, single_node_torchrun
    from pml_extensions.runner.experiment.checkpoint import Checkpointer

    rows = [Checkpointer(str(w / "cfg" / "fold_0")).rows("loss_histories") for w in (one, two)]
    assert [r["~iteration~"] for r in rows[0]] == [r["~iteration~"] for r in rows[1]] == [1, 2, 3, 4]
    for a, b in zip(*rows):
        assert b["total_loss"] == pytest.approx(a["total_loss"], rel=1e-4, abs=1e-6)


@pytest.mark.slow
def test_job_runs_under_torchrun(tmp_path, subprocess_env):
    """``python -m pml_extensions job`` (paired protocol, HistogramPooling + XMLWrapper) under torchrun (2 gloo
    processes): it finishes, rank 0 logs every iteration once, and the losses are close to one process's on the same
    global batches — close, not equal: ConvNetBody's BatchNorm normalises each process's half batch."""
    import shutil
    import sqlite3

    import yaml

    # the shipped config with the eval transform for training too: random augmentations are drawn per process, so
    # only deterministic transforms give both runs the same images; 16-pixel glyphs (not 32) make it 4x cheaper
    cfg = str(tmp_path / "cfg")
    shutil.copytree(os.path.join(REPO, "pml_extensions", "configs", "xml_glyphs"), cfg)
    tf_path, data_path = os.path.join(cfg, "config_transforms.yaml"), os.path.join(cfg, "config_dataset.yaml")
    tf, data = yaml.safe_load(open(tf_path)), yaml.safe_load(open(data_path))
    resize = next(t for t in tf["transforms"]["eval"]["Compose"]["transforms"] if "Resize" in t)
    resize["Resize"]["size"], data["dataset"]["kwargs"]["image_size"] = [16, 16], 16
    tf["transforms"]["train"] = tf["transforms"]["eval"]
    yaml.safe_dump(tf, open(tf_path, "w"))
    yaml.safe_dump(data, open(data_path, "w"))
    env = subprocess_env
    args = [
        "-m",
        "pml_extensions",
        "job",
        cfg,
        "--num_epochs",
        "1",
        "--iterations_per_epoch",
        "4",
        "--seeds",
        "0",
        "--variants",
        "contrastive_xml",
        "--device",
        "cpu",
    ]
    # the one-process reference in this process (``python -m pml_extensions`` is cli.main); torchrun starts the two
    from pml_extensions.cli import main

    assert main(args[2:] + ["--root_experiment_folder", str(tmp_path / "one")]) == 0
    two = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
        + args[1:]
        + ["--root_experiment_folder", str(tmp_path / "two")],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert two.returncode == 0, two.stdout[-3000:] + two.stderr[-3000:]

    def losses(folder):
        db = os.path.join(folder, "xml_glyphs", "contrastive_xml", "seed_0", "logs", "logs.db")
        con = sqlite3.connect(db)
        try:
            return con.execute("SELECT [~iteration~], total_loss FROM loss_histories ORDER BY id").fetchall()
        finally:
            con.close()

    a, b = losses(str(tmp_path / "one")), losses(str(tmp_path / "two"))
    assert [r[0] for r in a] == [r[0] for r in b] == [1, 2, 3, 4]  # rank 0 logs once per iteration
    assert [r[1] for r in b] == pytest.approx([r[1] for r in a], rel=0.1)
    results = json.load(open(os.path.join(str(tmp_path / "two"), "xml_glyphs", "results.json")))
    assert 0 < results["variants"]["contrastive_xml"]["mean"]["mean_average_precision_at_r"] <= 1


def _free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_runner_on_two_nodes_with_a_c10d_rendezvous_equals_one_process(tmp_path, one_process, subprocess_env):
    """Beyond one machine: two ``torchrun --nnodes 2 --node_rank i`` launches (one gloo process each) meet at a c10d
    rendezvous on 127.0.0.1, as two machines sharing the experiment folder would, and train on the one-process
    global batches: equal loss rows and equal validation metrics (issue 22, item 5)."""
    (root, one), env = one_process, subprocess_env
    script, args = SCRIPT, [root, *TINY_MLRC]
    rendezvous = [
        "--nnodes",
        "2",
        "--nproc_per_node",
        "1",
        "--rdzv_backend",
        "c10d",
        "--rdzv_endpoint",
        f"127.0.0.1:{_free_port()}",
        "--rdzv_id",
        "two-nodes",
        "--local_addr",
        "127.0.0.1",
        "--max_restarts",
        "0",
    ]
    nodes = [
        subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--node_rank", str(i)]
            + rendezvous
            + [script]
            + args
            + ["--root_experiment_folder", str(tmp_path / "two")],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in (0, 1)
    ]
    try:
        outs = [node.communicate(timeout=300)[0] for node in nodes]
    finally:
        for node in nodes:
            if node.poll() is None:
                node.kill()
    assert [node.returncode for node in nodes] == [0, 0], "\n".join(out[-3000:] for out in outs)
    # one group of two: only its rank 0 (either launch, c10d assigns the ranks) logs the epochs and the results
    assert sorted("fold 0 epoch 1: val" in out for out in outs) == [False, True]
    assert sorted("results: " in out for out in outs) == [False, True]
    from pml_extensions.runner.experiment.checkpoint import Checkpointer

    rows = [Checkpointer(str(w / "cfg" / "fold_0")).rows("loss_histories") for w in (one, tmp_path / "two")]
    assert [r["~iteration~"] for r in rows[0]] == [r["~iteration~"] for r in rows[1]] == [1, 2, 3, 4]
    for a, b in zip(*rows):
        assert b["total_loss"] == pytest.approx(a["total_loss"], rel=1e-4, abs=1e-6)
    results = [json.load(open(w / "cfg" / "results.json")) for w in (one, tmp_path / "two")]
    assert results[1]["aggregate"] == pytest.approx(results[0]["aggregate"], rel=1e-4, abs=1e-6)
