"""The entry points: the ``chattts-farm`` command (:mod:`cli.main`) and ``chattts-farm up``
(:mod:`cli.launcher`). They build and start things; everything they start lives in ``web`` and
``worker``."""
