"""``GET /api/ops``: live workers and queue depths, the data the /ops page shows and refreshes."""

from __future__ import annotations

import time

from web import farm_state
from web.api import bp


@bp.get("/ops")
def ops_data():
    alive = farm_state.workers()
    now = time.time()
    for report in alive:
        report["heartbeat_age_s"] = round(now - report.pop("heartbeat", now), 1)
    return {"workers": alive, "queues": farm_state.queue_depths(alive)}
