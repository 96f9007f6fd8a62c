"""The compose files beside compose.yaml: compose.override.yaml (the published ports, read by
default), compose.loopback.yaml (every service on the host network, on 127.0.0.1; what
test_compose_cluster.py runs for real), with prometheus-loopback.yml, and compose.tls.yaml (TLS
on every Cellar port), with prometheus-tls.yml and prometheus-loopback-tls.yml.

Checked offline: the Compose Specification schema, the loopback addresses against each other and
against Prometheus's targets, and Debian's docker-compose 1.29 accepting both combinations
(`config` needs no engine). The rules that keep one set of files valid for Compose v1 and v2
are docs/compose.md's table; the ones a file could break silently are asserted here.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from deploykit import DEPLOY, print_config, require_tool

COMPOSE_DIR = DEPLOY / "compose"
SERVICE_ADDRESS = re.compile(r"(?<![\w/.-])(etcd|master-\d|node-\d|prometheus):\d")
SCHEMA = Path(__file__).parent / "schemas" / "compose-spec.json"


def load(name: str) -> dict[str, Any]:
    return yaml.safe_load((COMPOSE_DIR / name).read_text())


@pytest.mark.parametrize("name", ["compose.override.yaml", "compose.loopback.yaml",
                                  "compose.tls.yaml"])
def test_override_files_validate_against_the_compose_spec_schema(name: str) -> None:
    validator = jsonschema.Draft7Validator(json.loads(SCHEMA.read_text()))
    errors = sorted(validator.iter_errors(load(name)), key=str)
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors)


def test_only_the_default_override_publishes_ports() -> None:
    """Compose 1.29 refuses published ports beside host networking and cannot drop them in an
    override, so compose.yaml publishes nothing and the loopback variant replaces the file that
    does; and a `name:` key or an env_file in its long form breaks 1.29 outright."""
    base = load("compose.yaml")
    assert "name" not in base
    for name, svc in base["services"].items():
        assert "ports" not in svc, f"{name}: publish ports in compose.override.yaml"
        assert all(isinstance(e, str) for e in svc.get("env_file", [])), f"{name}: env_file"
    assert "ports" not in json.dumps(load("compose.loopback.yaml"))
    assert "COMPOSE_PROJECT_NAME=cellar" in (COMPOSE_DIR / ".env").read_text().split()


def test_loopback_puts_every_service_on_the_host_network_bound_to_127_0_0_1() -> None:
    base, loopback = load("compose.yaml"), load("compose.loopback.yaml")["services"]
    for name in base["services"]:
        svc = loopback.get(name, {})
        if svc.get("profiles") == ["grafana"]:
            continue  # left out of this variant (its data source names prometheus:9090)
        assert svc.get("network_mode") == "host", name
        text = json.dumps([svc.get("command", []), svc.get("environment", {})])
        # no wildcard bind and no compose-network host name (etcd:2379, master-0:50051, ...)
        assert "0.0.0.0" not in text and not SERVICE_ADDRESS.search(text), f"{name}: {text}"
    listens = []
    for name, svc in loopback.items():
        argv = svc.get("command", [])
        for flag in ("--listen", "--http"):
            if flag in argv:
                listens.append(argv[argv.index(flag) + 1])
        if "--fast-port" in argv:
            listens.append(f"127.0.0.1:{argv[argv.index('--fast-port') + 1]}")
        health = svc.get("environment", {}).get("CELLAR_HEALTH_URL")
        if health:
            assert health == f"http://{argv[argv.index('--http') + 1]}/health", name
    assert all(a.startswith("127.0.0.1:") for a in listens), listens
    assert len(listens) == len(set(listens)), f"a port is bound twice on the host: {listens}"
    host_ids = [svc["environment"]["CELLAR_NODE_HOST_ID"] for svc in loopback.values()
                if svc.get("command", [""])[0] == "node"]
    assert len(host_ids) == 3 == len(set(host_ids)), "nodes sharing a host id would offer shm"


def test_loopback_prometheus_scrapes_the_loopback_http_ports_with_the_same_jobs() -> None:
    loopback = load("compose.loopback.yaml")["services"]
    mounted = [v for v in loopback["prometheus"]["volumes"] if v.endswith(":/etc/prometheus/prometheus.yml:ro")]
    assert mounted == ["../prometheus/prometheus-loopback.yml:/etc/prometheus/prometheus.yml:ro"]
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus-loopback.yml").read_text())
    original = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    strip = [{k: v for k, v in job.items() if k != "static_configs"} for job in config["scrape_configs"]]
    assert strip == [{k: v for k, v in job.items() if k != "static_configs"}
                     for job in original["scrape_configs"]]
    assert {k: v for k, v in config.items() if k != "scrape_configs"} == \
        {k: v for k, v in original.items() if k != "scrape_configs"}
    targets = {t for job in config["scrape_configs"] if job["job_name"] != "cellar-client"
               for sc in job["static_configs"] for t in sc["targets"]}
    http = {svc["command"][svc["command"].index("--http") + 1] for svc in loopback.values()
            if "--http" in svc.get("command", [])}
    assert targets == http


@pytest.mark.parametrize("plain, tls", [("prometheus.yml", "prometheus-tls.yml"),
                                        ("prometheus-loopback.yml", "prometheus-loopback-tls.yml")])
def test_tls_prometheus_configs_are_the_plain_ones_scraping_https(plain: str, tls: str) -> None:
    """The same jobs, targets and rules; the masters' and nodes' jobs over https with the
    cluster's CA (the compose secret compose.tls.yaml gives Prometheus)."""
    original = yaml.safe_load((DEPLOY / "prometheus" / plain).read_text())
    config = yaml.safe_load((DEPLOY / "prometheus" / tls).read_text())
    assert {k: v for k, v in config.items() if k != "scrape_configs"} == \
        {k: v for k, v in original.items() if k != "scrape_configs"}
    for job, before in zip(config["scrape_configs"], original["scrape_configs"], strict=True):
        cellar_port = job["job_name"] in ("cellar-master", "cellar-node")
        https = {"scheme": "https", "tls_config": {"ca_file": "/run/secrets/tls_ca"}}
        assert job == ({**before, **https} if cellar_port else before), job["job_name"]
    services = load("compose.tls.yaml")["services"]
    assert "tls_ca" in services["prometheus"]["secrets"]
    assert services["prometheus"]["volumes"] == [
        "${CELLAR_PROMETHEUS_TLS_CONFIG:-../prometheus/prometheus-tls.yml}:"
        "/etc/prometheus/prometheus.yml:ro"]


