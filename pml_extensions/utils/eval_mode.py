"""Run modules in eval mode for a while and give every submodule back its own mode."""

import contextlib
from typing import Iterator

import torch


@contextlib.contextmanager
def eval_mode(*modules: torch.nn.Module) -> Iterator[None]:
    """Every module of ``modules`` (and each submodule) in eval mode within the block; afterwards, also after an
    exception, each submodule gets its own former ``training`` flag back (``module.train(was)`` would also flip a
    BatchNorm the user had frozen with ``bn.eval()``)."""
    flags = {}
    for module in modules:
        for m in module.modules():
            flags.setdefault(m, m.training)
    try:
        for module in modules:
            module.eval()
        yield
    finally:
        for m, training in flags.items():
            m.training = training
