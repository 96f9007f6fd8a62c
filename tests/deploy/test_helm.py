"""deploy/helm/cellar: rendered with the Helm v4 SDK for Python (helm-python-sdk, no helm binary),
linted, every manifest validated offline against the Kubernetes schemas (kubernetes-validate),
for the default values, deploy/helm/values-ha-hugepages.yaml (a disk tier on a PVC) and
deploy/helm/values-disk-hostpath.yaml (a disk tier on a hostPath); then the masters' and
nodes' container args (with their env, $(VAR) expanded as the kubelet does) run through
`cellar master|node --print-config` for real, so every flag the chart passes exists.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml
from deploykit import DEPLOY, print_config

CHART = DEPLOY / "helm" / "cellar"
K8S_VERSION = "1.31.0"
VALUE_SETS = {"default": None, "ha-hugepages": DEPLOY / "helm" / "values-ha-hugepages.yaml",
              "disk-hostpath": DEPLOY / "helm" / "values-disk-hostpath.yaml"}
FAKE_FIELDS = {"metadata.name": "cellar-node-0", "metadata.namespace": "kv",
               "status.podIP": "10.1.2.3"}


def values_of(name: str) -> dict[str, Any] | None:
    path = VALUE_SETS[name]
    return None if path is None else yaml.safe_load(path.read_text())


def render(name: str) -> list[dict[str, Any]]:
    chart = helm.Chart.load(str(CHART))
    out = chart.render(values_of(name), name="cellar", namespace="kv", is_install=True)
    docs = []
    for template, text in sorted(out.items()):
        if template.endswith("NOTES.txt"):
            assert "etcd://" in text
            continue
        docs += [d for d in yaml.safe_load_all(text) if d]
    return docs


@pytest.fixture(scope="module", params=sorted(VALUE_SETS))
def rendered(request: pytest.FixtureRequest) -> tuple[str, list[dict[str, Any]]]:
    return request.param, render(request.param)


def kind(docs: list[dict[str, Any]], k: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == k]


def one(docs: list[dict[str, Any]], k: str, suffix: str) -> dict[str, Any]:
    found = [d for d in kind(docs, k) if d["metadata"]["name"].endswith(suffix)]
    assert len(found) == 1, f"{k} *{suffix}: {len(found)}"
    return found[0]


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_chart_lints_clean(name: str) -> None:
    report = helm.lint(str(CHART), values_of(name), strict=True, kube_version=f"v{K8S_VERSION}")
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_etcd_subchart_is_present_and_lints_clean() -> None:
    assert helm.dependency_list(str(CHART)) == [
        {"name": "etcd", "version": "0.1.0", "repository": "", "status": "unpacked"}]
    report = helm.lint(str(CHART / "charts" / "etcd"), strict=True, kube_version=f"v{K8S_VERSION}")
    assert report["errors"] == [] and not [m for m in report["messages"] if m["severity"] >= 2]


def test_every_manifest_validates_against_the_kubernetes_schemas(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    name, docs = rendered
    custom = []
    for doc in docs:
        if doc["apiVersion"].startswith("monitoring.coreos.com/"):
            custom.append(doc)  # CRDs: no upstream schema; checked in the test below
            continue
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    assert {d["kind"] for d in docs} >= {"Deployment", "StatefulSet", "Service", "Secret",
                                         "PodDisruptionBudget"} - ({"Secret"} if name != "default" else set())
    assert bool(custom) == (name == "ha-hugepages")


def test_validation_can_fail() -> None:
    """A manifest with a wrong field type is refused (the check above is not vacuous)."""
    doc = one(render("default"), "Deployment", "-master")
    doc["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_prometheus_rule_is_deploy_prometheus_rules_yml(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    name, docs = rendered
    rules = yaml.safe_load((DEPLOY / "prometheus" / "rules.yml").read_text())
    assert (CHART / "files" / "rules.yml").read_text() == (DEPLOY / "prometheus" / "rules.yml").read_text()
    found = kind(docs, "PrometheusRule")
    if name == "ha-hugepages":
        assert found[0]["spec"] == rules
        monitor = one(docs, "ServiceMonitor", "cellar")
        assert monitor["spec"]["endpoints"][0]["port"] == "http"
        assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    else:
        assert not found


def test_masters_shape(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    name, docs = rendered
    values = values_of(name) or {}
    deploy = one(docs, "Deployment", "-master")
    want = values.get("master", {}).get("replicas", 2)
    assert deploy["spec"]["replicas"] == want >= 2
    anti = deploy["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    hard = values.get("master", {}).get("antiAffinity") == "hard"
    assert ("requiredDuringSchedulingIgnoredDuringExecution" in anti) == hard
    service = one(docs, "Service", "-master")
    assert {p["name"] for p in service["spec"]["ports"]} == {"grpc", "fast", "http"}
    pdb = one(docs, "PodDisruptionBudget", "-master")
    assert pdb["spec"]["minAvailable"] >= 1
    # the etcd subchart runs only when no external etcd is named
    bundled = [d for d in kind(docs, "StatefulSet") if d["metadata"]["name"].endswith("-etcd")]
    assert len(bundled) == (0 if values.get("etcd", {}).get("endpoints") else 1)


def test_nodes_shape_and_resources_match_the_segment(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    name, docs = rendered
    node_values = (values_of(name) or {}).get("node", {})
    seg_mib = node_values.get("segmentSizeMiB", 1024)
    overhead_mib = node_values.get("memoryOverheadMiB", 512)
    sts = one(docs, "StatefulSet", "-node")
    assert sts["spec"]["replicas"] == node_values.get("replicas", 3)
    pod = sts["spec"]["template"]["spec"]
    container = pod["containers"][0]
    segments = next(v for v in pod["volumes"] if v["name"] == "segments")
    resources = container["resources"]
    if node_values.get("hugepages", {}).get("enabled"):
        assert segments["emptyDir"]["medium"] == "HugePages-2Mi"
        assert resources["requests"]["hugepages-2Mi"] == resources["limits"]["hugepages-2Mi"] == f"{seg_mib}Mi"
        assert resources["requests"]["memory"] == f"{overhead_mib}Mi"
        assert "IPC_LOCK" in container["securityContext"]["capabilities"]["add"]
    else:
        assert segments["emptyDir"]["medium"] == "Memory"
        assert int(segments["emptyDir"]["sizeLimit"].removesuffix("Mi")) > seg_mib
        assert resources["requests"]["memory"] == f"{seg_mib + overhead_mib}Mi"
    args = container["args"]
    assert args[args.index("--segment-size") + 1] == str(seg_mib << 20)
    service = one(docs, "Service", "-node")
    assert service["spec"]["clusterIP"] == "None"
    assert {p["name"] for p in service["spec"]["ports"]} == {"data", "http"}
    assert sts["spec"]["serviceName"] == service["metadata"]["name"]


def test_every_cellar_container_probes_health(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    _, docs = rendered
    for doc in kind(docs, "Deployment") + kind(docs, "StatefulSet"):
        for container in doc["spec"]["template"]["spec"]["containers"]:
            if container["name"] == "etcd":
                continue
            for probe in ("livenessProbe", "readinessProbe"):
                assert container[probe]["httpGet"]["path"] == "/health", (doc["metadata"]["name"], probe)


def _kubelet_args(container: dict[str, Any], tmp_path: Path) -> tuple[list[str], dict[str, str]]:
    """The container's args as the kubelet runs them: $(VAR) expanded from its env (fieldRefs
    given fake pod values), volume mount points made under tmp_path."""
    env = {}
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = item["value"]
        else:
            env[item["name"]] = FAKE_FIELDS[item["valueFrom"]["fieldRef"]["fieldPath"]]
    mounts = {}
    for mount in container.get("volumeMounts", []):
        mounts[mount["mountPath"]] = str(tmp_path / mount["mountPath"].lstrip("/"))
        Path(mounts[mount["mountPath"]]).mkdir(parents=True, exist_ok=True)
    args = []
    for arg in container["args"]:
        arg = re.sub(r"\$\(([A-Z_]+)\)", lambda m: env[m.group(1)], arg)
        args.append(mounts.get(arg, arg))
    return args, {k: v for k, v in env.items() if k.startswith("CELLAR_") and k != "CELLAR_HEALTH_URL"}


def test_rendered_container_args_parse_with_cellar_print_config(
        rendered: tuple[str, list[dict[str, Any]]], tmp_path: Path) -> None:
    name, docs = rendered
    master = one(docs, "Deployment", "-master")["spec"]["template"]["spec"]["containers"][0]
    args, env = _kubelet_args(master, tmp_path / "master")
    assert args[0] == "master"
    settings = print_config(args, env)
    assert settings["advertise"] == "10.1.2.3:50051" and settings["fast_port"] == "50052"
    assert settings["etcd"] == (values_of(name) or {}).get("etcd", {}).get("endpoints", "cellar-etcd.kv.svc:2379")
    tokens_secret = (values_of(name) or {}).get("tokens", {}).get("existingSecret")
    assert (env.get("CELLAR_MASTER_TOKENS_FILE") == "/etc/cellar/tokens/tokens.json") == bool(tokens_secret)
    if "tokens_file" in settings:  # the authentication work (tokens) is in this tree
        assert settings["tokens_file"] == env.get("CELLAR_MASTER_TOKENS_FILE", "")
    node = one(docs, "StatefulSet", "-node")["spec"]["template"]["spec"]["containers"][0]
    args, env = _kubelet_args(node, tmp_path / "node")
    assert args[0] == "node"
    settings = print_config(args, env)
    assert settings["node_id"] == "cellar-node-0"
    assert settings["advertise_host"] == "cellar-node-0.cellar-node.kv.svc"
    assert settings["master"].startswith("etcd://") and settings["master"].endswith("/cellar")
    assert settings["hugepages"] == str(bool((values_of(name) or {}).get("node", {}).get("hugepages", {}).get("enabled")))


def test_values_yaml_documents_every_key() -> None:
    """Every leaf key of values.yaml has a comment on the line(s) above it or in its block."""
    lines = (CHART / "values.yaml").read_text().splitlines()
    for i, line in enumerate(lines):
        stripped = line.strip()
        if not stripped or stripped.startswith("#") or stripped.startswith("- "):
            continue
        key, _, value = stripped.partition(":")
        if value.strip() in ("",):
            continue  # a mapping header: its leaves carry the docs
        above = lines[i - 1].strip() if i else ""
        assert above.startswith("#"), f"values.yaml:{i + 1} {key} has no comment above it"


def test_node_pods_drain_in_pre_stop_within_the_grace_period(tmp_path: Path) -> None:
    """With node.drain.adminTokenSecret the node pods run `cellar node drain $POD_NAME` in
    preStop, bounded 10 s under terminationGracePeriodSeconds; the manifest validates and the
    hook's command line parses for real (it reaches for the master and gives up, exit 1)."""
    values = {"node": {"drain": {"adminTokenSecret": "cellar-admin"},
                       "terminationGracePeriodSeconds": 120}}
    out = helm.Chart.load(str(CHART)).render(values, name="cellar", namespace="kv", is_install=True)
    docs = [d for t, text in out.items() if not t.endswith("NOTES.txt")
            for d in yaml.safe_load_all(text) if d]
    node = one(docs, "StatefulSet", "-node")
    kubernetes_validate.validate(node, K8S_VERSION, strict=True)
    spec = node["spec"]["template"]["spec"]
    assert spec["terminationGracePeriodSeconds"] == 120
    container = spec["containers"][0]
    assert {"name": "CELLAR_ADMIN_TOKEN", "valueFrom": {"secretKeyRef": {
        "name": "cellar-admin", "key": "admin-token"}}} in container["env"]
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    assert command[:2] == ["sh", "-c"]
    script = command[2]
    assert script.startswith('exec cellar node drain "$POD_NAME"') and "--timeout 110s" in script
    assert "--http cellar-master:9400" in script
    # Without the secret: no hook (a drain needs an admin token).
    default = one(render("default"), "StatefulSet", "-node")["spec"]["template"]["spec"]
    assert "lifecycle" not in default["containers"][0]
    # The hook's command line, run as the kubelet would (cellar = this interpreter's module),
    # against a master that is not there: it parses, asks, and fails with exit 1.
    script = script.replace("exec cellar ", f"exec {sys.executable} -m cellar ")
    script = script.replace("cellar-master:9400", "127.0.0.1:9").replace("--timeout 110s", "--timeout 1s")
    proc = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "POD_NAME": "cellar-node-0", "CELLAR_ADMIN_TOKEN": "x"})
    assert proc.returncode == 1 and "no master answered" in proc.stderr, proc.stderr


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_the_disk_tier_volume_is_a_pvc_or_a_hostpath_or_absent(name: str) -> None:
    nodes = one(render(name), "StatefulSet", "-node")
    spec = nodes["spec"]["template"]["spec"]
    args = spec["containers"][0]["args"]
    disk_volumes = [v for v in spec["volumes"] if v["name"] == "disk"]
    claims = [c["metadata"]["name"] for c in nodes["spec"].get("volumeClaimTemplates", [])]
    if name == "default":
        assert "--disk-dir" not in args and not disk_volumes and not claims
        return
    assert args[args.index("--disk-dir") + 1] == "/disk"
    assert args[args.index("--journal-dir") + 1] == "/disk"  # the journal lives with the disk
    size_mib = values_of(name)["node"]["disk"]["sizeMiB"]
    assert args[args.index("--disk-size") + 1] == str(size_mib << 20)
    if name == "disk-hostpath":
        assert disk_volumes[0]["hostPath"]["path"] == "/var/lib/cellar" and not claims
    else:
        assert claims == ["disk"] and not disk_volumes
