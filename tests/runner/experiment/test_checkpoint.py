import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from pml_extensions.runner.experiment.checkpoint import (
    Checkpointer,
    load_weights,
    rng_state,
    set_rng_state,
)
from pml_extensions.utils.atomic_io import atomic_torch_save
from tests.runner.runner_testing_utils import RUNNER_TESTS, write_tiny_config


class TestAtomicFiles:
    def test_save_load_weights_only(self, tmp_path):
        path = str(tmp_path / "c.pth")
        atomic_torch_save({"w": torch.arange(3.0), "epoch": 2, "rng": rng_state()}, path)
        state = load_weights(path)
        assert torch.equal(state["w"], torch.arange(3.0)) and state["epoch"] == 2
        assert [p.name for p in tmp_path.iterdir()] == ["c.pth"]  # no tmp file left

    def test_object_is_refused_by_weights_only(self, tmp_path):
        path = str(tmp_path / "bad.pth")
        torch.save({"obj": Checkpointer}, path)
        with pytest.raises(Exception):
            load_weights(path)

    def test_rng_state_roundtrip(self):
        import random

        import numpy as np

        state = rng_state()
        a = (torch.rand(2), np.random.rand(2), random.random())
        set_rng_state(state)
        b = (torch.rand(2), np.random.rand(2), random.random())
        assert torch.equal(a[0], b[0]) and (a[1] == b[1]).all() and a[2] == b[2]


class TestCommitResume:
    def test_rows_after_checkpoint_are_dropped(self, tmp_path):
        ck = Checkpointer(str(tmp_path), epoch_tables={"accuracies_val"})
        for it in (1, 2):
            ck.record_keeper.append_data("loss_histories", "total_loss", float(it), it)
        ck.record_keeper.append_data("accuracies_val", "map", 0.5, 1)
        ck.commit({"epoch": 1, "global_iteration": 2})
        # epoch 2 reaches the logs but the process dies before its checkpoint
        for it in (3, 4):
            ck.record_keeper.append_data("loss_histories", "total_loss", float(it), it)
        ck.record_keeper.append_data("accuracies_val", "map", 0.6, 2)
        ck.writer.save_records()
        assert [r["~iteration~"] for r in ck.rows("loss_histories")] == [1, 2, 3, 4]

        ck2 = Checkpointer(str(tmp_path), epoch_tables={"accuracies_val"})
        state = ck2.resume()
        assert state["epoch"] == 1
        assert [r["~iteration~"] for r in ck2.rows("loss_histories")] == [1, 2]
        assert [r["~iteration~"] for r in ck2.rows("accuracies_val")] == [1]
        with open(tmp_path / "logs" / "loss_histories.csv") as f:
            assert f.read().splitlines() == ["~iteration~,total_loss", "1,1.0", "2,2.0"]

    def test_no_checkpoint_drops_everything(self, tmp_path):
        ck = Checkpointer(str(tmp_path))
        ck.record_keeper.append_data("loss_histories", "total_loss", 1.0, 1)
        ck.writer.save_records()
        assert Checkpointer(str(tmp_path)).resume() is None
        assert Checkpointer(str(tmp_path)).rows("loss_histories") == []

    def test_commit_needs_epoch(self, tmp_path):
        with pytest.raises(ValueError, match="epoch"):
            Checkpointer(str(tmp_path)).commit({"global_iteration": 1})


def _run(args, env, **kw):
    return subprocess.Popen(
        [sys.executable, os.path.join(RUNNER_TESTS, "runner_testing_utils.py")] + args,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        **kw,
    )


def _rows(folder, table):
    return Checkpointer(folder).rows(table)


