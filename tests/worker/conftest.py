import pytest

from chattts_farm.contract import SynthesisRequest
from cli.local_services import free_port, start_redis_server


@pytest.fixture(scope="session")
def synthesizer(tiny_settings):
    from worker.engine_process.pipeline import Synthesizer

    return Synthesizer.load(tiny_settings)


@pytest.fixture
def make_request(tiny_settings):
    def make(text="Hello world. This is the farm speaking.", **arguments):
        return SynthesisRequest.from_arguments({"text": text, **arguments}, max_text_chars=tiny_settings.max_text_chars)

    return make


@pytest.fixture
def own_redis_url(tmp_path):
    """A Redis of the test's own, for workers that must not meet the session's."""
    port = free_port()
    server = start_redis_server(port, tmp_path / "redis", "--save", "", "--appendonly", "no")
    yield f"redis://127.0.0.1:{port}/0"
    server.terminate()
    server.wait(timeout=20)
