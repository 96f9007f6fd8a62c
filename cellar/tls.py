"""TLS for the master's gRPC port and its metadata fast line: certificates and contexts.

What TLS covers here (docs/security.md): clients and nodes reach the master over gRPC and
the fast line with the master's certificate verified against a CA file; the bearer tokens and
node credentials then never cross the network in clear. The TCP data plane's TLS (nodes with
`tls_cert_file`, endpoints `tls://HOST:PORT`) lives in `cellar.transfer.tls_sock`; this module
only makes its dev certificates. Mutual TLS for nodes: a master with `tls_client_ca_file`
and `node_listen` has a second gRPC port that requires a client certificate from that CA; a
node presenting one whose subject CN is `node:<node id>` (NODE_CN_PREFIX) is that node
without a credential (cellar.master.serving.auth). The HTTP port (status, /metrics, the admin
API) speaks TLS with the same certificate when `http_tls` is set (cellar.http, and
cellar.http_fetch for its callers); without it, it stays plaintext.

Who uses what:
- the master: `tls_cert_file` + `tls_key_file` (cellar.master.config) -> gRPC
  `ssl_server_credentials` and `server_context()` for the fast line;
- clients and nodes: the CA file from `cellar.credentials.default_tls_ca(address)`
  (`$CELLAR_TLS_CA`, else the "tls_ca" of the address's credentials file) -> a secure gRPC
  channel and `client_context()` for the fast line. No CA: plaintext, as before.
- nodes with `master_tls_cert_file`: that client certificate on their gRPC channel, no token;
- `cellar up --tls` (LocalCluster): `make_dev_pki` writes a throwaway CA, a master and a node
  certificate for the cluster's host, and a client certificate per node id, into the run
  directory, with the `cryptography` package
  (extra `cellar-kv[tls]`); it is imported only there.
"""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cellar.credentials import write_private_bytes

DEV_CERT_DAYS = 30
NODE_CN_PREFIX = "node:"  # a node's client certificate names it so (cellar.master.serving.auth reads it)


@dataclass(frozen=True)
class TlsFiles:
    ca_file: Path
    cert_file: Path
    key_file: Path
    # The storage nodes' data ports (one certificate for every node of a dev cluster: the CA
    # key is thrown away, so nodes added later must find theirs already made).
    node_cert_file: Path
    node_key_file: Path
    # Client certificates (subject CN node:<id>) for mutual TLS to the master, one per node
    # id asked for, minted while the CA key was in memory: `node_client_files(node_id)`.
    node_ids: tuple[str, ...] = ()

    def node_client_files(self, node_id: str) -> tuple[Path, Path] | None:
        """(certificate, key) of `node_id`'s client certificate, None if none was made."""
        if node_id not in self.node_ids:
            return None
        directory = self.ca_file.parent
        return directory / f"client-{node_id}.pem", directory / f"client-{node_id}.key"


def make_dev_pki(directory: Path, hosts: list[str], node_ids: Sequence[str] = (), *,
                 loopback: bool = True, days: int = DEV_CERT_DAYS) -> TlsFiles:
    """A new CA, a master and a node certificate for `hosts` (IPs or names; with `loopback`,
    127.0.0.1 and localhost too), and a client certificate `node:<id>` for each of `node_ids`,
    valid `days`; PEM files under `directory` (keys 0600). For local and test clusters and
    `cellar tls create`: the CA key is thrown away."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    not_after = now + datetime.timedelta(days=days)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "cellar dev CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(not_after)
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .sign(ca_key, hashes.SHA256()))
    names: list[x509.GeneralName] = []
    for host in dict.fromkeys([*hosts, *(("127.0.0.1", "localhost") if loopback else ())]):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    write_private_bytes(directory / "ca.pem", ca.public_bytes(serialization.Encoding.PEM))

    def issue(stem: str, common: str, extension: x509.ExtensionType) -> None:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)]))
                .issuer_name(ca_name).public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(not_after)
                .add_extension(extension, critical=False)
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .sign(ca_key, hashes.SHA256()))
        write_private_bytes(directory / f"{stem}.pem", cert.public_bytes(serialization.Encoding.PEM))
        write_private_bytes(directory / f"{stem}.key", key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption()))

    for role in ("master", "node"):
        issue(role, f"{hosts[0] if hosts else 'cellar'} {role}", x509.SubjectAlternativeName(names))
    for node_id in node_ids:  # the master's Authorizer reads the node id from this CN
        issue(f"client-{node_id}", f"{NODE_CN_PREFIX}{node_id}",
              x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]))
    return TlsFiles(directory / "ca.pem", directory / "master.pem", directory / "master.key",
                    directory / "node.pem", directory / "node.key", tuple(node_ids))


def server_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    """The fast line's server side (TLS 1.2+), and the HTTP port's (`http_tls`)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert_file, key_file)
    return context


def client_context(ca_file: str) -> ssl.SSLContext:
    """The fast line's client side: the master's certificate must chain to `ca_file` and name
    the host connected to."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca_file)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def read_pem(path: str) -> bytes:
    return Path(path).expanduser().read_bytes()
