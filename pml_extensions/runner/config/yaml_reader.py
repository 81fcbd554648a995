"""The one YAML reader of configs (files, command-line values, a run's ``config.yaml``): PyYAML's ``safe_load`` with
YAML 1.2's floats (in PyYAML's YAML 1.1, ``1e-3`` is a string).

Example::

    >>> read_yaml("{lr: 1e-3, eps: 1E-5, a: .5, b: 5., n: 10, s: 1e-3x, v: '1e-3'}")
    {'lr': 0.001, 'eps': 1e-05, 'a': 0.5, 'b': 5.0, 'n': 10, 's': '1e-3x', 'v': '1e-3'}
    >>> read_yaml("lr~LOG_BAYESIAN~: [1e-5, 1e-2]")
    {'lr~LOG_BAYESIAN~': [1e-05, 0.01]}
"""

import re
from typing import Any

import yaml

FLOAT_TAG = "tag:yaml.org,2002:float"
#: YAML 1.2 core schema floats (a dot or an exponent: integers stay integers), infinities and NaN; PyYAML's ``_``
#: digit separators are kept
YAML_12_FLOAT = re.compile(
    r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?\.[0-9][0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""",
    re.X,
)


class ConfigLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` whose implicit float rule is YAML 1.2's (:data:`YAML_12_FLOAT`)."""


ConfigLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != FLOAT_TAG]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
ConfigLoader.add_implicit_resolver(FLOAT_TAG, YAML_12_FLOAT, list("-+0123456789."))


def read_yaml(stream: Any) -> Any:
    """``yaml.safe_load(stream)`` with YAML 1.2 floats (a string or an open file)."""
    return yaml.load(stream, Loader=ConfigLoader)
