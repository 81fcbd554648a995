"""The ``template_block`` protocol (a runner plugin): the template-matching block against its controls, paired over
seeds."""

from .protocol import PROTOCOL, TemplateBlock, load_models

__all__ = ["PROTOCOL", "TemplateBlock", "load_models"]