@pytest.mark.slow
def test_sigkill_mid_epoch_then_rerun_loses_and_duplicates_nothing(tmp_path, subprocess_env, capsys):
    """Kill the CLI with SIGKILL inside epoch 2, rerun the same command: the logs equal an uninterrupted
    run's."""
    progress = str(tmp_path / "progress.txt")
    root = write_tiny_config(
        str(tmp_path / "cfg"),
        {
            "config_dataset/default.yaml": f"""
dataset:
  TinyVectors: {{num_classes: 16, per_class: 8, sleep: 0.004, progress_file: {progress}}}
num_training_sets: 1
""",
            "config_general/default.yaml": """
trainer:
  MetricLossOnly:
    iterations_per_epoch: 6
    dataloader_num_workers: 0
    batch_size: 8
    set_min_label_to_zero: True
num_epochs_train: 3
save_interval: 1
patience: 10
seed: 0
device: cpu
""",
        },
    )
    command = [root, "--root_experiment_folder", str(tmp_path / "exp"), "--experiment_name", "killed"]
    fold = str(tmp_path / "exp" / "killed" / "fold_0")
    proc = _run(command, subprocess_env)
    try:
        deadline = time.time() + 120
        start_size = None
        while time.time() < deadline and proc.poll() is None:
            ckpt = os.path.join(fold, "checkpoint.pth")
            if start_size is None and os.path.exists(ckpt) and load_weights(ckpt)["epoch"] >= 1:
                start_size = os.path.getsize(progress)
            if start_size is not None and os.path.getsize(progress) - start_size >= 24:  # 3 of 6 batches of epoch 2
                proc.send_signal(signal.SIGKILL)
                break
            time.sleep(0.005)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL, proc.stdout.read()
    assert load_weights(os.path.join(fold, "checkpoint.pth"))["epoch"] == 1  # killed inside epoch 2

    # the rerun and the uninterrupted run in this interpreter (no new interpreter's start-up), at the child's one
    # thread (subprocess_env: OMP_NUM_THREADS=1)
    from pml_extensions.cli.run import main
    from tests.runner.runner_testing_utils import register_tiny

    register_tiny()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        capsys.readouterr()
        assert main(command) == 0
        out = "".join(capsys.readouterr())
        assert "resuming after epoch 1" in out

        assert main([root, "--root_experiment_folder", str(tmp_path / "exp"), "--experiment_name", "clean"]) == 0
    finally:
        torch.set_num_threads(threads)
    clean_fold = str(tmp_path / "exp" / "clean" / "fold_0")

    for table in ("loss_histories", "accuracies_val"):
        got = [
            (r["~iteration~"], r.get("total_loss", r.get("mean_average_precision_at_r"))) for r in _rows(fold, table)
        ]
        want = [
            (r["~iteration~"], r.get("total_loss", r.get("mean_average_precision_at_r")))
            for r in _rows(clean_fold, table)
        ]
        its = [g[0] for g in got]
        assert its == sorted(set(its)), f"{table}: duplicated or unordered rows {its}"
        assert [w[0] for w in want] == its, f"{table}: lost rows"
        # RNG states are checkpointed, so the rerun epoch draws the same batches: the values match too.
        for (_, a), (_, b) in zip(got, want):
            assert a == pytest.approx(b, rel=1e-5, abs=1e-6)
    assert [r["~iteration~"] for r in _rows(fold, "loss_histories")] == list(range(1, 19))


# ---------------------------------------------------------------------------------------------------------------------
# Issue 21, item 5: a truncated checkpoint falls back to the one before it, or says which file to remove; a folder that
# cannot take the files is one line naming the path.
def _two_commits(folder):
    ckpt = Checkpointer(folder, epoch_tables={"accuracies_val"})
    for epoch in (1, 2):
        ckpt.record_keeper.update_records({"loss_histories": {"total_loss": float(epoch)}}, epoch)
        ckpt.commit({"epoch": epoch, "global_iteration": epoch, "w": torch.full((2,), float(epoch))})
    return ckpt


def _truncate(path, keep=100):
    with open(path, "rb") as f:
        head = f.read(keep)
    with open(path, "wb") as f:
        f.write(head)


def test_the_previous_checkpoint_is_kept_and_a_truncated_last_one_falls_back_to_it(tmp_path):
    folder = str(tmp_path / "fold_0")
    ckpt = _two_commits(folder)
    assert load_weights(ckpt.previous_path)["epoch"] == 1 and load_weights(ckpt.path)["epoch"] == 2
    _truncate(ckpt.path)
    notes = []
    again = Checkpointer(folder, epoch_tables={"accuracies_val"})
    state = again.load_state(log=notes.append)
    assert state["epoch"] == 1 and torch.equal(state["w"], torch.ones(2))
    assert len(notes) == 1 and notes[0].startswith(f"note: {ckpt.path} is unreadable (")
    assert notes[0].endswith(f"resuming from the checkpoint before it, {ckpt.previous_path} (epoch 1)")
    assert again.resume()["epoch"] == 1
    assert [r["~iteration~"] for r in again.rows("loss_histories")] == [1]  # epoch 2's row goes with its checkpoint
    assert os.path.exists(ckpt.path + ".damaged") and not os.path.exists(ckpt.path)
    again.commit({"epoch": 2, "global_iteration": 2, "w": torch.zeros(2)})  # the rerun's epoch 2
    assert load_weights(again.previous_path)["epoch"] == 1  # the good one stays the previous


