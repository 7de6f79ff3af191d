"""The inference engine: fixed-shape GPT decode state that a CUDA graph can replay, and the windowed vocoder."""
