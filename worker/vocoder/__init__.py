"""The vocoder: GPT hidden states become 24 kHz audio, beside the engine, on the engine process's GPU.

``vocoder`` holds the networks (ChatTTS's DVAE decoder and Vocos) and which frames decode together,
``convnext`` their ConvNeXt blocks channels-last with a fused Triton kernel (on CUDA);
``stream`` launches pieces (``piece``) on a CUDA stream of its own and takes their audio back;
``quality`` is the gate that judges a whole segment's audio.
"""
