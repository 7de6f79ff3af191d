"""``python -m cli`` is ``chattts-farm``: for hosts where the console script is not installed."""

from cli.main import main

main()
