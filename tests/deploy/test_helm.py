"""deploy/helm/cellar: rendered with the Helm v4 SDK for Python (helm-python-sdk, no helm binary),
linted, every manifest validated offline against the Kubernetes schemas (kubernetes-validate),
for the default values, deploy/helm/values-ha-hugepages.yaml (a disk tier on a PVC),
deploy/helm/values-disk-hostpath.yaml (a disk tier on a hostPath) and deploy/helm/values-tls.yaml
(every port over TLS); then the masters' and nodes' container args (with their env, $(VAR)
expanded as the kubelet does) run through `cellar master|node --print-config` for real, so every
flag the chart passes exists. With TLS, a certificate of exactly the names the chart's
Certificate asks for is handshaken, as Cellar's callers verify it, against every address they
are given (test_the_certificate_covers_every_address_callers_verify).
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
              "disk-hostpath": DEPLOY / "helm" / "values-disk-hostpath.yaml",
              "tls": DEPLOY / "helm" / "values-tls.yaml"}
CUSTOM_API_GROUPS = ("monitoring.coreos.com/", "cert-manager.io/")  # CRDs: no upstream schema


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
        if doc["apiVersion"].startswith(CUSTOM_API_GROUPS):
            custom.append(doc)  # CRDs: no upstream schema; checked in the tests below
            continue
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    assert {d["kind"] for d in docs} >= {"StatefulSet", "Service", "Secret",
                                         "PodDisruptionBudget"} - ({"Secret"} if name != "default" else set())
    assert {d["kind"] for d in custom} == {"ha-hugepages": {"ServiceMonitor", "PrometheusRule"},
                                           "tls": {"ServiceMonitor", "Certificate"}}.get(name, set())


def test_validation_can_fail() -> None:
    """A manifest with a wrong field type is refused (the check above is not vacuous)."""
    doc = one(render("default"), "StatefulSet", "-master")
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


def test_the_service_monitor_scrapes_each_pod_once_over_the_ports_scheme(
        rendered: tuple[str, list[dict[str, Any]]]) -> None:
    """It selects the masters' and nodes' Services, not the masters' headless one (which names
    the same pods); with TLS it scrapes https, verified against the chart's CA."""
    name, docs = rendered
    monitors = kind(docs, "ServiceMonitor")
    if not monitors:
        return
    (monitor,) = monitors
    selector = monitor["spec"]["selector"]
    selected = [d["metadata"]["name"] for d in kind(docs, "Service")
                if all(d["metadata"]["labels"].get(k) == v
                       for k, v in selector["matchLabels"].items())
                and all(d["metadata"]["labels"].get(e["key"]) in e["values"]
                        for e in selector["matchExpressions"])]
    assert sorted(selected) == ["cellar-master", "cellar-node"]
    endpoint = monitor["spec"]["endpoints"][0]
    if name == "tls":
        assert endpoint["scheme"] == "https"
        assert endpoint["tlsConfig"]["ca"]["secret"] == {"name": "cellar-tls", "key": "ca.crt"}
    else:
        assert "scheme" not in endpoint and "tlsConfig" not in endpoint


