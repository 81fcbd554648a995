"""The search's results.md and report page from search.json: one set of blocks (search_blocks)."""

from pml_extensions.runner.outputs.search_summary import search_blocks, untrained_note
from pml_extensions.runner.outputs.tables import Table, to_html, to_markdown


def _summary(**changes):
    best = {"number": 0, "value": 0.1456, "params": {"lr": 0.01, "loss": "a"}, "folder": "trial_0",
            "untrained_folds": [0, 1], "num_folds": 2, "untrained": True}  # fmt: skip
    summary = {
        "n_trials": 2,
        "bayes_opt_iters": 2,
        "best": best,
        "trials": [best, dict(best, number=1, value=0.1, params={"lr": 0.1, "loss": "b"}, untrained_folds=[0])],
        "failed_trials": [2],
        "failures": [{"number": 2, "reason": "its worker stopped"}],
        "stopped": {"message": "search stopped: 3 trials in a row failed"},
    }
    summary.update(changes)
    return summary


def test_markdown_of_a_search():
    md = to_markdown(search_blocks(_summary()))
    assert md == (
        "Optuna study (2 COMPLETE trials of bayes_opt_iters=2, maximising the aggregated validation metric); best: "
        f"trial 0.\n\nFLAG: {untrained_note(_summary()['best'])}.\n\nsearch stopped: 3 trials in a row failed.\n\n"
        "| trial | objective | folds at epoch 0 | lr | loss |\n|---|---|---|---|---|\n"
        "| 0 (best) | 0.1456 | 2/2 | 0.01 | a |\n| 1 | 0.1000 | 1/2 | 0.1 | b |\n\n"
        "Failed trials:\n- trial 2: its worker stopped\n"
    )
    assert to_markdown(search_blocks(_summary(best=None, trials=[], failures=[], stopped=None))) == (
        "Optuna study (2 COMPLETE trials of bayes_opt_iters=2, maximising the aggregated validation metric); no trial "
        "completed.\n"
    )


def test_the_best_trials_test_metrics_come_first_and_numbers_align_right():
    best = dict(_summary()["best"], test={"separate_128D": {"P@1": 0.5, "MAP@R": 0.25}, "per_model": [1]})
    blocks = search_blocks(_summary(best=best))
    tables = [b for b in blocks if isinstance(b, Table)]
    assert tables[0].caption == "Test metrics of the best trial (trial 0):"
    assert tables[0].columns == ["embedding", "MAP@R", "P@1"] and tables[0].rows == [
        ["separate_128D", "0.2500", "0.5000"]
    ]
    assert tables[1].numeric == [False, True, False, True, False]  # lr is a number, loss a choice
    page = to_html(blocks)
    assert page.index("Test metrics of the best trial") < page.index("<th>trial</th>")
    assert (
        "<tr><td>0 (best)</td><td class='num'>0.1456</td><td>2/2</td><td class='num'>0.01</td><td>a</td></tr>" in page
    )
