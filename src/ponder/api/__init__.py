"""The HTTP API (FastAPI). It never touches the model: it validates, admits, stores."""

from ponder.api.app import create_app

__all__ = ["create_app"]
