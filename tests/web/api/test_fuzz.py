"""Schema-driven fuzzing of the JSON API: every operation /api/openapi.json describes is sent requests
that follow the description, requests broken in one place, and requests that follow nothing at all.

- A request that follows the description is accepted with the status the description documents.
- A request broken in one place (a wrong value, a missing field, an unknown one, a body that is no
  JSON object) is a 400 naming that place.
- No request is a server error, and every error is JSON ``{"error": ...}`` naming the field at fault.

No worker serves the fuzzer's Redis database: the jobs it submits wait there, never delivered, and are
flushed at the end. What needs a worker ends at once in its documented answer for "no worker".
"""

import dataclasses
import itertools
import json
import math
import re
from dataclasses import dataclass
from urllib.parse import quote

import flask_migrate
import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chattts_farm.contract import MAX_MIX_PARTS, MAX_MIX_WEIGHT, MAX_SEED
from tests.web.access.support import bearer
from tests.web.databases import DATABASES, fresh_database
from web import create_app, streaming, voices
from web.access import api_keys
from web.api.openapi import openapi_description

# No worker reads this Redis database: the farm fixture's workers use database 0.
FUZZ_DATABASE = 9
EMBEDDING = "蘁淰敕欀" * 8
MAX_REQUEST_BYTES = 64 * 1024
FUZZING = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])

