"""deploy/compose/compose.yaml: valid Compose, every Cellar command line accepted, and the
ports, secrets and volumes consistent with each other and with Prometheus's targets.

The schema is the Compose Specification's own (tests/deploy/schemas/compose-spec.json, see the
README beside it). Variables are interpolated from deploy/compose/.env first, as compose does.
Every master and node command runs for real as `cellar ... --print-config` with the service's
environment, so a flag or `CELLAR_*` variable the code does not know fails here.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from deploykit import DEPLOY, ROOT, print_config

from cellar.cli import SUBCOMMANDS
from cellar.units import parse_size_bytes

COMPOSE_DIR = DEPLOY / "compose"
SCHEMA = Path(__file__).parent / "schemas" / "compose-spec.json"
_VAR = re.compile(r"\$\{([A-Z0-9_]+)(?::?-([^}]*))?\}")


def dotenv() -> dict[str, str]:
    values = {}
    for line in (COMPOSE_DIR / ".env").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            name, _, value = line.partition("=")
            values[name.strip()] = value.strip()
    return values


def interpolate(value: Any, env: dict[str, str]) -> Any:
    if isinstance(value, str):
        def sub(match: re.Match[str]) -> str:
            name, default = match.group(1), match.group(2)
            if name in env:
                return env[name]
            assert default is not None, f"${{{name}}} has no value in .env and no default"
            return default
        return _VAR.sub(sub, value)
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    return value


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    """compose.yaml with compose.override.yaml (its published ports) merged in, as compose does."""
    raw = yaml.safe_load((COMPOSE_DIR / "compose.yaml").read_text())
    override = yaml.safe_load((COMPOSE_DIR / "compose.override.yaml").read_text())
    for name, extra in override["services"].items():
        assert set(extra) == {"ports"}, f"compose.override.yaml: {name} sets more than ports"
        raw["services"][name]["ports"] = raw["services"][name].get("ports", []) + extra["ports"]
    return interpolate(raw, dotenv())


def cellar_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: svc for name, svc in compose["services"].items()
            if str(svc.get("image", "")).startswith("cellar:")}


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_compose_file_validates_against_the_compose_spec_schema(compose: dict[str, Any]) -> None:
    schema = json.loads(SCHEMA.read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(compose), key=str)
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors)


def test_schema_rejects_a_broken_file(compose: dict[str, Any]) -> None:
    """The check above can fail: a misspelt service key is caught."""
    schema = json.loads(SCHEMA.read_text())
    broken = json.loads(json.dumps(compose))
    broken["services"]["master-0"]["comand"] = ["master"]
    assert list(jsonschema.Draft7Validator(schema).iter_errors(broken))


def test_cluster_shape(compose: dict[str, Any]) -> None:
    services = cellar_services(compose)
    masters = [n for n, s in services.items() if s["command"][0] == "master"]
    nodes = [n for n, s in services.items() if s["command"][0] == "node"]
    assert len(masters) == 2 and len(nodes) == 3
    assert {"etcd", "prometheus", "grafana"} <= set(compose["services"])
    for name in masters:
        argv = services[name]["command"]
        assert flag(argv, "--master-id") == name
        assert flag(argv, "--advertise") == f"{name}:{flag(argv, '--listen').rsplit(':', 1)[1]}"
    for name in nodes:
        svc = services[name]
        argv = svc["command"]
        assert flag(argv, "--node-id") == name and flag(argv, "--advertise-host") == name
        assert svc["ulimits"]["memlock"] == {"soft": -1, "hard": -1}
        assert svc["shm_size"]


@pytest.mark.parametrize("service", ["master-0", "master-1", "node-0", "node-1", "node-2"])
def test_every_cellar_command_line_parses_with_the_compose_environment(
        compose: dict[str, Any], service: str, tmp_path: Path) -> None:
    svc = compose["services"][service]
    # the service's volume mount points exist in its container: make them under tmp_path
    mounts = {}
    for volume in svc.get("volumes", []):
        target = volume.split(":")[1]
        mounts[target] = str(tmp_path / target.lstrip("/"))
        Path(mounts[target]).mkdir(parents=True)

    def in_container(text: str) -> str:
        for target, local in mounts.items():
            text = text.replace(target, local)
        return text

    env = {k: in_container(str(v)) for k, v in svc.get("environment", {}).items()
           if k.startswith("CELLAR_") and k != "CELLAR_HEALTH_URL"}
    argv = [in_container(a) for a in svc["command"]]
    settings = print_config(argv, env)
    if argv[0] == "master":
        assert settings["etcd"] == "etcd:2379" and settings["master_id"] == service
        assert settings["cluster_secret_file"] == "/run/secrets/cluster_secret"
        if "tokens_file" in settings:  # the authentication work (tokens) is in this tree
            assert settings["tokens_file"] == "/run/secrets/cellar_tokens"
    else:
        assert settings["node_id"] == service
        assert settings["master"] == "etcd://etcd:2379/cellar"
        assert settings["keep_segments_on_exit"] == "True"
        assert settings["shm_dir"] == mounts[svc["volumes"][0].split(":")[1]]
        assert settings["segment_size_bytes"].startswith(dotenv()["CELLAR_SEGMENT_SIZE"])


def test_tools_service_runs_a_cellar_command(compose: dict[str, Any]) -> None:
    assert compose["services"]["tools"]["command"][0] in SUBCOMMANDS


def test_secrets_volumes_and_ports_are_consistent(compose: dict[str, Any]) -> None:
    declared_secrets = set(compose["secrets"])
    gitignored = (COMPOSE_DIR / "secrets" / ".gitignore").read_text().split()
    for name, spec in compose["secrets"].items():
        path = spec["file"]
        assert path.startswith("./secrets/") and Path(path).name in gitignored, name
    declared_volumes = set(compose["volumes"])
    host_ports: list[str] = []
    node_volumes: list[str] = []
    for name, svc in compose["services"].items():
        used = set(svc.get("secrets", []))
        assert used <= declared_secrets, name
        for key, value in svc.get("environment", {}).items():
            if str(value).startswith("/run/secrets/"):
                assert str(value).removeprefix("/run/secrets/") in used, f"{name} {key}"
        for entry in svc.get("env_file", []):
            path = entry["path"] if isinstance(entry, dict) else entry
            assert Path(path).name in gitignored, f"{name}: env file {path} is not git-ignored"
        for volume in svc.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (COMPOSE_DIR / source).resolve().exists(), f"{name}: {source} is missing"
            else:
                assert source in declared_volumes, f"{name}: volume {source} not declared"
                if svc.get("command", [""])[0] == "node":
                    node_volumes.append(source)
        host_ports += [p.split(":")[0] for p in svc.get("ports", [])]
        health = svc.get("environment", {}).get("CELLAR_HEALTH_URL")
        if health:
            assert f":{flag(svc['command'], '--http').rsplit(':', 1)[1]}/health" in health, name
    assert len(host_ports) == len(set(host_ports)), f"a host port is published twice: {host_ports}"
    assert len(node_volumes) == 3 == len(set(node_volumes)), "each node needs its own segment volume"
    assert parse_size_bytes(dotenv()["CELLAR_SEGMENT_SIZE"]) > 0
    for volume in node_volumes:
        # a tmpfs volume is unmounted with its last container: a restarted node would find no
        # segment to re-attach (test_compose_cluster.py restarts one for real)
        opts = (compose["volumes"][volume] or {}).get("driver_opts", {})
        assert opts.get("type") != "tmpfs", f"{volume}: a tmpfs volume does not outlive a restart"


def test_prometheus_scrapes_every_cellar_http_port(compose: dict[str, Any]) -> None:
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    targets = {t for job in config["scrape_configs"] if job["job_name"] != "cellar-client"
               for sc in job["static_configs"] for t in sc["targets"]}
    expected = {f"{name}:{flag(svc['command'], '--http').rsplit(':', 1)[1]}"
                for name, svc in cellar_services(compose).items() if "--http" in svc["command"]}
    assert targets == expected


def test_grafana_provisioning_points_at_the_compose_prometheus(compose: dict[str, Any]) -> None:
    ds = yaml.safe_load((DEPLOY / "grafana/provisioning/datasources/cellar.yaml").read_text())
    url = ds["datasources"][0]["url"]
    assert url == "http://prometheus:9090" and "prometheus" in compose["services"]
    mounts = compose["services"]["grafana"]["volumes"]
    dash_mount = next(m for m in mounts if m.startswith("../grafana/cellar.json"))
    provider = yaml.safe_load((DEPLOY / "grafana/provisioning/dashboards/cellar.yaml").read_text())
    assert dash_mount.split(":")[1].startswith(provider["providers"][0]["options"]["path"])
    assert (ROOT / "deploy/grafana/cellar.json").exists()
