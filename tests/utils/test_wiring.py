"""utils/wiring.py: the unit steps a method registers (its config keys' part in a training unit)."""

import pytest

from pml_extensions.utils import wiring


def test_a_unit_step_registers_once_in_order_and_an_unknown_step_is_refused(monkeypatch):
    monkeypatch.setitem(wiring._UNIT_STEPS, "check", [])
    first, second = (lambda b: 1), (lambda b: 2)
    assert wiring.unit_step("check")(first) is first
    wiring.unit_step("check")(second)
    wiring.unit_step("check")(first)  # a module imported twice registers once
    assert wiring.unit_steps("check") == [first, second]
    wiring.unit_steps("check").clear()  # a copy
    assert wiring.unit_steps("check") == [first, second]
    with pytest.raises(ValueError, match="step must be one of check, train_set, prepare, reference, describe"):
        wiring.unit_step("train")


def test_the_distillation_keys_register_every_step():
    import pml_extensions.trainers  # noqa: F401  (registers on import)
    from pml_extensions.trainers import distillation_keys

    for step in wiring.UNIT_STEPS:
        assert distillation_keys.__name__ in [fn.__module__ for fn in wiring.unit_steps(step)]


def test_a_key_problem_names_its_key_and_a_reference_gives_the_testers_arguments():
    problem = wiring.KeyProblem("trainer.X.option", "bad")
    assert isinstance(problem, ValueError) and problem.key == "trainer.X.option" and str(problem) == "bad"
    side = wiring.Reference("trunk", "embedder", {"test": "views"}, "the teacher's references")
    assert side.tester_kwargs() == {
        "reference_trunk_model": "trunk",
        "reference_embedder_model": "embedder",
        "reference_dataset_dict": {"test": "views"},
    }