@pytest.mark.parametrize("service", ["master-0", "node-1"])
def test_tls_override_turns_tls_on_for_every_port_of_the_process(service: str, tmp_path: Path) -> None:
    """The merged settings of a master and a node (`docker-compose config` of compose.yaml and
    compose.tls.yaml) run through `cellar <master|node> --print-config` with the secrets of a
    real `cellar tls create`: certificate, key, HTTP over TLS and the CA all set."""
    tool = require_tool("docker-compose")
    tls_dir = tmp_path / "tls"
    made = subprocess.run([sys.executable, "-m", "cellar", "tls", "create", "--dir", str(tls_dir),
                           "master-0"], capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    proc = subprocess.run([tool, "-f", "compose.yaml", "-f", "compose.tls.yaml", "config"],
                          cwd=COMPOSE_DIR, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "CELLAR_TLS_DIR": str(tls_dir)})
    assert proc.returncode == 0, proc.stderr
    merged = yaml.safe_load(proc.stdout)
    svc = merged["services"][service]
    secrets = {entry["source"] if isinstance(entry, dict) else entry for entry in svc["secrets"]}
    assert {"tls_cert", "tls_key", "tls_ca", "cluster_secret"} <= secrets
    assert merged["secrets"]["tls_key"]["file"] == str(tls_dir / "tls.key")
    files = {"/run/secrets/tls_cert": tls_dir / "tls.crt", "/run/secrets/tls_key": tls_dir / "tls.key",
             "/run/secrets/tls_ca": tls_dir / "ca.crt"}
    env = {k: str(files.get(str(v), v)) for k, v in svc["environment"].items()
           if k.startswith("CELLAR_") and k not in ("CELLAR_HEALTH_URL",)}
    env = {k: v for k, v in env.items() if not v.startswith("/run/secrets/")}  # the others' secrets
    argv = [a for a in svc["command"]]
    if argv[0] == "node":
        shm = tmp_path / "segments"
        shm.mkdir()
        env["CELLAR_NODE_SHM_DIR"] = str(shm)
    settings = print_config(argv, env)
    assert settings["tls_cert_file"] == str(tls_dir / "tls.crt")
    assert settings["tls_key_file"] == str(tls_dir / "tls.key")
    assert settings["http_tls"] == "True"
    assert env["CELLAR_TLS_CA"] == str(tls_dir / "ca.crt")
    # etcd over TLS with the same certificate as the client's (coord/etcd_tls.py)
    assert (env["CELLAR_ETCD_CA_FILE"], env["CELLAR_ETCD_CERT_FILE"], env["CELLAR_ETCD_KEY_FILE"]) \
        == (str(tls_dir / "ca.crt"), str(tls_dir / "tls.crt"), str(tls_dir / "tls.key"))


