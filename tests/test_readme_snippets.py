"""Every ```python block of the README runs as written (in a fresh namespace, CPU), the runner commands run as written
in tests/docs/test_commands.py (with the docs pages' commands, each distinct one once), its other shell commands are
ones a test runs where they come from (docs/own_data.md's worked example), and every link of the README leads to a
file, and to a heading of that file when it names one."""

import os
import re

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
    section = README[README.index("## The runner in five commands") :]
    block = re.search(r"```bash\n(.*?)```", section, flags=re.S).group(1)
    return [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]


def test_install_line_pins_torch():
    assert "pip install torch==2.14.1 torchvision==0.29.1 ." in README


def _inline_commands():
    """The commands the README's prose gives in backticks (the main job's options, a benchmark config), whitespace
    folded."""
    spans = [" ".join(c.split()) for c in re.findall(r"`([^`]+)`", re.sub(r"```.*?```", "", README, flags=re.S))]
    return [c for c in spans if c.startswith(("python -m pml_extensions ", "tox -e job -- "))]


def test_every_runner_command_of_the_readme_runs_in_the_docs_commands_test():
    """The runner section's commands and the prose's run as written in tests/docs/test_commands.py (each distinct
    command of the README and the docs once, the training ones with ``--dry-run``: merged and checked, nothing
    trained or written; ``tox -e job -- ARGS`` is ``python -m pml_extensions job ARGS``), which also checks what
    their output holds (the ``--list`` names, the merged classes, the nested-marker example's one calculator)."""
    from tests.docs import test_commands

    inline = _inline_commands()
    assert "tox -e job -- --dataset openclipart" in inline
    assert "python -m pml_extensions run benchmarks/configs/template_block_table1 --variant quick" in inline
    section = _runner_commands()
    assert section[0] == "python -m pml_extensions run contrastive_xml --variant quick"
    assert sum("--list" in c for c in section) == 2 and sum(c.endswith("--dry-run") for c in section) == 2
    checked = {(page, command) for _, shown in test_commands.RUNS for page, command in shown}
    for command in section + inline:
        assert (test_commands.README, " ".join(command.split())) in checked, command
    assert all(any(part in c for c in section) for part in test_commands.OUTPUT)


def test_distillation_snippet_distils_two_images_at_two_sizes():
    code = next(b for b in PYTHON_BLOCKS if "ResolutionDistillationLoss" in b)
    namespace = {}
    exec(code, namespace)
    import torch

    assert namespace["small"].shape == (8, 3, 24, 24) and namespace["large"].shape == (8, 3, 48, 48)
    assert namespace["image_ids"].tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert torch.isfinite(namespace["loss"]) and namespace["loss"].item() > 0
    # the student got gradients, the frozen teacher none
    assert any(p.grad is not None for p in namespace["student"].parameters())
    assert all(p.grad is None for p in namespace["teacher"].parameters())


def _bash_blocks(text):
    return re.findall(r"```bash\n(.*?)```", text, flags=re.S)


def _commands(block):
    return [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]


def test_runner_section_has_five_commands_and_the_runner_page_has_them_all():
    """The README keeps five; docs/runner.md keeps the whole list (torchrun, --reproduce, the search, ...)."""
    assert len(_runner_commands()) == 5
    page = open(os.path.join(ROOT, "docs", "runner.md"), encoding="utf-8").read()
    docs = _commands(re.search(r"```bash\n(.*?)```", page[page.index("## Commands") :], flags=re.S).group(1))
    assert [c for c in _runner_commands() if c not in docs] == []
    assert any(c.startswith("torchrun ") for c in docs) and any("--reproduce" in c for c in docs)
    # the search example tests/runner/config/test_yaml_reader.py parses
    assert any(c.endswith('--optimizers~APPLY~3 "{lr~LOG_BAYESIAN~: [1e-5, 1e-2]}"') for c in docs)


def test_every_other_shell_command_is_run_by_a_test_where_it_comes_from():
    """Besides the two commands (CI runs them) and the runner section (above), the README's shell lines are commands
    of docs/own_data.md's worked example, which tests/test_docs_own_data.py runs end to end."""
    blocks = _bash_blocks(README)
    two, runner = blocks[0], _bash_blocks(README[README.index("## The runner in five commands") :])[0]
    assert _commands(two) == [
        'python3 -m pip install "tox>=4,<5" && python3 -m tox -e job',
        'python3 -m pip install "tox>=4,<5" && python3 -m tox',
    ]
    page = open(os.path.join(ROOT, "docs", "own_data.md"), encoding="utf-8").read()
    worked = _commands(_bash_blocks(page[page.index("### Worked example") :])[0])
    others = [c for b in blocks if b not in (two, runner) for c in _commands(b)]
    assert others and [c for c in others if c not in worked] == []
    assert any(c.startswith("python -m pml_extensions explain ") for c in others)


def _slug(heading):
    """The anchor GitHub and mkdocs' toc give a heading (lower case, punctuation dropped, spaces to hyphens)."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def test_every_link_leads_somewhere():
    links = re.findall(r"\]\(([^)\s]+)\)", README)
    local = [link for link in links if "://" not in link]
    assert len(local) >= 20
    for link in local:
        path, _, anchor = link.partition("#")
        target = os.path.join(ROOT, path)
        assert os.path.exists(target), link
        if anchor:
            with open(target, encoding="utf-8") as f:
                headings = re.findall(r"^#{1,6} (.+)$", re.sub(r"```.*?```", "", f.read(), flags=re.S), flags=re.M)
            assert anchor in {_slug(h) for h in headings}, link


def test_the_three_questions_are_one_click_away():
    """Issue 23: "use XML on my model", "run a PB config" and "explain a retrieval" are each one link of the README."""
    top = README[: README.index("## Install")]
    for words, link in (
        ("use XML on my model", "docs/methods/xml.md#xml-in-two-lines"),
        ("run a PB config", "docs/runner.md#commands"),
        ("explain a retrieval", "docs/explain.md"),
    ):
        assert f"[{words}]({link})" in top
