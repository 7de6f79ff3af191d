"""Messages a worker cannot take as jobs go to a dead-letter list in Redis, and the worker keeps serving.

Anything can be pushed onto a queue. Kombu's Redis transport reads each message it pops inside the
worker's event loop (JSON, then its envelope), and Celery's consumer then builds a request from it;
an error in either ends the worker process ("Unrecoverable error"). A message that was delivered
goes back to the queue when the worker stops, and ends the next one too. So the workers' Celery app
(:mod:`worker.celery_app`) uses :class:`Consumer` (``worker_consumer``, through :mod:`worker.consumer`) in
place of Celery's own:

- it consumes (and sends its events) through :class:`Transport`, whose channels check each message as
  it comes off a queue, before kombu reads it, and move a message kombu could not deliver to the
  dead-letter list (only those connections: the app's others, and Flower, which shares the app, keep
  kombu's Redis transport);
- it moves there every message Celery refuses (an unknown task, a body it cannot decode, ...) and
  every one whose handling fails, and goes on consuming.

``chattts_farm.redis_keys.DEAD_LETTERS`` says what an entry holds.
"""

from __future__ import annotations

import json
import logging
import time

import redis
from celery.worker import consumer
from kombu.transport import redis as kombu_redis
from kombu.utils.encoding import bytes_to_str
from kombu.utils.json import dumps, loads
from vine import promise

from chattts_farm import redis_keys

logger = logging.getLogger(__name__)

# How much of a dead-lettered message the log shows, and how much of it the list keeps.
LOGGED_CHARS = 500
KEPT_CHARS = 64 * 1024


class Channel(kombu_redis.Channel):
    """Kombu's Redis channel, refusing messages it could not deliver as they come off a queue, with one
    client for all its commands outside the event loop's BRPOP."""

    _client_of_pool: redis.Redis | None = None

    def _create_client(self, asynchronous=False):
        if asynchronous:  # kombu keeps that one (``Channel.client``)
            return self._screened(super()._create_client(asynchronous))
        # Kombu asks for a client for each command it sends (a message's bookkeeping as it arrives, its
        # acknowledgement, an event): building one (its response callbacks) took ~6% of a busy worker's
        # Celery process. A client is a thread-safe handle on its pool: one serves while the pool lasts
        # (kombu makes a new pool after a lost connection).
        client = self._client_of_pool
        if client is None or client.connection_pool is not self.pool:
            client = self._client_of_pool = self._screened(super()._create_client(asynchronous))
        return client

    def _screened(self, client: redis.Redis) -> redis.Redis:
        # A consuming worker pops every message with BRPOP (kombu's RPOP serves only basic_get), and a
        # response callback sees the popped message before kombu parses it.
        parse_popped = client.response_callbacks.get("BRPOP")
        client.set_response_callback("BRPOP", lambda response, **options: self._screen(parse_popped, response, options))
        return client

    def _screen(self, parse_popped, response, options):
        """BRPOP's response, or none (as when nothing came) in place of a message kombu cannot deliver."""
        if response:
            queue, raw = response
            reason = self._undeliverable(raw)
            if reason is not None:
                self.keep_dead_letter(bytes_to_str(queue), reason, raw)
                response = None
        return parse_popped(response, **options) if parse_popped else response

    def _undeliverable(self, raw: bytes) -> str | None:
        """Why kombu could not deliver a popped message, or None: it builds its message as kombu does,
        then checks what kombu's unacknowledged-message bookkeeping reads."""
        try:
            message = self.Message(loads(bytes_to_str(raw)), channel=self)
        # json, base64 and the envelope's shape each raise their own types.
        except Exception as error:  # noqa: BLE001
            return f"not a message envelope: {error!r}"
        delivery = message.delivery_info
        if not isinstance(message.delivery_tag, str) or not all(
            isinstance(delivery.get(part), str) for part in ("exchange", "routing_key")
        ):
            return "its envelope lacks a delivery tag, exchange or routing key"
        return None

    def keep_dead_letter(self, queue: str, reason: str, raw: bytes | str) -> None:
        """Log a message that cannot be taken and push it onto the dead-letter list (the newest kept)."""
        text = raw.decode("utf-8", "backslashreplace") if isinstance(raw, bytes) else raw
        logger.error(
            "a message from queue %s cannot be taken (%s); moved to %s. It begins: %r",
            queue,
            reason,
            redis_keys.DEAD_LETTERS,
            text[:LOGGED_CHARS],
        )
        entry = json.dumps(
            {"queue": queue, "reason": reason, "at": time.time(), "size": len(text), "message": text[:KEPT_CHARS]}
        )
        try:
            with self.conn_or_acquire() as client:
                client.pipeline().lpush(redis_keys.DEAD_LETTERS, entry).ltrim(
                    redis_keys.DEAD_LETTERS, 0, redis_keys.DEAD_LETTERS_KEPT - 1
                ).execute()
        except redis.RedisError as error:
            logger.error("the message from queue %s could not be kept in %s: %s", queue, redis_keys.DEAD_LETTERS, error)


class Transport(kombu_redis.Transport):
    Channel = Channel


# Named, not the class: kombu shows the name where it shows the broker's URL ("Connected to ...").
TRANSPORT = f"{__name__}:{Transport.__name__}"


class Consumer(consumer.Consumer):
    """Celery's consumer, moving each message it refuses, or fails to handle, to the dead-letter list."""

    def connection_for_read(self, heartbeat=None):
        return self.ensure_connected(self.app.connection_for_read(heartbeat=heartbeat, transport=TRANSPORT))

    def connection_for_write(self, url=None, heartbeat=None):
        # The worker's events go out through this transport too: one client for them all.
        return self.ensure_connected(self.app.connection_for_write(url=url, heartbeat=heartbeat, transport=TRANSPORT))

    def on_unknown_message(self, body, message):
        super().on_unknown_message(body, message)
        _keep(message, "not a task message")

    def on_unknown_task(self, body, message, exc):
        super().on_unknown_task(body, message, exc)
        _keep(message, f"no task of that name here: {exc!r}")

    def on_invalid_task(self, body, message, exc):
        super().on_invalid_task(body, message, exc)
        _keep(message, f"an invalid task message: {exc!r}")

    def on_decode_error(self, message, exc):
        super().on_decode_error(message, exc)
        _keep(message, f"its body cannot be decoded: {exc!r}")

    def create_task_handler(self, promise=promise):
        handle = super().create_task_handler(promise)
        # The broker's own errors keep Celery's handling (reconnect, and the message is redelivered).
        broker_errors = self.connection_errors + self.channel_errors

        def on_task_received(message):
            try:
                return handle(message)
            except broker_errors:
                raise
            # Celery builds a request from whatever the message holds, raising what each part raises.
            except Exception as error:  # noqa: BLE001
                logger.exception("handling a task message failed")
                _keep(message, f"handling it failed: {error!r}")
                if not message.acknowledged:
                    message.reject(requeue=False)

        return on_task_received


def _keep(message, reason: str) -> None:
    """Dead-letter a message the consumer has: its envelope as popped (``_raw``, which kombu's Redis
    transport also keeps for an unacknowledged message), under its routing key, the name of its queue
    (a broadcast, to the control consumer, was never screened and may lack one)."""
    message.channel.keep_dead_letter(message.delivery_info.get("routing_key", ""), reason, dumps(message._raw))
