"""``python -m ponder.cli``."""

from ponder.cli import main

main()
