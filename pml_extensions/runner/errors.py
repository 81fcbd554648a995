"""The runner's exceptions: :class:`ConfigError`, and :class:`MissingDataError` for data a config names but the
machine lacks.

Every problem the runner reports to a user is a ``ConfigError`` whose message is one line that starts with the file
(or ``command line``) and names the key, e.g. ``configs/x/config_models/default.yaml: models.trunk: unknown class
'bninception'``. The command line prints it and exits with status 2; it is a ``ValueError``, so library callers may
catch either.

Example::

    >>> from pml_extensions.runner.errors import ConfigError, MissingDataError
    >>> issubclass(ConfigError, ValueError), issubclass(MissingDataError, (ConfigError, FileNotFoundError))
    (True, True)
"""


class ConfigError(ValueError):
    """A config problem; the one-line message names the file (when known) and the key."""


class MissingDataError(ConfigError, FileNotFoundError):
    """A config names data (a dataset folder, a Debian package's images, model weights) that is not on this machine;
    the one-line message says how to get it. Also a ``FileNotFoundError``, as the dataset classes raise."""
