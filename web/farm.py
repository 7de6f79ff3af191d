"""The web app's handles on the farm: a Celery client to submit jobs and Redis to read their audio."""

from __future__ import annotations

from dataclasses import dataclass

import redis
from celery import Celery
from flask import Flask, current_app

from worker.celery_app import create_celery
from worker.settings import Settings


@dataclass
class FarmClient:
    celery: Celery
    redis: redis.Redis


def init_app(app: Flask) -> None:
    settings: Settings = app.config["SETTINGS"]
    app.extensions["farm"] = FarmClient(create_celery(settings), redis.Redis.from_url(settings.redis_url))


def client() -> FarmClient:
    return current_app.extensions["farm"]
