"""The throwaway PostgreSQL server the tests (and benchmarks) start."""

import os

import psutil
from sqlalchemy import create_engine, inspect, text


def test_the_postgresql_server_never_runs_as_root(postgres_server):
    server = psutil.Process(postgres_server.process.pid)
    assert server.uids().real != 0 and server.username() != "root"
    assert os.stat(postgres_server.directory).st_uid == server.uids().real


def test_each_database_it_makes_is_new_empty_and_speaks_utf_8(postgres_server):
    first, second = postgres_server.create_database(), postgres_server.create_database()
    assert first != second
    engine = create_engine(first)
    try:
        assert inspect(engine).get_table_names() == []
        with engine.connect() as connection:
            assert connection.execute(text("SHOW server_encoding")).scalar() == "UTF8"
            assert connection.execute(text("SELECT :word"), {"word": "语音"}).scalar() == "语音"
    finally:
        engine.dispose()
