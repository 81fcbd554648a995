"""runner/errors.py: one exception, one line naming the file and the key; missing data is also a FileNotFoundError."""

import pytest

from pml_extensions.runner.errors import ConfigError, MissingDataError
from pml_extensions.runner.objects.builder import Builder


def test_the_hierarchy():
    assert issubclass(ConfigError, ValueError)
    assert issubclass(MissingDataError, ConfigError) and issubclass(MissingDataError, FileNotFoundError)


def test_missing_data_names_the_file_the_key_and_the_fix():
    builder = Builder({"dataset": {"name": "cub", "root": "/nonexistent"}}, {"dataset": "config_dataset.yaml"})
    with pytest.raises(MissingDataError) as e:
        builder.build_dataset("train")
    message = str(e.value)
    assert message.startswith("config_dataset.yaml: dataset.get_dataset: dataset 'cub' needs root=")
    assert "\n" not in message


def test_the_command_line_prints_one_line_and_exits_2(tmp_path, capsys):
    from pml_extensions.cli import run

    assert run.main(["contrastive", "--root_experiment_folder", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("config error: ") and err.count("\n") == 1


def test_a_problem_two_checks_find_is_listed_once():
    from pml_extensions.runner.errors import ConfigProblems, Problems

    problems = Problems()
    for error in (
        ConfigError("a.yaml: tester: unknown class 'X'"),
        ConfigProblems(["a.yaml: tester: unknown class 'X'", "a.yaml: seeds: expected a list"]),
        ConfigError("a.yaml: seeds: expected a list"),
    ):
        with problems.check():
            raise error
    assert problems.found == ["a.yaml: tester: unknown class 'X'", "a.yaml: seeds: expected a list"]
