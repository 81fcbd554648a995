"""runner/errors.py's signal handling and the command line around it (issue 21, item 5): SIGINT and SIGTERM end a run
with one line and exit 130 / 143, never in the middle of a checkpoint; the rerun resumes and loses nothing."""

import os
import signal
import subprocess
import sys
import time

import pytest

from pml_extensions.runner import errors as interrupts
from pml_extensions.runner.errors import Interrupted
from pml_extensions.runner.experiment.checkpoint import Checkpointer, load_weights
from tests.runner.runner_testing_utils import RUNNER_TESTS, write_tiny_config


def test_a_signal_inside_a_critical_section_is_raised_after_it():
    done = []
    with pytest.raises(Interrupted) as e:
        with interrupts.raise_on_signals():
            with interrupts.critical():
                os.kill(os.getpid(), signal.SIGINT)
                done.append("the section finished")
            done.append("never reached")
    assert done == ["the section finished"] and e.value.signal_number == signal.SIGINT
    assert isinstance(e.value, KeyboardInterrupt)


def test_outside_a_critical_section_it_is_raised_at_once_and_the_handlers_come_back():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Interrupted) as e:
        with interrupts.raise_on_signals():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)  # the handler runs between bytecodes: never reached
            pytest.fail("not interrupted")
    assert e.value.signal_number == signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is before


def test_the_position_an_interrupt_reports():
    with interrupts.raise_on_signals():
        assert interrupts.position() == "the start"
        interrupts.at("fold 1", 3)
        assert interrupts.position() == "fold 1, epoch 3"
        interrupts.at("[contrastive_xml seed 0]", 2)
        assert interrupts.position() == "contrastive_xml seed 0, epoch 2"


def test_a_commit_interrupted_inside_keeps_both_files(tmp_path, monkeypatch):
    """SIGTERM while the log rows are written: the checkpoint is still written, then the run stops."""
    import torch

    ckpt = Checkpointer(str(tmp_path))
    ckpt.record_keeper.update_records({"loss_histories": {"total_loss": 1.0}}, 1)
    real = ckpt.writer.save_records

    def save_and_get_signalled():
        os.kill(os.getpid(), signal.SIGTERM)
        real()

    monkeypatch.setattr(ckpt.writer, "save_records", save_and_get_signalled)
    with pytest.raises(Interrupted):
        with interrupts.raise_on_signals():
            ckpt.commit({"epoch": 1, "global_iteration": 1, "w": torch.ones(2)})
    assert load_weights(ckpt.path)["epoch"] == 1 and len(ckpt.rows("loss_histories")) == 1


def _start(args, env):
    return subprocess.Popen(
        [sys.executable, os.path.join(RUNNER_TESTS, "runner_testing_utils.py")] + args,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.slow
@pytest.mark.parametrize("signum, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_mid_epoch_ends_the_run_in_one_line_and_the_rerun_resumes(
    tmp_path, subprocess_env, capfd, signum, status
):
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
  MetricLossOnly: {iterations_per_epoch: 6, dataloader_num_workers: 0, batch_size: 8, set_min_label_to_zero: True}
num_epochs_train: 3
save_interval: 1
patience: 10
seed: 0
device: cpu
""",
        },
    )
    command = [root, "--root_experiment_folder", str(tmp_path / "exp")]
    fold = str(tmp_path / "exp" / "cfg" / "fold_0")
    proc = _start(command, subprocess_env)
    try:
        deadline, start_size = time.time() + 300, None
        while time.time() < deadline and proc.poll() is None:
            ckpt = os.path.join(fold, "checkpoint.pth")
            if start_size is None and os.path.exists(ckpt) and load_weights(ckpt)["epoch"] >= 1:
                start_size = os.path.getsize(progress)
            if start_size is not None and os.path.getsize(progress) - start_size >= 24:  # inside epoch 2
                proc.send_signal(signum)
                break
            time.sleep(0.005)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == status, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines[-1] == "interrupted at fold 0, epoch 2; rerun the same command to resume", err
    assert "Traceback" not in err
    assert load_weights(os.path.join(fold, "checkpoint.pth"))["epoch"] == 1  # epoch 2 was not committed

    # the rerun in this process (the script's register_tiny, then ``python -m pml_extensions run``'s cli.main):
    # nothing is signalled any more
    from pml_extensions.cli import main
    from tests.runner.runner_testing_utils import register_tiny

    register_tiny()
    capfd.readouterr()
    rerun_status = main(["run", *command])
    out, err = capfd.readouterr()
    assert rerun_status == 0, err
    assert "resuming after epoch 1" in out
    iterations = [r["~iteration~"] for r in Checkpointer(fold).rows("loss_histories")]
    assert iterations == list(range(1, 19))  # 3 epochs x 6 batches: none lost, none twice
