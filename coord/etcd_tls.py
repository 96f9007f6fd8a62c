"""TLS to etcd: how every Cellar process (master, node, client, CLI) reaches an etcd that
speaks TLS and asks for client certificates, as a production etcd does.

Set by the environment, like `CELLAR_TLS_CA` for the masters' own ports, so one setting serves
every process and every `etcd://` address it is given:
- `CELLAR_ETCD_CA_FILE`: the CA etcd's server certificate chains to. Set, every etcd
  connection speaks TLS (never plaintext) and verifies it; empty, plaintext as before.
- `CELLAR_ETCD_CERT_FILE` and `CELLAR_ETCD_KEY_FILE`: a client certificate and its key, for an
  etcd started with `--client-cert-auth` (both or neither; they need the CA).
- `CELLAR_ETCD_SERVER_NAME`: the name to verify etcd's certificate against instead of the
  address's host (needed when several endpoints are given by IP, which gRPC cannot verify one
  by one; it must be a DNS name of the certificate).

Files are read when a connection is made (each election session, each discovery channel), so a
renewed certificate is taken at the next reconnection. A missing or unreadable file is a
`ConfigError` naming the variable, raised where the connection is attempted.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from cellar.errors import ConfigError

ENV_CA = "CELLAR_ETCD_CA_FILE"
ENV_CERT = "CELLAR_ETCD_CERT_FILE"
ENV_KEY = "CELLAR_ETCD_KEY_FILE"
ENV_SERVER_NAME = "CELLAR_ETCD_SERVER_NAME"
MAX_PEM_BYTES = 1 << 20  # a CA bundle or a certificate chain; larger is not a PEM file of ours


@dataclass(frozen=True)
class EtcdTls:
    ca: bytes
    cert: bytes | None = None
    key: bytes | None = None
    server_name: str | None = None

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> EtcdTls | None:
        """The settings of `env` (default: this process's), None when etcd is plaintext."""
        env = dict(os.environ) if env is None else env
        ca_file, cert_file, key_file = (env.get(n, "").strip() for n in (ENV_CA, ENV_CERT, ENV_KEY))
        if not ca_file:
            if cert_file or key_file:
                raise ConfigError(ENV_CERT, f"{ENV_CERT} and {ENV_KEY} need {ENV_CA} "
                                  "(a client certificate is sent over TLS only)")
            return None
        if bool(cert_file) != bool(key_file):
            raise ConfigError(ENV_CERT, f"set both {ENV_CERT} and {ENV_KEY}, or neither")
        return cls(_read(ENV_CA, ca_file), _read(ENV_CERT, cert_file) if cert_file else None,
                   _read(ENV_KEY, key_file) if key_file else None,
                   env.get(ENV_SERVER_NAME, "").strip() or None)

    def client_args(self) -> dict[str, Any]:
        """Keyword arguments of etcd3aio's `Etcd3Client` (its TLS channel)."""
        return {"ca_cert": self.ca, "cert_key": self.key, "cert_chain": self.cert,
                "tls_server_name": self.server_name}

    def credentials(self) -> Any:
        """grpc channel credentials for a synchronous channel (coord.discovery)."""
        import grpc

        return grpc.ssl_channel_credentials(root_certificates=self.ca, private_key=self.key,
                                            certificate_chain=self.cert)

    def channel_options(self) -> list[tuple[str, Any]]:
        return [("grpc.ssl_target_name_override", self.server_name)] if self.server_name else []


def _read(variable: str, path: str) -> bytes:
    try:
        with open(os.path.expanduser(path), "rb") as f:
            data = f.read(MAX_PEM_BYTES + 1)
    except OSError as exc:
        raise ConfigError(variable, f"{path}: {exc.strerror or exc}") from None
    if len(data) > MAX_PEM_BYTES or b"-----BEGIN " not in data:
        raise ConfigError(variable, f"{path} is not a PEM file (at most {MAX_PEM_BYTES} bytes)")
    return data


__all__ = ["ENV_CA", "ENV_CERT", "ENV_KEY", "ENV_SERVER_NAME", "EtcdTls"]
