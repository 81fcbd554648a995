"""runner/protocols/paired_protocol.py: the grid's announcements (how long the rest will take)."""

import dataclasses
import types

from pml_extensions.runner.protocols import paired_protocol
from pml_extensions.runner.protocols.base import setting
from pml_extensions.runner.protocols.paired_protocol import GridSettings, PairedProtocol


@dataclasses.dataclass
class _Settings(GridSettings):
    gain: float = setting(0.0, "what the unit adds", kind="float")


def test_the_estimate_is_given_again_when_the_first_unit_included_one_time_work(tmp_path, monkeypatch):
    """The first unit of a cached run built the feature cache (693 s) and the estimate said 335 min for 29 units that
    took minutes each; the second unit's time now corrects it when the two differ by more than 2x."""
    clock = {"now": 0.0}
    monkeypatch.setattr(paired_protocol, "time", types.SimpleNamespace(time=lambda: clock["now"]))
    durations = iter([100.0, 10.0, 10.0, 10.0])

    class Toy(PairedProtocol):
        name, Settings, metrics = "toy", _Settings, ("score",)

        def unit(self, settings, variant, seed, folder, builder):
            clock["now"] += next(durations)
            return {"history": [{"epoch": 0, "score": settings.gain}], "best_epoch": 0, "train_seconds": 0.0}

        def test(self, settings, variant, seed, folder, builder, epoch):
            return {"score": settings.gain}

    logs = []
    config = {"seeds": [0, 1], "variants": {"a": {}, "b": {"gain": 0.05}}, "comparisons": [["b", "a"]]}
    Toy(dict(config, device="cpu"), str(tmp_path), log=logs.append).run_units()
    assert [line for line in logs if "took" in line] == [
        "toy: one unit took 100 s; about 5.0 min for the 3 left",
        "toy: the next unit took 10 s (the first included one-time work); about 0.3 min for the 2 left",
    ]
