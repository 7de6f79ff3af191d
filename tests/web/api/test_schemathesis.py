"""Schemathesis against the app's own /api/openapi.json, with keys on and a key: every operation, each
request checked for a server error, a status or a body the description does not document, a request
the description allows that is refused (ST202) and one it forbids that is accepted (ST201).

The fuzzer beside this file (test_fuzz.py) knows what the farm means; Schemathesis knows only what the
description says, so it finds where the two disagree.
"""

import dataclasses

import flask_migrate
import pytest
import redis
import schemathesis
from schemathesis.config import SchemathesisConfig
from schemathesis.engine import events

from tests.web.access.support import bearer
from web import create_app, streaming, voices
from web.access import api_keys

# No worker reads this Redis database (the farm fixture's workers use database 0, the fuzzer's 9).
SCHEMATHESIS_DATABASE = 10
CHECKS = [
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_schema_conformance",
    "positive_data_acceptance",  # ST202
    "negative_data_rejection",  # ST201
]


# Answers the description documents and a schema cannot foresee: what needs a worker ends at once in its
# answer for "no worker" (no worker reads this Redis database), and a voice named may be in no catalog.
NO_WORKER = {
    ("POST", "/api/voices"): 503,  # a seed's embedding comes from a worker
    ("POST", "/api/voices/from-job/{job_id}"): 503,
    ("POST", "/api/voices/import"): 503,  # a blend's embedding comes from a worker
    ("POST", "/v1/audio/speech"): 504,  # it waits for its job's audio: here for no time at all
    ("GET", "/api/jobs/{job_id}/stream"): 504,
    ("POST", "/api/batches"): 503,  # thousands of items fill the farm's queue, which no worker drains here
}
# What positive_data_acceptance takes for "accepted" (Schemathesis's default): a 5xx is not_a_server_error's.
ACCEPTED = ["2xx", "3xx", "401", "403", "404", "409", "429", "5xx"]
# What else a schema-valid request may get (the description says when): a voice named that is in no
# catalog (422); and a form's clip, which a schema can only call bytes, that is no sound file (400 naming audio).
ALSO_ACCEPTED = {
    ("POST", "/api/jobs"): ["422"],
    ("POST", "/v1/audio/speech"): ["422"],
    ("POST", "/api/voices/workshop"): ["422"],
    ("POST", "/api/voices"): ["422", "400"],  # a blend's voices; a clip's audio
    ("POST", "/api/voices/import"): ["422"],  # a blend's voices
    # An item's voice; text, which every item needs unless a default gives it; an upload's lines, which a
    # schema can only call text.
    ("POST", "/api/batches"): ["422", "400"],
}


def schemathesis_config(key: str) -> SchemathesisConfig:
    operations = [
        {
            "include-name": f"{method} {path}",
            "checks": {"not_a_server_error": {"expected-statuses": ["2xx", "3xx", "4xx", status]}},
        }
        for (method, path), status in NO_WORKER.items()
    ] + [
        {
            "include-name": f"{method} {path}",
            "checks": {"positive_data_acceptance": {"expected-statuses": [*ACCEPTED, *also]}},
        }
        for (method, path), also in ALSO_ACCEPTED.items()
    ]
    return SchemathesisConfig.from_dict(
        {
            "headers": bearer(key),
            "seed": 20,
            "continue-on-failure": True,
            "generation": {"max-examples": 5},
            # The coverage phase sends each operation its boundaries and each way to break them; the
            # stateful phase would only chain what the fuzzer already sends one by one.
            "phases": {"stateful": {"enabled": False}},
            "checks": {"enabled": False, **{check: {"enabled": True} for check in CHECKS}},
            "operations": operations,
        }
    )


@pytest.fixture(scope="module")
def keyed_api(tiny_settings, redis_url, tmp_path_factory):
    url = f"{redis_url.rsplit('/', 1)[0]}/{SCHEMATHESIS_DATABASE}"
    data_dir = tmp_path_factory.mktemp("schemathesis")
    settings = dataclasses.replace(
        tiny_settings,
        redis_url=url,
        data_dir=data_dir,
        database_url=f"sqlite:///{data_dir / 'farm.db'}",
        require_api_key=True,
        # Schemathesis sends a few hundred requests a minute, and its jobs are never taken.
        rate_limit_per_minute=100_000,
        read_rate_limit_per_minute=100_000,
        max_queued_jobs_per_key=100_000,
        max_request_bytes=64 * 1024,
        max_text_chars=2000,
    )
    app = create_app({"TESTING": True, "SETTINGS": settings})
    with app.app_context():
        flask_migrate.upgrade()
        key = api_keys.create_key("schemathesis")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(streaming, "IDLE_TIMEOUT_S", 0)
        patch.setattr(voices, "EMBEDDING_TIMEOUT_S", 0.01)
        yield app, key
    redis.Redis.from_url(url).flushdb()


def run(schema) -> tuple[set[str], list[str]]:
    """A Schemathesis run: the operations it sent requests to, and every check failed (with the request
    and the answer) or error met."""
    tested, problems = set(), []
    for event in schemathesis.engine.from_schema(schema).execute():
        if isinstance(event, events.ScenarioFinished):
            tested |= {case.value.operation.label for case in event.recorder.cases.values()}
            for case_id, checks in event.recorder.checks.items():
                case = event.recorder.cases[case_id].value
                response = event.recorder.interactions[case_id].response
                problems += [
                    f"[{check.failure_info.failure.code}] {check.failure_info.failure.title}: "
                    f"{check.failure_info.failure.message}\n  {case.method} {case.formatted_path} "
                    f"query={case.query} body={case.body!r:.1000}\n"
                    f"  -> {response.status_code} {response.content[:300]!r}"
                    for check in checks
                    if check.failure_info is not None
                ]
        elif isinstance(event, events.NonFatalError):
            problems.append(f"error in {event.label}: {event.value!r}")
        elif isinstance(event, events.FatalError):
            problems.append(f"fatal error: {event.exception!r}")
    return tested, problems


def test_the_api_agrees_with_its_description(keyed_api):
    app, key = keyed_api
    description = app.test_client().get("/api/openapi.json").get_json()
    operations = {f"{method.upper()} {path}" for path, methods in description["paths"].items() for method in methods}
    tested, problems = run(schemathesis.openapi.from_wsgi("/api/openapi.json", app, config=schemathesis_config(key)))
    assert not problems, "\n".join(problems)
    # Every operation but the description itself: Schemathesis never sends requests to where it loaded it from.
    assert tested == operations - {"GET /api/openapi.json"}
