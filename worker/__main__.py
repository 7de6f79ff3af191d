"""``python -m worker`` is ``chattts-farm``: for hosts where the console script is not installed."""

from worker.cli import main

main()
