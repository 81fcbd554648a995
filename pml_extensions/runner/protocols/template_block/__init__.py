"""The ``template_block`` protocol: the template-matching block against its controls, paired over seeds."""

from .protocol import CONFIG_KEYS, load_models, prepare, run, run_units

__all__ = ["CONFIG_KEYS", "load_models", "prepare", "run", "run_units"]
