"""Configs, the main job and the powerful-benchmarker-style runner (MLRC protocol, resume, torchrun)."""

from .checkpoint import Checkpointer
from .config_loader import CONFIG_FOLDERS, load_config, merge, parse_command_line
from .distributed import DistributedBatchSliceSampler
from .factory import ConfigError, build, resolve
from .mlp import MLP
from .protocols.mlrc import MLRCRunner, ensemble_metrics, mlrc_class_splits
from .registry import ROLES, classes_for_role, find, register
from .report import write_report

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
