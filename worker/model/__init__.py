"""The model of the engine process: ChatTTS's weights and modules, loaded once (``loading``), from a
hub, a folder, or random weights built in ChatTTS's layout (``synthetic_assets``).

Below the engine, the vocoder and the pipeline's preparing of text, which all read it.
"""
