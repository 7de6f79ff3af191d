"""A voice string too long to be a speaker embedding is refused at the door, by every endpoint that takes
one, naming its field: it never reaches the catalog or a worker (see MAX_EMBEDDING_CHARS)."""

import pytest

from chattts_farm.contract import MAX_EMBEDDING_CHARS
from tests.voice_bombs import voice_bomb

pytestmark = pytest.mark.database  # on SQLite and on PostgreSQL

# 50 MiB of zeros in a few thousand characters: longer than any embedding.
BOMB = voice_bomb(50)


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/api/jobs", {"text": "Boom.", "voice": BOMB}, "voice"),
        ("/v1/audio/speech", {"model": "tts-1", "input": "Boom.", "voice": BOMB}, "voice"),
        ("/api/voices", {"name": "bomb", "spk_emb": BOMB}, "spk_emb"),
        ("/api/voices/import", [{"name": "bomb", "spk_emb": BOMB}], "spk_emb"),
    ],
    ids=["job", "openai speech", "catalog voice", "catalog import"],
)
def test_a_voice_bomb_is_refused_with_a_400_naming_its_field(client, path, body, field):
    answer = client.post(path, json=body)
    assert answer.status_code == 400, answer.get_json()
    assert answer.get_json()["field"] == field
    assert BOMB not in answer.get_json()["error"]
    assert client.get("/api/voices").get_json() == {"voices": []}


def test_the_refusal_says_how_long_an_embedding_may_be(client):
    answer = client.post("/api/jobs", json={"text": "Boom.", "voice": BOMB})
    assert f"at most {MAX_EMBEDDING_CHARS} characters" in answer.get_json()["error"]
