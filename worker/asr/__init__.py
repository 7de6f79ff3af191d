"""The ASR gate: the engine process listens to each segment it made and compares what it heard with
what it was asked to say (``text``: the two made comparable and their error rate; ``backends``: the
recognisers; ``listener``: the thread beside the engine that runs them). The pipeline
(worker.engine_process.pipeline) sends a segment heard wrong back with another seed."""
