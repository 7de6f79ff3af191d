"""The web app's handles on the queue: a Celery client to submit jobs and read their state, Redis for
the state web processes share (rate limits, quotas, worker heartbeats), and the audio store."""

from __future__ import annotations

from dataclasses import dataclass

import redis
from celery import Celery
from flask import Flask, current_app

from chattts_farm import audio_store
from chattts_farm.audio_store import AudioStore
from chattts_farm.celery_client import create_celery
from chattts_farm.settings import Settings


@dataclass
class Backends:
    celery: Celery
    redis: redis.Redis
    audio: AudioStore
    # Sends jobs' tasks, and only that: it has no result backend. The web reads a job's state from its
    # result key (web.jobs.refresh), never through the AsyncResult a send gives, and a client with a
    # result backend subscribes to each task's result channel as it sends it, and unsubscribes when that
    # AsyncResult goes: two round trips a job, the most of a batch's 10,000 messages' cost.
    sender: Celery


# A web request must not hang while Redis is away: give up on it within seconds and answer 503.
# (Workers are patient instead, see worker.celery_app: they must ride out a Redis restart.)
REDIS_GIVE_UP_S = 3


def init_app(app: Flask) -> None:
    settings: Settings = app.config["SETTINGS"]
    celery = create_celery(settings)
    celery.conf.result_backend_transport_options = {
        **celery.conf.result_backend_transport_options,
        "retry_policy": {"max_retries": 2, "interval_start": 0.2, "interval_step": 0.5, "interval_max": 1},
    }
    celery.conf.redis_socket_connect_timeout = REDIS_GIVE_UP_S
    # One result backend (one connection pool, one pubsub) for the whole process. Otherwise Celery makes
    # one per thread, and under gevent every request is a thread of its own: two Redis connections each.
    celery.conf.result_backend_thread_safe = True
    # Under gevent every open request may want a connection of a pool at the same moment (each holds at
    # most one at a time): a pool smaller than that would refuse the rest (redis-py's default is 100).
    # A few more for the result backend's pubsub.
    pool_size = settings.web_connections + 8
    celery.conf.redis_max_connections = pool_size
    client = redis.Redis.from_url(settings.redis_url, socket_connect_timeout=REDIS_GIVE_UP_S, max_connections=pool_size)
    sender = create_celery(settings)
    sender.conf.result_backend = None
    sender.conf.redis_socket_connect_timeout = REDIS_GIVE_UP_S
    sender.conf.redis_max_connections = pool_size
    app.extensions["backends"] = Backends(celery, client, audio_store.from_settings(settings, client), sender)


def current() -> Backends:
    return current_app.extensions["backends"]
