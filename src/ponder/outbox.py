"""Moved to :mod:`ponder.store.deliveries` (the store adds a task's deliveries itself);
importable from here until the last importer has moved."""

from __future__ import annotations

from ponder.store.deliveries import *  # noqa: F403
from ponder.store.deliveries import __all__ as __all__
