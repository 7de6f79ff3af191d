"""The GPT's inference engine: fixed-shape decode state that a CUDA graph can replay."""