# Names that mean something somewhere in the API, sent where they mean nothing.
CONFUSABLE_NAMES = ["request_id", "voice_id", "voice", "seed", "spk_emb", "text", "input", "name", "id", "tags"]
# Values that break a schema in every way JSON allows, and some only Python's parser does (NaN, Infinity).
NASTY_VALUES = [
    None,
    True,
    False,
    0,
    -1,
    1.5,
    -0.5,
    10**30,
    -(10**30),
    1e308,
    math.nan,
    math.inf,
    -math.inf,
    "",
    " ",
    "NaN",
    "Infinity",
    "-Infinity",
    "1e999",
    "0x1F",
    "null",
    "true",
    "9" * 50,
    "\x00",
    "\ud800",
    [],
    {},
    [None],
    {"": None},
    [[[[[]]]]],
    {"a": {"b": {"c": {}}}},
]
JSON_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(st.characters(codec=None) | st.characters(categories=["Cs"]), max_size=30)
)
ANY_JSON = st.recursive(
    JSON_SCALARS | st.sampled_from(NASTY_VALUES),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
SPEAKABLE_TEXT = st.from_regex(r"[A-Za-z\u4e00-\u9fff][A-Za-z0-9\u4e00-\u9fff ,.!?']{0,80}", fullmatch=True)
WRONG_CONTENT_TYPES = [
    "text/plain",
    "application/x-www-form-urlencoded",
    "multipart/form-data",
    "application/xml",
    "application/octet-stream",
    "",
]
ABSENT = object()
_numbers = itertools.count()


class Operation:
    """One operation of the description. (A plain class: Hypothesis prints a failing example's operation
    by its repr, which is short.)"""

    def __init__(self, method: str, path: str, spec: dict):
        self.method, self.path, self.spec = method, path, spec

    def __repr__(self) -> str:
        return f"{self.method.upper()} {self.path}"

    @property
    def body_schema(self) -> dict | None:
        body = self.spec.get("requestBody")
        return body["content"]["application/json"]["schema"] if body else None

    def parameters(self, where: str) -> dict[str, dict]:
        return {p["name"]: p for p in self.spec.get("parameters", []) if p["in"] == where}

    @property
    def names(self) -> set[str]:
        """Every parameter and property name the operation knows, at any depth of its body."""
        names, pending = set(self.parameters("query")), [self.body_schema or {}]
        while pending:
            schema = pending.pop()
            names |= set(schema.get("properties", {}))
            pending += [*schema.get("properties", {}).values(), *([schema["items"]] if "items" in schema else [])]
        return names

    @property
    def statuses(self) -> set[int]:
        return {int(code) for code in self.spec["responses"]}

    def needs_a_worker(self, body) -> int | None:
        """The documented answer of a workers without workers, where a valid request (any JSON) needs one."""
        if (self.method, self.path) == ("post", "/v1/audio/speech"):
            return 504  # it waits for its job: here for no time at all
        if (
            (self.method, self.path) == ("post", "/api/voices")
            and isinstance(body, dict)
            and {"seed", "mix"} & set(body)
        ):
            return 503  # a seed's or a blend's embedding comes from a worker
        blends = isinstance(body, list) and any(isinstance(entry, dict) and "mix" in entry for entry in body)
        if (self.method, self.path) == ("post", "/api/voices/import") and blends:
            return 503  # a blend's embedding is mixed again by a worker
        if (self.method, self.path) in (("get", "/api/jobs/{job_id}/audio"), ("get", "/api/jobs/{job_id}/captions")):
            return 409  # the job stays queued
        if (self.method, self.path) == ("get", "/api/jobs/{job_id}/stream"):
            return 504  # it waits for the job's audio: here for no time at all
        return None


def operations_of(description: dict) -> dict[str, Operation]:
    operations = (
        Operation(method, path, spec)
        for path, methods in description["paths"].items()
        for method, spec in methods.items()
    )
    return {repr(operation): operation for operation in operations}


@dataclass
class Api:
    client: object
    operations: dict[str, Operation]

    def send(
        self,
        operation: Operation,
        path_values: dict,
        query: dict | None = None,
        body=ABSENT,
        raw: bytes | str | None = None,
        content_type: str = "application/json",
    ):
        path = operation.path
        for name, value in path_values.items():
            path = path.replace("{" + name + "}", quote(str(value), safe=""))
        data = raw if raw is not None else None if body is ABSENT else json.dumps(body)
        return self.client.open(
            path,
            method=operation.method.upper(),
            query_string=query or {},
            data=data,
            content_type=content_type if data is not None else None,
        )


class Catalog:
    """What valid requests refer to, made afresh for each example: deleting or renaming one harms none other."""

    def __init__(self, voice: dict, job_id: str, batch_id: str):
        self.voice, self.job_id, self.batch_id = voice, job_id, batch_id

    def __repr__(self) -> str:
        return (
            f"Catalog(voice {self.voice['id']} named {self.voice['name']!r}, job {self.job_id}, batch {self.batch_id})"
        )

    @classmethod
    def make(cls, client) -> "Catalog":
        voice = client.post("/api/voices", json={"name": unique_name("catalog voice"), "spk_emb": EMBEDDING})
        job = client.post("/api/jobs", json={"text": "A job to point at.", "voice": EMBEDDING})
        batch = client.post("/api/batches", json={"items": [{"text": "A batch to point at.", "voice": EMBEDDING}]})
        assert voice.status_code == 201 and job.status_code == 202 and batch.status_code == 202
        return cls(voice.get_json(), job.get_json()["id"], batch.get_json()["id"])

    def path_values(self, operation: Operation) -> dict:
        known = {"job_id": self.job_id, "voice_id": self.voice["id"], "batch_id": self.batch_id}
        return {name: known[name] for name in operation.parameters("path")}


def unique_name(drawn: str) -> str:
    return f"{drawn} #{next(_numbers)}"


@pytest.fixture(scope="module", params=DATABASES)
def api(request, tiny_settings, redis_url, tmp_path_factory):
    """The API on each database: PostgreSQL refuses some values SQLite stores or looks up (a NUL, an
    integer past 32 bits), and must answer them with the same 4xx."""
    fuzz_url = f"{redis_url.rsplit('/', 1)[0]}/{FUZZ_DATABASE}"
    data_dir = tmp_path_factory.mktemp("fuzz")
    farm_settings = dataclasses.replace(
        tiny_settings,
        redis_url=fuzz_url,
        data_dir=data_dir,
        database_url=fresh_database(request.param, request, data_dir),
        max_request_bytes=MAX_REQUEST_BYTES,
        max_batch_bytes=MAX_REQUEST_BYTES,
        max_text_chars=2000,
    )
    app = create_app({"TESTING": True, "SETTINGS": farm_settings})
    with app.app_context():
        flask_migrate.upgrade()
    client = app.test_client()
    operations = operations_of(client.get("/api/openapi.json").get_json())
    with pytest.MonkeyPatch.context() as patch:
        # No worker will answer: waiting for one would only slow the fuzzer down.
        patch.setattr(streaming, "IDLE_TIMEOUT_S", 0)
        patch.setattr(voices, "EMBEDDING_TIMEOUT_S", 0.1)
        yield Api(client, operations)
    redis.Redis.from_url(fuzz_url).flushdb()


# --- What follows the description -------------------------------------------------------------------


def meaningful(name: str | None, catalog: Catalog):
    """Values the schema cannot describe: they must name something present, be unique, or be speakable."""
    one_voice = st.integers(0, MAX_SEED) | st.sampled_from([EMBEDDING, catalog.voice["name"], "alloy"])
    # A blend's weights are not all 0.
    mix = st.lists(
        st.fixed_dictionaries({"voice": one_voice}, optional={"weight": st.floats(0, MAX_MIX_WEIGHT)}),
        min_size=1,
        max_size=MAX_MIX_PARTS,
    ).filter(lambda parts: any(part.get("weight", 1) for part in parts))
    voice = one_voice | st.fixed_dictionaries({"mix": mix})
    return {
        "text": SPEAKABLE_TEXT,
        "input": SPEAKABLE_TEXT,
        "voice": voice,
        "voices": st.lists(voice, max_size=4),
        "mix": mix,
        "voice_id": st.just(catalog.voice["id"]),
        "spk_emb": st.just(EMBEDDING),
        # A speaker sample is written as an embedding is (an import stores it undecoded).
        "spk_smp": st.just(EMBEDDING),
        "txt_smp": SPEAKABLE_TEXT,
        "name": st.text(max_size=60).map(unique_name),
        # Unique in its batch.
        "custom_id": st.builds(lambda: f"item-{next(_numbers)}"),
    }.get(name)


def valid(schema: dict, catalog: Catalog, name: str | None = None):
    if (special := meaningful(name, catalog)) is not None:
        return special
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    if "oneOf" in schema and "type" not in schema:
        return st.one_of([valid(branch, catalog) for branch in schema["oneOf"]])
    types = schema.get("type")
    if isinstance(types, list):
        return st.one_of([valid({**schema, "type": kind}, catalog) for kind in types])
    low, high = schema.get("minimum"), schema.get("maximum")
    if types == "integer":
        return st.integers(low, high)
    if types == "number":
        return st.floats(low, high, allow_nan=False, allow_infinity=False) | st.integers(
            math.ceil(low), math.floor(high)
        )
    if types == "string":
        return st.text(min_size=schema.get("minLength", 0), max_size=min(schema.get("maxLength", 40), 40))
    if types == "boolean":
        return st.booleans()
    if types == "null":
        return st.none()
    if types == "array":
        return st.lists(
            valid(schema.get("items", {"type": "string"}), catalog), min_size=schema.get("minItems", 0), max_size=3
        )
    assert types == "object", schema
    return valid_object(schema, catalog)


@st.composite
def valid_object(draw, schema: dict, catalog: Catalog):
    properties = schema.get("properties", {})
    chosen = set(schema.get("required", []))
    chosen |= {name for name in sorted(set(properties) - chosen) if draw(st.booleans())}
    branches = schema.get("oneOf", [])  # exactly one branch: its required group, its properties narrowed
    if branches:
        branch = draw(st.sampled_from(branches))
        chosen = (chosen - set().union(*(branch["required"] for branch in branches))) | set(branch["required"])
        narrowed = branch.get("properties", {})
        properties = {name: {**schema, **narrowed.get(name, {})} for name, schema in properties.items()}
    apart = set(schema.get("not", {}).get("required", []))  # never all together
    if apart and apart <= chosen:
        chosen.discard(draw(st.sampled_from(sorted(apart))))
    return {name: draw(valid(properties[name], catalog, name)) for name in sorted(chosen)}


@st.composite
def valid_request(draw, operation: Operation, catalog: Catalog):
    query = {}
    for name, parameter in operation.parameters("query").items():
        if draw(st.booleans()):
            value = draw(valid(parameter["schema"], catalog, name))
            query[name] = [str(item) for item in value] if isinstance(value, list) else str(value)
    schema = operation.body_schema
    return query, ABSENT if schema is None else draw(valid(schema, catalog))


# --- What breaks it ------------------------------------------------------------------------------------


def conforms(value, schema: dict) -> bool:
    """Whether a value meets a property's schema (the part of JSON Schema the description uses)."""
    if "enum" in schema and not any(value == choice and type(value) is type(choice) for choice in schema["enum"]):
        return False
    if "oneOf" in schema and sum(conforms(value, branch) for branch in schema["oneOf"]) != 1:
        return False
    types = schema.get("type")
    if types is not None and not any(_is(value, kind) for kind in (types if isinstance(types, list) else [types])):
        return False
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if number and not schema.get("minimum", -math.inf) <= value <= schema.get("maximum", math.inf):
        return False
    if isinstance(value, str) and not schema.get("minLength", 0) <= len(value) <= schema.get("maxLength", math.inf):
        return False
    if isinstance(value, list) and "items" in schema:
        return all(conforms(item, schema["items"]) for item in value)
    return True


def _is(value, kind: str) -> bool:
    number = isinstance(value, int) and not isinstance(value, bool) or isinstance(value, float) and math.isfinite(value)
    return {
        "integer": number and float(value).is_integer() if isinstance(value, float) else number,
        "number": number,
        "string": isinstance(value, str),
        "boolean": isinstance(value, bool),
        "null": value is None,
        "array": isinstance(value, list),
        "object": isinstance(value, dict),
    }[kind]


def invalid(schema: dict):
    edges = [schema[key] + step for key, step in (("minimum", -1), ("maximum", 1)) if key in schema]
    if "maxLength" in schema:
        edges.append("x" * (schema["maxLength"] + 1))
    candidates = st.sampled_from(NASTY_VALUES + edges) | ANY_JSON
    return candidates.filter(lambda value: not conforms(value, schema))


INVALID_QUERY_VALUES = {
    "integer": ["0", "501", "-1", "1.5", "", "ten", "1e3", "NaN", "9" * 30],
    "enum": ["", "lost", "DONE", "\x00", "queued "],
}


def query_kind(parameter: dict) -> str | None:
    """How a query parameter can be broken: an integer or an enum can; free text cannot."""
    schema = parameter["schema"]
    return "enum" if "enum" in schema else "integer" if schema.get("type") == "integer" else None


def is_json(data: bytes) -> bool:
    try:
        json.loads(data)
    except ValueError:
        return False
    return True


@st.composite
def broken_request(draw, operation: Operation, catalog: Catalog):
    """A valid request broken in one place, and the name of that place."""
    query, body = draw(valid_request(operation, catalog))
    schema = operation.body_schema or {}
    breaks = []
    if isinstance(body, dict):
        breaks += [("replace", name) for name in body]
        breaks += [("drop", name) for name in schema.get("required", [])]
        if schema.get("additionalProperties") is False:
            breaks.append(("add", None))
    if schema:
        breaks.append(("not the body", None))
    breaks += [("query", name) for name, parameter in operation.parameters("query").items() if query_kind(parameter)]
    kind, name = draw(st.sampled_from(breaks))
    raw, content_type = None, "application/json"
    if kind == "replace":
        body = {**body, name: draw(invalid(schema["properties"][name]))}
    elif kind == "drop":
        body = {key: value for key, value in body.items() if key != name}
    elif kind == "add":
        name = draw(
            (st.sampled_from(CONFUSABLE_NAMES) | st.text(min_size=1, max_size=12)).filter(
                lambda key: key not in schema["properties"]
            )
        )
        body = {**body, name: draw(ANY_JSON)}
    elif kind == "not the body":
        name = "body"
        body, raw, content_type = draw(
            st.one_of(
                invalid({"type": schema["type"]}).map(lambda value: (value, None, "application/json")),
                st.binary(max_size=40)
                .filter(lambda data: not is_json(data))
                .map(lambda data: (ABSENT, data, "application/json")),
                st.sampled_from(WRONG_CONTENT_TYPES).map(lambda kind: (ABSENT, json.dumps(body), kind)),
            )
        )
    else:
        parameter = operation.parameters("query")[name]
        query = {**query, name: draw(st.sampled_from(INVALID_QUERY_VALUES[query_kind(parameter)]))}
    return query, body, raw, content_type, name


# --- What follows nothing --------------------------------------------------------------------------------


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@st.composite
def any_request(draw, operation: Operation, catalog: Catalog):
    path_values = {}
    for name, parameter in operation.parameters("path").items():
        arbitrary = (
            st.integers()
            if parameter["schema"]["type"] == "integer"
            else st.text(st.characters(codec="utf-8", exclude_characters="/"), min_size=1, max_size=40).filter(
                lambda value: value not in (".", "..")
            )
        )
        path_values[name] = draw(st.sampled_from([catalog.path_values(operation)[name]]) | arbitrary)
    names = st.text(max_size=8)
    if operation.parameters("query"):
        names |= st.sampled_from(list(operation.parameters("query")))
    query = draw(st.dictionaries(names, st.text(max_size=20), max_size=3))
    schema = operation.body_schema or {"type": "object", "properties": {}}
    near = st.fixed_dictionaries({}, optional={name: ANY_JSON for name in schema.get("properties", {})})
    value, raw, content_type = draw(
        st.one_of(
            (ANY_JSON | near | valid(schema, catalog)).map(
                lambda value: (value, json.dumps(value), "application/json")
            ),
            st.integers(1, 30_000).map(lambda depth: (ABSENT, nested(depth), "application/json")),
            st.tuples(
                st.just(ABSENT), st.binary(max_size=200), st.sampled_from(["application/json", *WRONG_CONTENT_TYPES])
            ),
            st.tuples(st.just(ABSENT), valid(schema, catalog).map(json.dumps), st.sampled_from(WRONG_CONTENT_TYPES)),
        )
    )
    return path_values, query, value, raw, content_type


# --- The properties ----------------------------------------------------------------------------------------


def can_break(operation: Operation) -> bool:
    return bool(operation.body_schema or any(map(query_kind, operation.parameters("query").values())))


# Only to name the tests, one per operation: each test reads its operation from the app's description.
OPERATIONS = operations_of(openapi_description(max_text_chars=1, keys_required=False))
BREAKABLE = [name for name, operation in OPERATIONS.items() if can_break(operation)]


def assert_a_json_error(answer, operation: Operation, fields: set[str] | None = None):
    """An error answer is JSON with a message; a 400, 413 or 422 names its field (one of ``fields``, or a
    part of one: ``items[0].text`` of ``items``)."""
    assert answer.is_json, f"{operation}: {answer.status_code} is not JSON: {answer.data[:200]!r}"
    error = answer.get_json()
    assert isinstance(error.get("error"), str) and error["error"], f"{operation}: {error}"
    if answer.status_code in (400, 413, 422):
        assert isinstance(error.get("field"), str), f"{operation}: a {answer.status_code} names no field: {error}"
        named = error["field"].split("[", 1)[0]
        assert fields is None or error["field"] in fields or named in fields, f"{operation}: {error}"


def test_the_description_covers_every_route_of_the_api(api):
    app = api.client.application
    routes = {
        (method.lower(), re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", rule.rule))
        for rule in app.url_map.iter_rules()
        if rule.rule.startswith(("/api/", "/v1/"))
        for method in rule.methods - {"HEAD", "OPTIONS"}
    }
    assert routes == {(operation.method, operation.path) for operation in api.operations.values()}
    assert set(api.operations) == set(OPERATIONS)


@pytest.mark.parametrize("name", OPERATIONS)
@settings(FUZZING, max_examples=8)
@given(data=st.data())
def test_a_request_that_follows_the_description_gets_the_documented_status(api, name, data):
    operation = api.operations[name]
    catalog = Catalog.make(api.client)
    query, body = data.draw(valid_request(operation, catalog), label="query and body")
    answer = api.send(operation, catalog.path_values(operation), query, body)
    expected = operation.needs_a_worker(body if body is not ABSENT else {})
    successes = {status for status in operation.statuses if status < 300}
    assert answer.status_code in ({expected} if expected else successes), f"{operation}: {answer.get_json()}"
    assert answer.status_code in operation.statuses
    if answer.status_code >= 400:
        assert_a_json_error(answer, operation)


@pytest.mark.parametrize("name", BREAKABLE)
@settings(FUZZING, max_examples=20)
@given(data=st.data())
def test_a_request_broken_in_one_place_is_a_400_naming_that_place(api, name, data):
    operation = api.operations[name]
    catalog = Catalog.make(api.client)
    query, body, raw, content_type, place = data.draw(broken_request(operation, catalog), label="broken request")
    answer = api.send(operation, catalog.path_values(operation), query, body, raw, content_type)
    assert answer.status_code == 400, f"{operation}: {answer.status_code} {answer.data[:300]!r}"
    assert_a_json_error(answer, operation, {place})


@pytest.mark.parametrize("name", OPERATIONS)
@settings(FUZZING, max_examples=12)
@given(data=st.data())
def test_no_request_is_a_server_error_and_every_error_is_json_naming_its_field(api, name, data):
    operation = api.operations[name]
    catalog = Catalog.make(api.client)
    path_values, query, value, raw, content_type = data.draw(any_request(operation, catalog), label="request")
    answer = api.send(operation, path_values, query, raw=raw, content_type=content_type)
    body = value if isinstance(value, dict) else {}
    assert answer.status_code < 500 or answer.status_code == operation.needs_a_worker(value), (
        f"{operation}: {answer.status_code} {answer.data[:300]!r}"
    )
    assert answer.status_code in operation.statuses, f"{operation}: {answer.status_code} {answer.data[:300]!r}"
    if answer.status_code >= 400:
        assert_a_json_error(answer, operation, {*operation.names, *body, "body"})


def test_an_oversized_body_is_a_413_naming_the_body(api):
    catalog = Catalog.make(api.client)
    for operation in (operation for operation in api.operations.values() if operation.body_schema):
        answer = api.send(operation, catalog.path_values(operation), raw=json.dumps({"text": "x" * MAX_REQUEST_BYTES}))
        assert answer.status_code == 413 and 413 in operation.statuses, str(operation)
        assert_a_json_error(answer, operation, {"body"})


DEEP = "[" * 30_000
# Requests the fuzzer found to be server errors (or answered wrongly), kept as examples that always run.
FOUND = {
    "a deeply nested job": ("POST", "/api/jobs", DEEP, 400, "body"),
    "a deeply nested speech request": ("POST", "/v1/audio/speech", '{"input": ' + DEEP, 400, "body"),
    "a deeply nested import": ("POST", "/api/voices/import", DEEP, 400, "body"),
    "a lone surrogate in text": ("POST", "/api/jobs", '{"text": "Hi \\ud83d."}', 400, "text"),
    "a lone surrogate in a voice name": ("POST", "/api/jobs", '{"text": "Hi.", "voice": "\\ud800"}', 400, "voice"),
    "a lone surrogate in a speech voice": (
        "POST",
        "/v1/audio/speech",
        '{"input": "Hi.", "voice": "\\udfff"}',
        400,
        "voice",
    ),
    "a lone surrogate in a catalog name": ("POST", "/api/voices", '{"name": "\\ud800", "seed": 1}', 400, "name"),
    "a lone surrogate under an empty key": ("POST", "/api/voices/import", '{"": "\\ud800"}', 400, "body"),
    # An import is a list: an object's key names none of its fields.
    "a lone surrogate in an object imported": ("POST", "/api/voices/import", '{"0": "\\ud800"}', 400, "body"),
    "a lone surrogate under an empty key of a job": ("POST", "/api/jobs", '{"": "\\ud800"}', 400, "body"),
    "a voice id past 64 bits": ("POST", "/api/jobs", {"text": "Hi.", "voice_id": 2**70}, 422, "voice_id"),
    "a path voice id past 64 bits": ("GET", "/api/voices/99999999999999999999", None, 404, None),
    "a seed of 5000 digits": ("POST", "/api/jobs", {"text": "Hi.", "voice": "9" * 5000}, 422, "voice"),
    "a superscript digit for a seed": ("POST", "/api/jobs", {"text": "Hi.", "voice": "²"}, 422, "voice"),
    "a voice and a voice id": ("POST", "/api/jobs", {"text": "Hi.", "voice": 1, "voice_id": 1}, 400, "voice_id"),
    "a request id from outside": ("POST", "/api/jobs", {"text": "Hi.", "request_id": "mine"}, 400, "request_id"),
    "an empty key": ("POST", "/api/jobs", {"text": "Hi.", "": 1}, 400, ""),
    "a level without refine_text": ("POST", "/api/jobs", {"text": "Hi.", "oral": 99}, 400, "oral"),
    "a list for a speech format": (
        "POST",
        "/v1/audio/speech",
        {"input": "Hi.", "voice": 1, "response_format": []},
        400,
        "response_format",
    ),
    "a number for a speech model": ("POST", "/v1/audio/speech", {"input": "Hi.", "voice": 1, "model": 1}, 400, "model"),
    # Refused at once, not after asking a worker for the seed's embedding (503 here, a minute's wait there).
    "a bad field beside a seed": ("POST", "/api/voices", {"name": "Rated", "seed": 1, "rating": 9}, 400, "rating"),
    "a seed for a job's voice": ("POST", "/api/voices/from-job/{job_id}", {"name": "Kept", "seed": 1}, 400, "seed"),
}


@pytest.mark.parametrize(("method", "path", "body", "status", "field"), FOUND.values(), ids=FOUND.keys())
def test_what_the_fuzzer_found_is_answered_with_a_json_error(api, method, path, body, status, field):
    path = path.format(job_id=Catalog.make(api.client).job_id)
    raw = body if isinstance(body, str) else None if body is None else json.dumps(body)
    answer = api.client.open(path, method=method, data=raw, content_type="application/json" if raw else None)
    assert answer.status_code == status and answer.is_json, answer.data[:300]
    assert answer.get_json().get("field") == field


def test_with_keys_on_every_operation_but_the_description_documents_bearer_keys_and_their_refusals(
    tiny_settings, redis_url, tmp_path
):
    # No request is allowed a minute: a known key is refused too, with the 429 of an exhausted budget.
    settings = dataclasses.replace(
        tiny_settings,
        redis_url=redis_url,
        data_dir=tmp_path,
        require_api_key=True,
        rate_limit_per_minute=0,
        read_rate_limit_per_minute=0,
    )
    app = create_app({"TESTING": True, "SETTINGS": settings})
    with app.app_context():
        flask_migrate.upgrade()
        key = api_keys.create_key("fuzzer")
    client = app.test_client()
    served = client.get("/api/openapi.json")
    assert served.status_code == 200
    description = served.get_json()
    scheme = description["components"]["securitySchemes"]["bearer"]
    assert (scheme["type"], scheme["scheme"]) == ("http", "bearer")
    assert description["security"] == [{"bearer": []}]
    for operation in operations_of(description).values():
        if operation.path == "/api/openapi.json":
            assert operation.spec["security"] == [], "the description itself is public"
            continue
        path = operation.path.format(job_id="a-job", voice_id=1, batch_id="a-batch")
        without_a_key = client.open(path, method=operation.method.upper())
        assert without_a_key.status_code == 401 and 401 in operation.statuses, str(operation)
        over_the_limit = client.open(path, method=operation.method.upper(), headers=bearer(key))
        assert over_the_limit.status_code == 429 and 429 in operation.statuses, str(operation)
        assert "Retry-After" in operation.spec["responses"]["429"]["headers"], str(operation)
        assert 503 in operation.statuses, f"{operation}: the rate counts live in Redis"
        assert (403 in operation.statuses) == (operation.method != "get"), f"{operation}: CSRF of a signed-in session"


def test_with_keys_off_the_description_asks_for_no_key_nor_documents_its_refusals():
    description = openapi_description(max_text_chars=1, keys_required=False)
    assert "security" not in description
    for operation in operations_of(description).values():
        assert 401 not in operation.statuses, str(operation)
        # Only the bound on calls waiting for their audio (speech calls, stream listeners, a batch's archive,
        # written as it is sent) holds without keys.
        waits = operation.path in ("/v1/audio/speech", "/api/jobs/{job_id}/stream", "/api/batches/{batch_id}/archive")
        assert (429 in operation.statuses) == waits, str(operation)


def test_renaming_a_voice_to_a_taken_name_is_a_409_also_with_new_tags(api):
    taken, renamed = Catalog.make(api.client).voice, Catalog.make(api.client).voice
    answer = api.client.patch(f"/api/voices/{renamed['id']}", json={"name": taken["name"], "tags": ["new"]})
    assert answer.status_code == 409 and answer.get_json()["field"] == "name"


def test_a_method_the_path_does_not_take_is_a_json_405_saying_which_it_takes(api):
    answer = api.client.put("/api/jobs")
    assert answer.status_code == 405 and answer.is_json
    assert set(answer.headers["Allow"].split(", ")) >= {"GET", "POST"}


def test_an_integer_too_long_for_python_to_read_is_a_400_saying_so(api):
    answer = api.client.post(
        "/api/jobs", data='{"text": "Hi.", "seed": ' + "9" * 5000 + "}", content_type="application/json"
    )
    assert answer.status_code == 400 and answer.get_json()["field"] == "body"
    assert "5000 digits" in answer.get_json()["error"]


# JSON Schema's integer is any number without a fraction: an encoder may write 0 as 0.0.
WHOLE_FLOATS = {
    "a job's seed for a voice": ("/api/jobs", {"text": "Hi.", "voice": 0.0}, 202),
    # Read as the id 999999, which no catalog voice has (a float was a 400 naming its type).
    "a job's catalog voice id": ("/api/jobs", {"text": "Hi.", "voice_id": 999999.0}, 422),
    "a rating": ("/api/voices", {"spk_emb": EMBEDDING, "rating": 0.0}, 201),
    # Accepted, then asked of a worker (none serves the fuzzer's Redis).
    "a catalog voice's seed": ("/api/voices", {"seed": 134217728.0}, 503),
    "a count of new voices": ("/api/voices/workshop", {"count": 1.0}, 202),
}


@pytest.mark.parametrize(("path", "body", "status"), WHOLE_FLOATS.values(), ids=WHOLE_FLOATS.keys())
def test_a_whole_number_written_with_a_fraction_is_an_integer(api, path, body, status):
    if path == "/api/voices":
        body = {**body, "name": unique_name("whole")}
    answer = api.client.post(path, json=body)
    assert answer.status_code == status, answer.get_json()


LONG_AS_SENT = {
    "name": {"name": "n" * 100 + "\u200b", "spk_emb": EMBEDDING},
    "tags": {"name": "tagged", "spk_emb": EMBEDDING, "tags": ["t" * 64 + "\u200b"]},
    "description": {"name": "described", "spk_emb": EMBEDDING, "description": "d" * 2000 + "\u200b"},
}


@pytest.mark.parametrize(("field", "body"), LONG_AS_SENT.items(), ids=LONG_AS_SENT.keys())
def test_a_length_is_counted_as_sent_as_the_description_counts_it(api, field, body):
    answer = api.client.post("/api/voices", json=body)
    assert answer.status_code == 400 and answer.get_json()["field"] == field


def test_the_description_says_what_text_has_something_to_speak(api):
    texts = [
        api.operations["POST /api/jobs"].body_schema["properties"]["text"],
        api.operations["POST /api/voices/workshop"].body_schema["properties"]["text"],
        api.operations["POST /v1/audio/speech"].body_schema["properties"]["input"],
    ]
    assert all(text["minLength"] == 1 and text["pattern"] == texts[0]["pattern"] for text in texts)
    assert re.search(texts[0]["pattern"], "0") is None and re.search(texts[0]["pattern"], "Zero 0")
    for text in ("0", ""):
        answer = api.client.post("/api/voices/workshop", json={"text": text})
        assert answer.status_code == 400 and answer.get_json()["field"] == "text"


@pytest.mark.parametrize(("field", "value"), [("seed", -1), ("tags", True), ("rating", 9)])
def test_an_import_checks_every_voice_also_one_whose_name_is_taken(api, field, value):
    taken = Catalog.make(api.client).voice["name"]
    new = unique_name("imported")
    answer = api.client.post(
        "/api/voices/import",
        json=[{"name": new, "spk_emb": EMBEDDING}, {"name": taken, "spk_emb": EMBEDDING, field: value}],
    )
    assert answer.status_code == 400 and answer.get_json()["field"] == field
    assert all(voice["name"] != new for voice in api.client.get("/api/voices").get_json()["voices"])
