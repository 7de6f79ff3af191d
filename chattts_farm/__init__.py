"""What every part of the farm shares, and all an outside service needs: the task contract, the
settings, Redis key names and the Celery client. Torch-free, Flask-free, and imports nothing else of
the project: ``web``, ``worker`` and ``cli`` depend on it, never the other way round."""
