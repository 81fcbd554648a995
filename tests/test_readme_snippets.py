"""Every ```python block of the README runs as written (in a fresh namespace, CPU), and the runner section's
cheap commands run as written (the training command with --dry-run, which merges and prints the config)."""

import os
import re
import shlex
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
PYTHON_BLOCKS = re.findall(r"```python\n(.*?)```", README, flags=re.S)


def test_readme_has_python_blocks():
    assert len(PYTHON_BLOCKS) >= 3


@pytest.mark.parametrize("index", range(len(PYTHON_BLOCKS)))
def test_python_block_runs_as_written(index):
    code = PYTHON_BLOCKS[index]
    namespace = {"__name__": "__readme__"}
    exec(compile(code, f"README.md python block {index}", "exec"), namespace)


def test_template_block_snippet_outputs_the_trunk_width_not_imagenet_logits():
    code = next(b for b in PYTHON_BLOCKS if "insert_template_matching" in b)
    namespace = {}
    exec(code, namespace)
    import torch

    assert namespace["trunk"](torch.zeros(1, 3, 64, 64)).shape[1] == 512


def _runner_commands():
    section = README[README.index("## One runner, three protocols") :]
    block = re.search(r"```bash\n(.*?)```", section, flags=re.S).group(1)
    return [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]


def _run(command):
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    argv = shlex.split(command)
    assert argv[:3] == ["python", "-m", "pml_extensions"]
    return subprocess.run([sys.executable] + argv[1:], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_install_line_pins_torch():
    assert "pip install torch==2.14.1 torchvision==0.29.1 ." in README


def test_runner_section_list_commands_run_as_written():
    commands = [c for c in _runner_commands() if "--list" in c]
    assert len(commands) == 2
    out = _run(commands[0])
    assert out.returncode == 0 and "XMLWrapper" in out.stdout, out.stderr
    out = _run(commands[1])
    assert out.returncode == 0, out.stderr
    for name in ("mlrc", "xml_vs_gap", "resolution_distillation"):
        assert name in out.stdout


def test_runner_section_first_command_merges(tmp_path):
    command = _runner_commands()[0]
    assert command == "python -m pml_extensions run contrastive_xml --variant quick"
    out = _run(command + f" --dry-run --root_experiment_folder {tmp_path}")
    assert out.returncode == 0, out.stderr
    assert "GlyphDataset" in out.stdout and "XMLWrapper" in out.stdout
    assert not os.listdir(tmp_path)  # nothing trained, nothing written


def test_runner_section_dry_run_commands_run_as_written():
    commands = [c for c in _runner_commands() if c.endswith("--dry-run")]
    assert len(commands) == 2
    outputs = []
    for command in commands:
        out = _run(command)
        assert out.returncode == 0, out.stderr
        outputs.append(out.stdout)
    # the nested-marker example: ~OVERRIDE~ inside ~APPLY~ leaves only the chunked calculator
    assert "ChunkedAccuracyCalculator" in outputs[1] and "  AccuracyCalculator:" not in outputs[1]
