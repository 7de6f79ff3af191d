import pytest

from chattts_farm.contract import SynthesisRequest


@pytest.fixture(scope="session")
def synthesizer(tiny_settings):
    from worker.synthesis import Synthesizer

    return Synthesizer.load(tiny_settings)


@pytest.fixture
def make_request(tiny_settings):
    def make(text="Hello world. This is the farm speaking.", **arguments):
        return SynthesisRequest.from_arguments({"text": text, **arguments}, max_text_chars=tiny_settings.max_text_chars)

    return make