@pytest.mark.parametrize("files, host", [
    (["compose.yaml", "compose.tls.yaml"], "0.0.0.0"),
    (["compose.yaml", "compose.loopback.yaml", "compose.tls.yaml", "compose.loopback-tls.yaml"],
     "127.0.0.1")], ids=["bridge", "loopback"])
def test_tls_override_makes_etcd_serve_tls_to_certificate_holders(files: list[str], host: str,
                                                                  tmp_path: Path) -> None:
    """The merged etcd service (`docker-compose config`): client URLs over https on the
    variant's address only, the certificate and CA of the compose secrets, clients asked for a
    certificate; the tools container holds one. test_compose_cluster.py runs it for real."""
    tool = require_tool("docker-compose")
    proc = subprocess.run([tool, *[a for f in files for a in ("-f", f)], "config"],
                          cwd=COMPOSE_DIR, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "CELLAR_TLS_DIR": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    services = yaml.safe_load(proc.stdout)["services"]
    command = services["etcd"]["command"]
    assert f"--listen-client-urls=https://{host}:2379" in command
    assert not any(a.startswith("--listen-client-urls=http:") for a in command)
    assert {"--client-cert-auth", "--cert-file=/run/secrets/tls_cert",
            "--key-file=/run/secrets/tls_key", "--trusted-ca-file=/run/secrets/tls_ca"} <= set(command)
    secrets = {e["source"] if isinstance(e, dict) else e for e in services["etcd"]["secrets"]}
    assert {"tls_cert", "tls_key", "tls_ca"} <= secrets
    assert services["tools"]["environment"]["CELLAR_ETCD_CERT_FILE"] == "/run/secrets/tls_cert"


@pytest.mark.parametrize("files", [[], ["compose.yaml", "compose.loopback.yaml"],
                                   ["compose.yaml", "compose.loopback.yaml", "compose.tls.yaml",
                                    "compose.loopback-tls.yaml"]],
                         ids=["default", "loopback", "loopback-tls"])
def test_docker_compose_1_29_accepts_the_files(files: list[str]) -> None:
    tool = require_tool("docker-compose")
    argv = [tool, *[a for f in files for a in ("-f", f)], "config", "--services"]
    proc = subprocess.run(argv, cwd=COMPOSE_DIR, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert {"etcd", "master-0", "master-1", "node-0", "node-1", "node-2", "prometheus"} <= \
        set(proc.stdout.split())
