"""ponder: asynchronous LLM inference as tasks, with answers made better while you wait."""

__version__ = "0.1.0"

__all__ = ["__version__"]
