"""The Prometheus and Grafana files of compose's monitoring profile: they parse, and Prometheus scrapes
the web's /metrics (that /metrics exports what the dashboard queries: tests/web/test_monitoring.py)."""

import json
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
MONITORING = ROOT / "deploy" / "monitoring"
DASHBOARD = MONITORING / "grafana" / "dashboards" / "chattts-farm.json"


def test_the_dashboard_is_a_provisionable_grafana_dashboard_on_the_provisioned_datasource():
    dashboard = json.loads(DASHBOARD.read_text())
    datasource = yaml.safe_load((MONITORING / "grafana/provisioning/datasources/prometheus.yml").read_text())
    provider = yaml.safe_load((MONITORING / "grafana/provisioning/dashboards/chattts-farm.yml").read_text())

    uid = datasource["datasources"][0]["uid"]
    assert dashboard["uid"] and dashboard["title"] and dashboard["panels"]
    assert provider["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"
    for panel in dashboard["panels"]:
        assert panel["targets"], panel["title"]
        assert panel["datasource"]["uid"] == uid and all(t["datasource"]["uid"] == uid for t in panel["targets"])
    assert len({panel["id"] for panel in dashboard["panels"]}) == len(dashboard["panels"])


def test_prometheus_scrapes_the_webs_metrics():
    config = yaml.safe_load((MONITORING / "prometheus.yml").read_text())
    (job,) = config["scrape_configs"]
    assert job["metrics_path"] == "/metrics" and job["static_configs"][0]["targets"] == ["web:8000"]
