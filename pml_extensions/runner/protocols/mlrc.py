"""The MLRC protocol (transitional: being moved out of ``runner/mlrc.py``)."""

from typing import Any, Callable, Dict, Optional


def run(
    config: Dict[str, Any],
    experiment_folder: str,
    sources: Optional[Dict[str, str]] = None,
    log: Callable[..., None] = print,
) -> Dict[str, Any]:
    from ..mlrc import MLRCRunner

    return MLRCRunner(config, experiment_folder, sources, log).run()
