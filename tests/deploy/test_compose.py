"""docker/compose.yaml: valid under the Compose Specification, and in line with the code.

The schema is the Compose Specification's JSON schema as check-jsonschema ships it (its
``vendor.compose-spec``, taken from github.com/compose-spec/compose-spec, schema/compose-spec.json;
check-jsonschema's version is pinned in requirements/lock.txt): no network, no Docker needed.
Where a compose implementation is installed (the Docker CLI's plugin, or Debian's docker-compose),
its ``config`` must accept the file too: it needs no Docker daemon.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from core.settings import FrontendSettings, Settings, WorkerSettings
from tests.deploy.checks import (
    ROOT,
    is_setting,
    parse_sluice,
    redis_bytes,
    redis_options,
    settings_from,
    sluice_argv,
)

COMPOSE = ROOT / "docker" / "compose.yaml"
DOCKERFILE = ROOT / "docker" / "Dockerfile"
SLUICE_SERVICES = ("migrate", "frontend", "worker-mocker", "worker-vllm", "bookkeeper", "flower")
WORKERS = ("worker-mocker", "worker-vllm")
#: ``${NAME}``, ``${NAME:-default}``, ``${NAME-default}``, ``${NAME:?error}``; ``$$`` is a literal ``$``.
_VARIABLE = re.compile(r"\$\$|\$\{(\w+)(?:(:?[-?])([^}]*))?\}")


def interpolate(text: str, env: dict[str, str]) -> str:
    """What compose makes of the string ``text`` with variables ``env`` (the subset of its
    interpolation that compose.yaml uses; a required variable that is missing raises KeyError)."""

    def value(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name, op, arg = match.groups()
        got = env.get(name)
        if op in (":-", "-"):
            return got if got or (op == "-" and got is not None) else arg
        if op in (":?", "?") and not got:
            raise KeyError(f"{name}: {arg}")
        return got or ""

    return _VARIABLE.sub(value, text)


def _interpolated(node: Any, env: dict[str, str]) -> Any:
    if isinstance(node, dict):
        return {k: _interpolated(v, env) for k, v in node.items()}
    if isinstance(node, list):
        return [_interpolated(v, env) for v in node]
    return interpolate(node, env) if isinstance(node, str) else node


def load(env: dict[str, str] | None = None) -> dict[str, Any]:
    """compose.yaml as compose reads it: parsed, then every string value interpolated."""
    return _interpolated(yaml.safe_load(COMPOSE.read_text()), env or {})


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    """compose.yaml as compose runs it with no variable set (every default in force)."""
    return load()


def test_valid_under_the_compose_specification(tmp_path: Path) -> None:
    interpolated = tmp_path / "compose.yaml"
    interpolated.write_text(yaml.safe_dump(load()))
    for path in (COMPOSE, interpolated):
        run = subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec",
                              str(path)], capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, run.stdout + run.stderr


def test_the_schema_check_refuses_a_misspelt_field(tmp_path: Path) -> None:
    """The check is strict: a field the specification does not have fails it."""
    broken = tmp_path / "compose.yaml"
    broken.write_text(COMPOSE.read_text().replace("stop_grace_period: 40s", "stop_grace_perod: 40s", 1))
    run = subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec",
                          str(broken)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 1 and "stop_grace_perod" in run.stdout


def _compose_command() -> list[str] | None:
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True, timeout=30).returncode == 0:
        return [docker, "compose"]
    if docker_compose := shutil.which("docker-compose"):
        return [docker_compose]
    return None


def test_compose_itself_accepts_it() -> None:
    command = _compose_command()
    if command is None:
        pytest.skip("no compose implementation installed (docker compose, docker-compose): the schema check stands alone")
    run = subprocess.run([*command, "-f", str(COMPOSE), "--profile", "mocker", "--profile", "vllm", "config", "-q"],
                         capture_output=True, text=True, timeout=60, cwd=COMPOSE.parent,
                         env={"PATH": "/usr/bin:/bin", "HOME": str(Path.home())})
    assert run.returncode == 0, run.stdout + run.stderr


def test_every_process_of_the_stack_is_there(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert {"redis", "postgres", "migrate", "frontend", "bookkeeper", "flower", "prometheus", "grafana"} <= set(services)
    workers = {name: s for name, s in services.items() if sluice_argv(s.get("command", [])) == ["worker"]}
    assert {tuple(s["profiles"]) for s in workers.values()} == {("mocker",), ("vllm",)}
    engines = {s["environment"]["SLUICE_WORKER__ENGINE"] for s in workers.values()}
    assert engines == {"mocker", "vllm"}
    assert services["worker-vllm"]["build"]["target"] == "vllm"
    gpus = services["worker-vllm"]["deploy"]["resources"]["reservations"]["devices"]
    assert gpus == [{"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}]


def test_sluice_commands_parse(compose: dict[str, Any]) -> None:
    for name in SLUICE_SERVICES:
        argv = sluice_argv(compose["services"][name]["command"])
        assert argv is not None, name
        parse_sluice(argv)
    assert sluice_argv(compose["services"]["migrate"]["command"]) == ["db", "upgrade"]
    assert sluice_argv(compose["services"]["bookkeeper"]["command"]) == ["bookkeeper"]


def test_sluice_variables_are_settings_with_valid_values(compose: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    for name in SLUICE_SERVICES:
        env = {k: str(v) for k, v in compose["services"][name]["environment"].items()}
        sluice = {k: v for k, v in env.items() if k.startswith("SLUICE_")}
        assert [k for k in sluice if not is_setting(k)] == [], name
        settings = settings_from(sluice, monkeypatch)
        assert settings.redis.url == "redis://redis:6379/0"
        assert settings.database_url and settings.database_url.startswith("postgresql+psycopg2://sluice:")
        assert "@postgres:5432/sluice" in settings.database_url


def test_the_database_is_migrated_before_any_sluice_process_starts(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert services["migrate"]["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    for name in SLUICE_SERVICES:
        if name in ("migrate", "flower"):  # Flower needs no database
            continue
        assert services[name]["depends_on"]["migrate"] == {"condition": "service_completed_successfully"}, name
        assert services[name]["depends_on"]["redis"] == {"condition": "service_healthy"}, name
    password = services["postgres"]["environment"]["POSTGRES_PASSWORD"]
    assert f"sluice:{password}@" in services["frontend"]["environment"]["SLUICE_DATABASE_URL"]


def test_frontend_health_is_ready(compose: dict[str, Any]) -> None:
    check = " ".join(compose["services"]["frontend"]["healthcheck"]["test"])
    assert "http://127.0.0.1:8000/ready" in check


def test_grace_periods_cover_the_drains(compose: dict[str, Any]) -> None:
    seconds = {name: int(s["stop_grace_period"].removesuffix("s")) for name, s in compose["services"].items()
               if "stop_grace_period" in s}
    assert seconds["frontend"] >= FrontendSettings().drain_timeout_s + 5
    assert seconds["worker-mocker"] >= WorkerSettings().drain_timeout_s + 10
    assert seconds["worker-vllm"] >= WorkerSettings().drain_timeout_s + 10


def test_published_on_loopback_unless_asked(compose: dict[str, Any]) -> None:
    published = {name: s["ports"] for name, s in compose["services"].items() if "ports" in s}
    assert set(published) == {"frontend", "flower", "prometheus", "grafana"}
    for name, ports in published.items():
        assert all(str(p).startswith("127.0.0.1:") for p in ports), name
    # Published further, Flower is told so (docker/flower.sh then requires a password).
    flower = load({"SLUICE_FLOWER_PUBLISH": "5555"})["services"]["flower"]
    assert flower["ports"] == ["5555:5555"] and flower["environment"]["PUBLISHED_ON"] == "5555"
    assert "FLOWER_BASIC_AUTH" in flower["environment"]


def test_prometheus_scrapes_the_services_on_their_ports(compose: dict[str, Any]) -> None:
    prometheus = compose["services"]["prometheus"]
    (config_mount,) = [v for v in prometheus["volumes"] if v.endswith(":/etc/prometheus/prometheus.yml:ro")]
    config = yaml.safe_load((COMPOSE.parent / config_mount.split(":")[0]).read_text())
    targets = {(name, sd["port"]) for job in config["scrape_configs"] for sd in job.get("dns_sd_configs", ())
               for name in sd["names"]}
    assert targets == {("frontend", 8000), ("flower", 5555)}
    assert set(name for name, _ in targets) <= set(compose["services"])
    # The workers come from the frontend's discovery, which lists them at the container's address.
    (workers,) = [job for job in config["scrape_configs"] if "http_sd_configs" in job]
    assert [sd["url"] for sd in workers["http_sd_configs"]] == ["http://frontend:8000/prometheus/targets"]
    assert workers["relabel_configs"] == [{"source_labels": ["component"], "regex": "worker", "action": "keep"}]
    for name in ("worker-mocker", "worker-vllm"):
        assert compose["services"][name]["environment"]["SLUICE_WORKER__METRICS_HOST"] == "0.0.0.0"
    # The rules file is mounted where the config names it.
    (rules_mount,) = [v for v in prometheus["volumes"] if v.endswith(":/etc/prometheus/rules.yml:ro")]
    assert config["rule_files"] == ["/etc/prometheus/rules.yml"]
    assert (COMPOSE.parent / rules_mount.split(":")[0]).is_file()


def test_grafana_is_provisioned_with_prometheus_and_the_dashboards_folder(compose: dict[str, Any]) -> None:
    mounts = dict(v.removesuffix(":ro").split(":", 1) for v in compose["services"]["grafana"]["volumes"]
                  if v.startswith("./"))
    provisioning = COMPOSE.parent / "grafana" / "provisioning"
    assert mounts["./grafana/provisioning"] == "/etc/grafana/provisioning"
    (source,) = yaml.safe_load((provisioning / "datasources" / "prometheus.yaml").read_text())["datasources"]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"
    assert "127.0.0.1:9090:9090" in compose["services"]["prometheus"]["ports"]
    (provider,) = yaml.safe_load((provisioning / "dashboards" / "sluice.yaml").read_text())["providers"]
    assert provider["type"] == "file" and provider["options"]["path"] == mounts["./grafana"]


def _worker_settings(compose: dict[str, Any], name: str, monkeypatch: pytest.MonkeyPatch) -> Settings:
    env = {k: str(v) for k, v in compose["services"][name]["environment"].items() if k.startswith("SLUICE_")}
    return settings_from(env, monkeypatch)


def test_the_shared_kv_tier_is_a_bounded_cache_of_its_own(compose: dict[str, Any],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    kv_redis = compose["services"]["kv-redis"]
    options = redis_options(kv_redis["command"])
    assert redis_bytes(options["maxmemory"]) > 0 and options["maxmemory-policy"] == "allkeys-lru"
    assert (options["save"], options["appendonly"]) == ("", "no")
    assert "ports" not in kv_redis
    for name in WORKERS:
        settings = _worker_settings(compose, name, monkeypatch)
        assert settings.kvbm.redis_url == "redis://kv-redis:6379/0"
        assert settings.redis.url != settings.kvbm.redis_url, "apart from the request plane"
        # Started with the workers, not awaited: a shared tier that does not answer costs recomputes.
        assert compose["services"][name]["depends_on"]["kv-redis"] == {"condition": "service_started"}


def test_workers_keep_host_and_disk_tiers_on_a_volume_of_their_own(compose: dict[str, Any],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    for name in WORKERS:
        kvbm = _worker_settings(compose, name, monkeypatch).kvbm
        assert kvbm.host_bytes > 0 and kvbm.disk_on
        # A bare container path: an anonymous volume, each container's own (a named one, "name:/path",
        # would be shared by every replica of --scale), kept across restarts and recreations.
        assert str(kvbm.disk_dir) in compose["services"][name]["volumes"]
    assert not [v for v in compose["volumes"] if "kv" in v]
    off = load({"SLUICE_KVBM_HOST_BYTES": "0", "SLUICE_KVBM_DISK_BYTES": "0"})
    kvbm = _worker_settings(off, "worker-mocker", monkeypatch).kvbm
    assert kvbm.host_bytes == 0 and not kvbm.disk_on


def test_the_image_makes_the_disk_tier_directory_for_its_user(compose: dict[str, Any],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Docker fills a new volume from the image's directory, owner included: one the image lacks is
    created for root, and the worker (user 10001) could not write its disk tier."""
    dockerfile = DOCKERFILE.read_text()
    assert "USER 10001:10001" in dockerfile and "useradd --create-home --uid 10001 --gid 10001 sluice" in dockerfile
    made = [line for line in dockerfile.replace("\\\n", " ").splitlines() if "install -d -o sluice -g sluice" in line]
    owned = {word for line in made for word in line.split("install -d -o sluice -g sluice", 1)[1].split()}
    for name in WORKERS:
        assert str(_worker_settings(compose, name, monkeypatch).kvbm.disk_dir) in owned
