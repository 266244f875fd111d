"""The installed distribution's version, in a module of its own: the package ``__init__``
imports the SDK, so a module below the SDK that needs the version imports it from here."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

__all__ = ["__version__"]

try:
    __version__ = version("ponder")
except PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"
