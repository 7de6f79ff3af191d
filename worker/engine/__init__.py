"""The farm's GPT engine: segments join and leave a running batch at every step.

``segment`` is one request's piece of text as the engine runs it; ``scheduler`` (torch-free) decides
which segments hold the slots; ``runner`` owns the KV cache, the per-slot state and the CUDA graphs;
``engine`` ties them into ``add`` / ``step``; ``vocoder`` turns finished segments of any lengths into
audio together, in fixed windows. The engine imports neither Celery nor Redis nor threads.
"""
