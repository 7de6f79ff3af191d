"""``GET /api/ops``: live workers and queue depths; ``GET /api/ops/series``: the last minutes of the farm
as series. The /ops page shows and refreshes both."""

from __future__ import annotations

import time

from chattts_farm import ops_series
from web import backends, farm_state
from web.api import bp


@bp.get("/ops")
def ops_data():
    alive = farm_state.workers()
    now = time.time()
    for report in alive:
        report["heartbeat_age_s"] = round(now - report.pop("heartbeat", now), 1)
    return {"workers": alive, "queues": farm_state.queue_depths(alive)}


@bp.get("/ops/series")
def ops_series_data():
    return ops_series.read(backends.current().redis, time.time())
