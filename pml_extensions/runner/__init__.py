"""Configs, the main job and the powerful-benchmarker-style runner (MLRC protocol, resume, torchrun)."""

from .build.mlp import MLP
from .config.loader import CONFIG_FOLDERS, load_config, merge, parse_command_line
from .config.registry import ROLES, classes_for_role, find, register
from .errors import ConfigError, build, resolve
from .experiment.checkpoint import Checkpointer
from .experiment.distributed import DistributedBatchSliceSampler
from .outputs.report import write_report
from .protocols.mlrc.protocol import MLRCRunner, ensemble_metrics, mlrc_class_splits

__all__ = [
    "CONFIG_FOLDERS",
    "Checkpointer",
    "ConfigError",
    "DistributedBatchSliceSampler",
    "MLP",
    "MLRCRunner",
    "ROLES",
    "build",
    "classes_for_role",
    "ensemble_metrics",
    "find",
    "load_config",
    "merge",
    "mlrc_class_splits",
    "parse_command_line",
    "register",
    "resolve",
    "write_report",
]
