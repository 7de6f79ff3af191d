"""The farm's GPT engine: segments join and leave a running batch at every step.

The engine process's pipeline (worker.engine_process.pipeline) adds segments and steps it.
``segment`` is one request's piece of text as the engine runs it; ``scheduler`` and ``blocks``
(torch-free, as ``segment`` is at import) decide which segments hold the slots and the KV cache's
blocks; ``runner`` owns the paged KV cache, the per-slot state and the CUDA graphs, with
``attention`` and ``layers`` its kernels, and ``sampler`` the per-row sampling; ``engine`` ties them
into ``add`` / ``step``; ``sizing`` says how many slots and blocks it has. The vocoder, which turns
what the engine drew into audio, has a room of its own (worker.vocoder). The engine imports neither
Celery nor Redis nor threads.
"""
