"""The engine process: one per GPU, below the channel from its Celery processes; it owns the model and the GPU.

``main`` loads and warms up the model, then serves the channel; the ``batcher``'s thread drives the
``pipeline``, which takes each request one way, calling its steps in turn: ``prepare`` (text to
segments, with ``segmenting``, ``text_normaliser`` and ``voices``), the engine (worker.engine),
``streaming`` (a streaming request's cuts), the vocoder (worker.vocoder), ``finish`` (the result).
``synthesis`` is the record of a request on that way.
"""
