"""docker-compose.yml is checked by `docker compose config` where the compose plugin exists, and by
parsing it otherwise (no Docker engine runs here)."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
# The stores the farm's own services use, and the monitoring profile's services: each runs its own image.
STORES = {"redis", "postgres"}
MONITORING = {"prometheus", "grafana"}


@pytest.fixture(scope="module")
def compose():
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_docker_compose_config_accepts_the_file():
    docker = shutil.which("docker")
    if docker is None or subprocess.run([docker, "compose", "version"], capture_output=True).returncode != 0:
        pytest.skip("the docker CLI's compose plugin is not installed; the file is checked by parsing below")
    finished = subprocess.run(
        [
            docker,
            "compose",
            "-f",
            str(ROOT / "docker-compose.yml"),
            "--env-file",
            str(ROOT / ".env.example"),
            "config",
            "--quiet",
        ],
        capture_output=True,
        text=True,
        # .env.example leaves the passwords for the user to choose; compose refuses to run without them.
        env={
            **os.environ,
            "CHATTTS_FARM_REDIS_PASSWORD": "a-chosen-password",
            "CHATTTS_FARM_POSTGRES_PASSWORD": "another-chosen-password",
            "CHATTTS_FARM_GRAFANA_PASSWORD": "a-third-chosen-password",
        },
    )
    assert finished.returncode == 0, finished.stderr


def test_services_share_one_image(compose):
    services = compose["services"]
    assert STORES | {"migrate", "web", "worker-gpu0", "flower"} <= set(services)
    farm_services = [name for name in services if name not in STORES | MONITORING]
    assert {services[name]["image"] for name in farm_services} == {"chattts-farm:latest"}
    assert (ROOT / "Dockerfile").is_file() and (ROOT / ".env.example").is_file()


def test_redis_wants_a_password_and_only_the_farm_reaches_it(compose):
    redis = compose["services"]["redis"]
    # The password comes from .env, reaches redis-server through a file (not its command line), and the
    # health check through REDISCLI_AUTH; every farm service's Redis URL carries it.
    assert redis["environment"]["REDISCLI_AUTH"].startswith("${CHATTTS_FARM_REDIS_PASSWORD:?")
    assert "requirepass" in " ".join(redis["command"]) and "--requirepass" not in " ".join(redis["command"])
    for name, service in compose["services"].items():
        if name not in STORES | MONITORING:
            assert service["environment"]["CHATTTS_FARM_REDIS_URL"].startswith(
                "redis://:${CHATTTS_FARM_REDIS_PASSWORD:?"
            ), name
    assert redis["networks"] == ["queue"] and compose["networks"]["queue"]["internal"] is True
    assert "ports" not in redis
    assert "CHATTTS_FARM_REDIS_PASSWORD=\n" in (ROOT / ".env.example").read_text()


def test_redis_keeps_an_append_only_file_never_evicts_and_is_health_checked(compose):
    redis = compose["services"]["redis"]
    command = " ".join(redis["command"])
    assert "--appendonly yes" in command and "--maxmemory-policy noeviction" in command
    assert redis["healthcheck"]["test"][-1] == "ping"
    assert "redis-data:/data" in redis["volumes"]


def test_gc_runs_in_a_loop_after_the_migrations(compose):
    gc = compose["services"]["gc"]
    assert gc["command"][-2:] == ["gc", "--loop"]
    assert gc["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert gc["restart"] == "unless-stopped"


def test_migrations_run_once_before_the_web_app(compose):
    services = compose["services"]
    assert services["migrate"]["command"][-2:] == ["db", "upgrade"] and services["migrate"]["restart"] == "no"
    assert services["web"]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"


def test_each_gpu_worker_reserves_its_own_gpu(compose):
    workers = {name: service for name, service in compose["services"].items() if name.startswith("worker-gpu")}
    assert len(workers) >= 2
    reserved = []
    for name, service in workers.items():
        devices = service["deploy"]["resources"]["reservations"]["devices"]
        assert devices[0]["driver"] == "nvidia" and devices[0]["capabilities"] == ["gpu"]
        assert name == f"worker-gpu{devices[0]['device_ids'][0]}"
        assert service["command"] == ["chattts-farm", "worker", "--gpus", "0"]
        reserved += devices[0]["device_ids"]
    assert len(reserved) == len(set(reserved))


def test_named_volumes_hold_every_piece_of_state(compose):
    assert set(compose["volumes"]) == {
        "redis-data",
        "postgres-data",
        "farm-data",
        "huggingface-cache",
        "prometheus-data",
        "grafana-data",
    }
    assert "farm-data:/data" in compose["services"]["web"]["volumes"]


def test_flower_takes_its_basic_auth_from_the_environment(compose):
    flower = compose["services"]["flower"]
    assert flower["command"][:2] == ["chattts-farm", "flower"] and flower["env_file"] == ".env"
    assert "CHATTTS_FARM_FLOWER_AUTH=" in (ROOT / ".env.example").read_text()


def test_the_served_farm_requires_api_keys(compose):
    web = compose["services"]["web"]
    assert web["environment"]["CHATTTS_FARM_REQUIRE_API_KEY"] == "true"


def test_the_web_runs_several_gunicorn_workers_and_can_trust_a_tls_proxy(compose):
    command = compose["services"]["web"]["command"]
    assert command[:2] == ["chattts-farm", "web"] and int(command[command.index("--workers") + 1]) >= 2
    assert "CHATTTS_FARM_TRUST_PROXY=0\n" in (ROOT / ".env.example").read_text()


DATABASE_USERS = ("migrate", "web", "reconciler")


def test_the_web_database_is_postgresql_with_a_password_a_volume_and_a_health_check(compose):
    postgres = compose["services"]["postgres"]
    assert postgres["image"].startswith("postgres:")
    assert postgres["environment"]["POSTGRES_PASSWORD"].startswith("${CHATTTS_FARM_POSTGRES_PASSWORD:?")
    assert "CHATTTS_FARM_POSTGRES_PASSWORD=\n" in (ROOT / ".env.example").read_text()
    assert "postgres-data:/var/lib/postgresql/data" in postgres["volumes"]
    assert postgres["healthcheck"]["test"][1] == "pg_isready"
    assert postgres["networks"] == ["queue"] and "ports" not in postgres


def test_every_part_that_uses_the_database_points_at_postgresql_once_it_is_healthy(compose):
    postgres = compose["services"]["postgres"]["environment"]
    user, database = postgres["POSTGRES_USER"], postgres["POSTGRES_DB"]
    for name in DATABASE_USERS:
        service = compose["services"][name]
        url = service["environment"]["CHATTTS_FARM_DATABASE_URL"]
        assert url.startswith(f"postgresql+psycopg://{user}:${{CHATTTS_FARM_POSTGRES_PASSWORD:?"), name
        assert url.endswith(f"@postgres:5432/{database}"), name
        assert service["depends_on"]["postgres"]["condition"] == "service_healthy", name
    for name in ("web", "reconciler"):
        assert compose["services"][name]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"


def test_the_monitoring_profile_runs_prometheus_and_grafana_provisioned_from_the_repository(compose):
    services = compose["services"]
    assert all(services[name]["profiles"] == ["monitoring"] for name in MONITORING)
    assert not any("profiles" in service for name, service in services.items() if name not in MONITORING)
    for name in MONITORING:
        for volume in services[name]["volumes"]:
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (ROOT / source).exists(), f"{name} mounts {source}, which the repository lacks"
    grafana = services["grafana"]
    assert grafana["environment"]["GF_SECURITY_ADMIN_PASSWORD"].startswith("${CHATTTS_FARM_GRAFANA_PASSWORD:?")
    assert "CHATTTS_FARM_GRAFANA_PASSWORD=\n" in (ROOT / ".env.example").read_text()
    assert services["prometheus"]["ports"] == ["127.0.0.1:9090:9090"]  # no login: the host's loopback only
