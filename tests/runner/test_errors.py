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


def test_the_data_files_lines_keep_their_kind_through_nested_passes():
    """A bad image file found inside an inner pass stays known as a data-file problem in the outer one (what a config
    refusal adds of a preflight), and a config problem does not."""
    from pml_extensions.runner.errors import ConfigProblems, DataFileError, Problems

    inner = Problems()
    with inner.check():
        raise DataFileError("dataset: 2 of 9 images do not decode: a.jpg (truncated); b.jpg (missing)")
    with inner.check():
        raise ConfigError("a.yaml: batch_size: 64 exceeds 4 classes × m")
    outer = Problems()
    with outer.check():
        inner.raise_any()
    with outer.check():
        raise ConfigError("a.yaml: tester: unknown class 'X'")
    assert outer.data_files == ["dataset: 2 of 9 images do not decode: a.jpg (truncated); b.jpg (missing)"]
    assert len(outer.found) == 3 and issubclass(DataFileError, ConfigError)
    with pytest.raises(ConfigProblems) as e:
        outer.raise_any()
    assert e.value.data_files == outer.data_files


def test_problems_are_reported_together_numbered():
    from pml_extensions.runner.errors import Problems

    problems = Problems()
    with problems.check():
        raise ConfigError("a.yaml: x: expected an integer, got 'y'")
    with problems.check():
        pass
    with problems.check():
        raise ConfigError("dataset: 2 of 9 images do not decode")
    with pytest.raises(ConfigError) as e:
        problems.raise_any()
    assert str(e.value) == (
        "2 problems, nothing was run:\n  1. a.yaml: x: expected an integer, got 'y'\n"
        "  2. dataset: 2 of 9 images do not decode"
    )


def test_an_output_error_names_the_path_and_the_fix():
    from pml_extensions.runner.errors import Interrupted, OutputError

    assert str(OutputError.writing("runs/x", PermissionError(13, "Permission denied"))) == (
        "runs/x: cannot write (Permission denied); choose a writable --root_experiment_folder or fix its permissions, "
        "then rerun"
    )
    assert issubclass(OutputError, (ConfigError, OSError)) and issubclass(Interrupted, KeyboardInterrupt)