def test_when_no_checkpoint_can_be_read_the_message_says_which_files_to_remove(tmp_path):
    from pml_extensions.runner.errors import OutputError

    folder = str(tmp_path / "fold_3")
    ckpt = _two_commits(folder)
    _truncate(ckpt.path)
    _truncate(ckpt.previous_path)
    with pytest.raises(OutputError) as e:
        Checkpointer(folder).resume()
    message = str(e.value)
    assert message.startswith(f"{ckpt.path} and {ckpt.previous_path}: truncated or corrupt (")
    assert message.endswith("remove them to start fold_3 again from its first epoch") and "\n" not in message


def test_a_truncated_model_file_names_itself(tmp_path):
    from pml_extensions.runner.errors import OutputError

    path = str(tmp_path / "fold_0" / "best.pth")
    os.makedirs(os.path.dirname(path))
    torch.save({"trunk": {"w": torch.ones(3)}}, path)
    _truncate(path, 50)
    with pytest.raises(OutputError, match=rf"^{path}: truncated or corrupt \(.*\); remove {os.path.dirname(path)} and"):
        load_weights(path)


def test_a_full_disk_during_a_commit_is_one_line_and_keeps_the_last_checkpoint(tmp_path, monkeypatch):
    import errno

    from pml_extensions.runner.errors import OutputError
    from pml_extensions.runner.experiment import checkpoint as checkpoint_module

    folder = str(tmp_path / "fold_0")
    ckpt = _two_commits(folder)

    def full(state, path):
        with open(path, "wb") as f:
            f.write(b"PK\x03\x04 half a checkpoint")
        raise OSError(errno.ENOSPC, "No space left on device", path)

    monkeypatch.setattr(checkpoint_module.torch, "save", full)
    with pytest.raises(OutputError) as e:
        ckpt.commit({"epoch": 3, "global_iteration": 3})
    assert str(e.value) == (
        f"{ckpt.path}: cannot write (No space left on device); the disk is full: free space, then rerun the same "
        "command to resume from the last checkpoint"
    )
    assert load_weights(ckpt.path)["epoch"] == 2


def _files_of(folder):
    return sorted(f for f in os.listdir(folder) if f != "logs")


@pytest.mark.parametrize("where", ["torch.save", "os.replace"])
def test_after_a_failed_save_the_backup_is_its_own_file(tmp_path, monkeypatch, where):
    """The previous checkpoint used to be linked to the last one before the new one was written: a failed save left
    ``checkpoint.prev.pth`` and ``checkpoint.pth`` one file on disk (one inode), so damage to one damaged both."""
    import errno

    from pml_extensions.runner.errors import OutputError
    from pml_extensions.runner.experiment import checkpoint as checkpoint_module

    folder = str(tmp_path / "fold_0")
    ckpt = _two_commits(folder)
    before = _files_of(folder)
    if where == "torch.save":  # the disk fills up halfway through the new checkpoint

        def fail(state, path):
            with open(path, "wb") as f:
                f.write(b"PK\x03\x04 half a checkpoint")
            raise OSError(errno.ENOSPC, "No space left on device", path)

        monkeypatch.setattr(checkpoint_module.torch, "save", fail)
    else:  # the complete new checkpoint cannot be moved onto checkpoint.pth
        real_replace = os.replace

        def fail(src, dst):
            if os.path.abspath(dst) == os.path.abspath(ckpt.path):
                raise OSError(errno.EIO, "Input/output error", dst)
            real_replace(src, dst)

        monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OutputError):
        ckpt.commit({"epoch": 3, "global_iteration": 3, "w": torch.full((2,), 3.0)})
    monkeypatch.undo()
    assert os.stat(ckpt.path).st_ino != os.stat(ckpt.previous_path).st_ino
    assert load_weights(ckpt.path)["epoch"] == 2 and load_weights(ckpt.previous_path)["epoch"] == 1
    assert torch.equal(load_weights(ckpt.previous_path)["w"], torch.full((2,), 1.0))
    assert _files_of(folder) == before  # no temporary file left behind
    # the next save succeeds: the last checkpoint becomes the backup, again its own file
    ckpt.commit({"epoch": 3, "global_iteration": 3, "w": torch.full((2,), 3.0)})
    assert os.stat(ckpt.path).st_ino != os.stat(ckpt.previous_path).st_ino
    assert load_weights(ckpt.path)["epoch"] == 3 and load_weights(ckpt.previous_path)["epoch"] == 2
    _truncate(ckpt.path)  # damage to the last checkpoint is not damage to its backup
    assert Checkpointer(folder).load_state(log=None)["epoch"] == 2
