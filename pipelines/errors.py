"""Errors the library raises and the training app raises too: one class each, so a hold
(``pipelines.holds``) recognizes it wherever it was raised.

Imports nothing; every module of ``pipelines`` may import it (``pipelines.app.config``
re-exports ``ConfigError`` for its schemas).
"""


class ConfigError(ValueError):
    """A configuration value that cannot work; the message names its key."""