def test_masters_shape(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    name, docs = rendered
    values = values_of(name) or {}
    deploy = one(docs, "StatefulSet", "-master")
    want = values.get("master", {}).get("replicas", 2)
    assert deploy["spec"]["replicas"] == want >= 2
    anti = deploy["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    hard = values.get("master", {}).get("antiAffinity") == "hard"
    assert ("requiredDuringSchedulingIgnoredDuringExecution" in anti) == hard
    service = one(docs, "Service", "-master")
    assert {p["name"] for p in service["spec"]["ports"]} == {"grpc", "fast", "http"}
    pods = one(docs, "Service", "-master-pods")  # one DNS name per master: what each advertises
    assert pods["spec"]["clusterIP"] == "None" and pods["spec"]["publishNotReadyAddresses"]
    assert deploy["spec"]["serviceName"] == pods["metadata"]["name"]
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
    name, docs = rendered
    for doc in kind(docs, "Deployment") + kind(docs, "StatefulSet"):
        for container in doc["spec"]["template"]["spec"]["containers"]:
            if container["name"] == "etcd":
                continue
            for probe in ("livenessProbe", "readinessProbe"):
                get = container[probe]["httpGet"]
                assert get["path"] == "/health", (doc["metadata"]["name"], probe)
                assert get["scheme"] == ("HTTPS" if name == "tls" else "HTTP")


def _kubelet_args(container: dict[str, Any], tmp_path: Path,
                  pod: str) -> tuple[list[str], dict[str, str]]:
    """The container's args as the kubelet runs them: $(VAR) expanded from its env (fieldRefs
    given the values of pod `pod` in namespace kv), volume mount points made under tmp_path."""
    fields = {"metadata.name": pod, "metadata.namespace": "kv", "status.podIP": "10.1.2.3"}
    env = {}
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = item["value"]
        elif "fieldRef" in item["valueFrom"]:
            env[item["name"]] = fields[item["valueFrom"]["fieldRef"]["fieldPath"]]
        else:  # a Secret's key (the drain's admin token)
            env[item["name"]] = "from-a-secret"
    mounts = {}
    for mount in container.get("volumeMounts", []):
        mounts[mount["mountPath"]] = str(tmp_path / mount["mountPath"].lstrip("/"))
        Path(mounts[mount["mountPath"]]).mkdir(parents=True, exist_ok=True)
        if mount["name"] == "tls":  # the kubernetes.io/tls Secret's files, as projected
            _project_tls_secret(Path(mounts[mount["mountPath"]]))

    def local(path: str) -> str:  # a path inside a mount, as this test laid the mount out
        for point, there in mounts.items():
            if path == point or path.startswith(point + "/"):
                return there + path[len(point):]
        return path

    args = []
    for arg in container["args"]:
        arg = re.sub(r"\$\(([A-Z_]+)\)", lambda m: env[m.group(1)], arg)
        args.append(local(arg))
    return args, {k: local(v) for k, v in env.items()
                  if k.startswith("CELLAR_") and k != "CELLAR_HEALTH_URL"}


def _project_tls_secret(directory: Path) -> None:
    """tls.crt, tls.key and ca.crt in `directory`, as the chart's TLS Secret mounts them."""
    from cellar.tls import make_dev_pki

    pki = make_dev_pki(directory / "made", ["cellar-master"])
    for name, source in (("tls.crt", pki.cert_file), ("tls.key", pki.key_file),
                         ("ca.crt", pki.ca_file)):
        (directory / name).write_bytes(source.read_bytes())


def test_rendered_container_args_parse_with_cellar_print_config(
        rendered: tuple[str, list[dict[str, Any]]], tmp_path: Path) -> None:
    name, docs = rendered
    tls = name == "tls"
    master = one(docs, "StatefulSet", "-master")["spec"]["template"]["spec"]["containers"][0]
    args, env = _kubelet_args(master, tmp_path / "master", "cellar-master-0")
    assert args[0] == "master"
    settings = print_config(args, env)
    assert settings["advertise"] == "cellar-master-0.cellar-master-pods.kv.svc:50051"
    assert settings["fast_port"] == "50052"
    tls_dir = str(tmp_path / "master" / "etc/cellar/tls")
    assert settings["tls_cert_file"] == (f"{tls_dir}/tls.crt" if tls else "")
    assert settings["http_tls"] == str(tls)
    assert env.get("CELLAR_TLS_CA") == (f"{tls_dir}/ca.crt" if tls else None)
    assert settings["etcd"] == (values_of(name) or {}).get("etcd", {}).get("endpoints", "cellar-etcd.kv.svc:2379")
    # the operator's token store, or the one the chart makes (test_a_fresh_install_...)
    assert env.get("CELLAR_MASTER_TOKENS_FILE", "").endswith("/etc/cellar/tokens/tokens.json")
    if "tokens_file" in settings:  # the authentication work (tokens) is in this tree
        assert settings["tokens_file"] == env.get("CELLAR_MASTER_TOKENS_FILE", "")
    node = one(docs, "StatefulSet", "-node")["spec"]["template"]["spec"]["containers"][0]
    args, env = _kubelet_args(node, tmp_path / "node", "cellar-node-0")
    assert args[0] == "node"
    settings = print_config(args, env)
    tls_dir = str(tmp_path / "node" / "etc/cellar/tls")
    assert settings["tls_key_file"] == (f"{tls_dir}/tls.key" if tls else "")
    assert settings["http_tls"] == str(tls)
    assert env.get("CELLAR_TLS_CA") == (f"{tls_dir}/ca.crt" if tls else None)
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
    if not (values_of(name) or {}).get("node", {}).get("disk", {}).get("sizeMiB"):
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


def _handshake(pki: Any, server_name: str) -> None:
    """A loopback TLS handshake with the chart-shaped certificate, verified as `server_name`."""
    from tests.support.tls_handshake import handshake

    handshake(pki.cert_file, pki.key_file, pki.ca_file, server_name)


def test_the_certificate_covers_every_address_callers_verify(tmp_path: Path) -> None:
    """Every address a caller of a TLS install is given, read from the rendered manifests (the
    masters' and nodes' advertised hosts as `--print-config` resolves them, the Service clients
    and the preStop drain use, the ServiceMonitor's serverName), handshakes against a
    certificate of exactly the Certificate's dnsNames, and so does the status page's address
    NOTES.txt gives for a port-forward; a pod IP (what masters advertised before they were a
    StatefulSet) does not."""
    import ssl

    from cellar.tls import make_dev_pki

    values = {**values_of("tls"), "node": {"drain": {"adminTokenSecret": "cellar-admin"}}}
    out = helm.Chart.load(str(CHART)).render(values, name="cellar", namespace="kv", is_install=True)
    docs = [d for t, text in out.items() if not t.endswith("NOTES.txt")
            for d in yaml.safe_load_all(text) if d]
    notes = next(text for t, text in out.items() if t.endswith("NOTES.txt"))
    certificate = one(docs, "Certificate", "-tls")
    assert certificate["spec"]["secretName"] == "cellar-tls"
    pki = make_dev_pki(tmp_path / "pki", certificate["spec"]["dnsNames"], loopback=False)

    addresses = {}
    master = one(docs, "StatefulSet", "-master")["spec"]["template"]["spec"]["containers"][0]
    for pod in ("cellar-master-0", "cellar-master-2"):
        args, env = _kubelet_args(master, tmp_path / pod, pod)
        addresses[f"{pod} advertised"] = print_config(args, env)["advertise"].rpartition(":")[0]
    node = one(docs, "StatefulSet", "-node")["spec"]["template"]["spec"]["containers"][0]
    args, env = _kubelet_args(node, tmp_path / "node", "cellar-node-5")
    addresses["cellar-node-5 advertised"] = print_config(args, env)["advertise_host"]
    script = node["lifecycle"]["preStop"]["exec"]["command"][2]
    drain = re.search(r"--http (\S+)", script).group(1)
    assert drain.startswith("https://")
    addresses["preStop drain"] = drain.removeprefix("https://").rpartition(":")[0]
    addresses["ServiceMonitor"] = one(docs, "ServiceMonitor", "cellar")["spec"]["endpoints"][0][
        "tlsConfig"]["serverName"]
    service = one(docs, "Service", "-master")["metadata"]["name"]
    addresses["clients in the namespace"] = service
    addresses["clients elsewhere"] = f"{service}.kv.svc"
    addresses["NOTES.txt's port-forward"] = re.search(r"open https://([^:/]+):", notes).group(1)
    etcd_arg = master["args"][master["args"].index("--etcd") + 1]
    addresses["the bundled etcd, as the masters name it"] = etcd_arg.rpartition(":")[0]
    etcd = one(docs, "StatefulSet", "-etcd")["spec"]["template"]["spec"]["containers"][0]
    probe = etcd["readinessProbe"]["exec"]["command"]
    addresses["the bundled etcd's probe"] = re.search(
        r"https://([^:]+):", next(a for a in probe if a.startswith("--endpoints="))).group(1)
    assert addresses["cellar-master-2 advertised"] == "cellar-master-2.cellar-master-pods.kv.svc"
    for who, host in addresses.items():
        try:
            _handshake(pki, host)
        except ssl.SSLCertVerificationError as exc:
            pytest.fail(f"the certificate does not cover {who}'s address {host}: {exc}")
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(pki, "10.1.2.3")


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_tls_to_an_external_etcd_reaches_the_masters_and_nodes(name: str) -> None:
    """etcd.tls.secretName (an external etcd's client side) or, for the bundled etcd,
    etcd.serverTls.secretName: its files mounted into every master and node with the settings
    of coord/etcd_tls.py; etcd.tls.secretName with the bundled etcd is refused."""
    etcd_values = (values_of(name) or {}).get("etcd", {})
    secret = (etcd_values.get("tls", {}).get("secretName")
              or etcd_values.get("serverTls", {}).get("secretName"))
    docs = render(name)
    for suffix in ("-master", "-node"):
        pod = one(docs, "StatefulSet", suffix)["spec"]["template"]["spec"]
        env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
        mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
        volumes = {v["name"]: v for v in pod["volumes"]}
        if secret:
            assert env["CELLAR_ETCD_CA_FILE"] == "/etc/cellar/etcd-tls/ca.crt"
            assert env["CELLAR_ETCD_CERT_FILE"] == "/etc/cellar/etcd-tls/tls.crt"
            assert env["CELLAR_ETCD_KEY_FILE"] == "/etc/cellar/etcd-tls/tls.key"
            assert mounts["etcd-tls"] == "/etc/cellar/etcd-tls"
            assert volumes["etcd-tls"]["secret"]["secretName"] == secret
        else:
            assert not any(k.startswith("CELLAR_ETCD_") for k in env) and "etcd-tls" not in mounts
    out = helm.Chart.load(str(CHART)).render(values_of(name), name="cellar", namespace="kv",
                                             is_install=True)
    notes = next(text for t, text in out.items() if t.endswith("NOTES.txt"))
    assert (f"the files of Secret {secret} and" in notes) if secret else \
        "etcd speaks TLS" not in notes  # NOTES.txt tells a client what it needs
    with pytest.raises(Exception, match="the bundled etcd's TLS is etcd.serverTls.secretName"):
        helm.Chart.load(str(CHART)).render({"etcd": {"tls": {"secretName": "x"}}}, name="cellar",
                                           namespace="kv", is_install=True)


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_a_fresh_install_has_an_admin_token_its_masters_accept(name: str, tmp_path: Path) -> None:
    """Without tokens.existingSecret the chart makes Secret cellar-tokens: an admin token and
    the store holding its hash, which Cellar's own TokenStore (what the masters run) reads and
    accepts it from as an admin; the masters mount that Secret (or the operator's)."""
    import base64

    from cellar.tokens import KIND_ADMIN, TokenStore

    existing = (values_of(name) or {}).get("tokens", {}).get("existingSecret")
    docs = render(name)
    secrets = {d["metadata"]["name"]: d for d in kind(docs, "Secret")}
    master = one(docs, "StatefulSet", "-master")["spec"]["template"]["spec"]
    volume = next(v for v in master["volumes"] if v["name"] == "tokens")
    if existing:
        assert "cellar-tokens" not in secrets and volume["secret"]["secretName"] == existing
        return
    assert volume["secret"]["secretName"] == "cellar-tokens"
    data = {k: base64.b64decode(v) for k, v in secrets["cellar-tokens"]["data"].items()}
    (tmp_path / "tokens.json").write_bytes(data["tokens.json"])
    store = TokenStore(tmp_path / "tokens.json")
    record = store.lookup(data["admin-token"].decode())
    assert record is not None and record.kind == KIND_ADMIN and len(store) == 1
    token = data["admin-token"].decode()
    assert store.lookup(token[:-1] + ("y" if token.endswith("x") else "x")) is None
    # a second render makes another token (an upgrade keeps the first: looked up in the cluster)
    again = next(d for d in kind(render(name), "Secret") if d["metadata"]["name"] == "cellar-tokens")
    assert again["data"]["admin-token"] != secrets["cellar-tokens"]["data"]["admin-token"]


def test_the_bundled_etcd_serves_tls_to_certificate_holders_only(tmp_path: Path) -> None:
    """values-tls.yaml: the bundled etcd's rendered command, run for real (the etcd of the dev
    extra, its files and addresses moved to this machine) with a certificate of exactly the
    Certificate's dnsNames, answers no plaintext and no TLS client without a certificate, and
    its rendered readiness probe (etcdctl with the Secret's certificate) passes; the masters and
    nodes mount that Secret for etcd, and the Certificate allows client auth."""
    import subprocess
    import time

    from cellar.devtools.etcd_server import find_etcd_binary
    from cellar.devtools.ports import free_port
    from cellar.tls import make_dev_pki
    from tests.support.etcd_probe import assert_etcd_refuses_strangers

    docs = render("tls")
    certificate = one(docs, "Certificate", "-tls")
    assert "client auth" in certificate["spec"]["usages"]
    for suffix in ("-master", "-node"):
        pod = one(docs, "StatefulSet", suffix)["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes["etcd-tls"]["secret"]["secretName"] == certificate["spec"]["secretName"]
    etcd_pod = one(docs, "StatefulSet", "-etcd")["spec"]["template"]["spec"]
    assert {v["name"]: v for v in etcd_pod["volumes"]}["tls"]["secret"]["secretName"] == \
        certificate["spec"]["secretName"]
    container = etcd_pod["containers"][0]
    assert "--client-cert-auth" in container["command"]
    pki = make_dev_pki(tmp_path / "pki", certificate["spec"]["dnsNames"], loopback=False)
    files = {"/etc/etcd/tls/tls.crt": str(pki.cert_file), "/etc/etcd/tls/tls.key": str(pki.key_file),
             "/etc/etcd/tls/ca.crt": str(pki.ca_file)}
    port, peer = free_port("127.0.0.1"), free_port("127.0.0.1")

    def here(arg: str) -> str:
        for path, local in files.items():
            arg = arg.replace(path, local)
        return (arg.replace("0.0.0.0:2379", f"127.0.0.1:{port}")
                .replace(":2379", f":{port}").replace("/var/lib/etcd", str(tmp_path / "data")))

    command = [find_etcd_binary(), *map(here, container["command"][1:]),
               f"--listen-peer-urls=http://127.0.0.1:{peer}",
               f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
               f"--initial-cluster=etcd=http://127.0.0.1:{peer}"]
    probe = [find_etcd_binary("etcdctl"),
             *map(here, container["readinessProbe"]["exec"]["command"][1:])]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while subprocess.run(probe, capture_output=True, timeout=10).returncode != 0:
            assert server.poll() is None, server.stderr.read().decode()[-2000:] if server.stderr else ""
            assert time.monotonic() < deadline, "the rendered readiness probe never passed"
            time.sleep(0.2)
        assert_etcd_refuses_strangers(f"localhost:{port}", pki.ca_file, pki.cert_file,
                                      pki.key_file)
    finally:
        server.kill()
        server.wait(timeout=10)
