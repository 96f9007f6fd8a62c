"""`MooncakeDistributedStore.setup`'s arguments, read the way Mooncake reads them.

What it owns
    `SetupConfig` and the two ways to build it: `from_positional` (Mooncake's pybind
    signature: local_hostname, metadata_server, global_segment_size, local_buffer_size,
    protocol, rdma_devices, master_server_addr, engine, then keywords) and `from_dict`
    (`setup({...})`, every value read as text, as Mooncake converts them with `str()`).
    `parse_size_bytes` reads Mooncake's human-readable sizes.

Mooncake's rules kept here
    - Sizes: a non-negative number with an optional unit B, K/KB, M/MB, G/GB, T/TB
      (binary multiples: "16MB" = 16 MiB; case and blanks between number and unit do not
      matter: "16 MB"). Anything else, a percentage ("50%") included, is INVALID_PARAMS.
    - `metadata_server` (P2PHANDSHAKE, http://..., etcd://...) is Mooncake's transfer-engine
      metadata service; Cellar has none, so it is accepted and ignored.
    - `protocol` picks the Cellar transport: "tcp" -> tcp, "rdma" -> rdma (Cellar's own
      "auto" and "shm" are accepted too); another Mooncake protocol (efa, nvlink, ...) is
      NOT_SUPPORTED.
    - The dict form requires `local_hostname` and `metadata_server`, and ignores keys it does
      not know (as Mooncake does; they are logged).
    - `enable_ssd_offload` gives the embedded node (so `global_segment_size > 0`) a disk tier
      (docs/disk-tier.md): its directory is `ssd_offload_path`, else Mooncake's
      MOONCAKE_OFFLOAD_FILE_STORAGE_PATH; its size MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES,
      else DISK_PER_SEGMENT x the global segment (whole pages, at least 1 MiB). Without a
      segment or a directory it is INVALID_PARAMS (Cellar's disk tier belongs to a node).
    `SetupError` carries the code setup returns.

What it must never do
    Connect or start anything: it only reads arguments.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cellar.compat.mooncake.codes import ErrorCode

log = logging.getLogger("cellar.compat.mooncake")

DEFAULT_SEGMENT_BYTES = 16 << 20        # Mooncake's default global_segment_size (dict form)
DEFAULT_LOCAL_BUFFER_BYTES = 16 << 20   # Mooncake's default local_buffer_size (dict form)
DEFAULT_PROTOCOL = "tcp"
DEFAULT_MASTER = "127.0.0.1:50051"
DEFAULT_TENANT = "default"
MAX_SIZE_BYTES = 1 << 50                # refuses absurd sizes before anything allocates
OFFLOAD_PATH_ENV = "MOONCAKE_OFFLOAD_FILE_STORAGE_PATH"      # Mooncake's SSD-offload directory
OFFLOAD_SIZE_ENV = "MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES"  # and its byte limit
DISK_PER_SEGMENT = 4          # disk tier = this many global segments when no limit is given
MIN_DISK_BYTES = 1 << 20      # the node's minimum disk-tier size
PAGE_BYTES = 4096
# Mooncake's names, plus Cellar's own: "auto" (shm for same-host nodes, rdma, tcp) and "shm".
PROTOCOL_TRANSPORTS = {"tcp": "tcp", "rdma": "rdma", "auto": "auto", "shm": "shm"}

_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*$")
_SIZE_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "M": 1 << 20, "MB": 1 << 20,
               "G": 1 << 30, "GB": 1 << 30, "T": 1 << 40, "TB": 1 << 40}
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}
_DICT_KEYS = {
    "local_hostname", "metadata_server", "global_segment_size", "local_buffer_size",
    "protocol", "rdma_devices", "master_server_addr", "ipc_socket_path", "enable_ssd_offload",
    "ssd_offload_path", "tenant_id", "enable_client_http_server", "client_http_port",
}


class SetupError(Exception):
    """Setup refused; `code` is what `setup` returns."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class SetupConfig:
    local_hostname: str
    master_address: str
    global_segment_bytes: int
    local_buffer_bytes: int
    transport: str
    tenant: str = DEFAULT_TENANT
    disk_dir: str = ""        # enable_ssd_offload: the embedded node's disk tier (docs/disk-tier.md)
    disk_bytes: int = 0


def parse_size_bytes(value: Any, what: str) -> int:
    """Mooncake's size text (or an int) -> bytes; SetupError(INVALID_PARAMS) otherwise."""
    if isinstance(value, bool):
        raise SetupError(ErrorCode.INVALID_PARAMS, f"{what}: not a size: {value!r}")
    if isinstance(value, int):
        nbytes = value
    else:
        match = _SIZE.match(str(value))
        unit = match.group(2).upper() if match else ""
        if match is None or unit not in _SIZE_UNITS:
            raise SetupError(ErrorCode.INVALID_PARAMS,
                             f"{what}: not a size: {value!r} (use e.g. 1073741824, 16MB, 1.5 GB)")
        scaled = float(match.group(1)) * _SIZE_UNITS[unit]
        if not scaled <= MAX_SIZE_BYTES:  # also refuses inf
            raise SetupError(ErrorCode.INVALID_PARAMS, f"{what}: {value!r} is over {MAX_SIZE_BYTES}")
        nbytes = int(scaled)
    if not 0 <= nbytes <= MAX_SIZE_BYTES:
        raise SetupError(ErrorCode.INVALID_PARAMS, f"{what}: {nbytes} is outside 0..{MAX_SIZE_BYTES}")
    return nbytes


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise SetupError(ErrorCode.INVALID_PARAMS, f"{what} must be a str, not {type(value).__name__}")
    return value


def _flag(value: Any, what: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise SetupError(ErrorCode.INVALID_PARAMS, f"{what}: not a boolean: {value!r}")


def _transport(protocol: str) -> str:
    name = protocol.strip().lower()
    if name not in PROTOCOL_TRANSPORTS:
        raise SetupError(ErrorCode.NOT_SUPPORTED,
                         f"protocol {protocol!r}: Cellar speaks {', '.join(PROTOCOL_TRANSPORTS)}")
    return PROTOCOL_TRANSPORTS[name]


def build(local_hostname: Any, metadata_server: Any, global_segment_size: Any,
          local_buffer_size: Any, protocol: Any, rdma_devices: Any, master_server_addr: Any,
          engine: Any = None, enable_ssd_offload: Any = False, ssd_offload_path: Any = "",
          tenant_id: Any = DEFAULT_TENANT, enable_client_http_server: Any = False,
          client_http_port: Any = 0) -> SetupConfig:
    """A checked SetupConfig from Mooncake's setup arguments, in Mooncake's order (any of them
    may be passed by name or position, as pybind allows; see the module doc)."""
    hostname = _text(local_hostname, "local_hostname").strip()
    _text(metadata_server, "metadata_server")   # Mooncake's metadata service: no Cellar role
    _text(rdma_devices, "rdma_devices")         # Cellar's rdma transport picks its device
    master = _text(master_server_addr, "master_server_addr").strip()
    if not hostname:
        raise SetupError(ErrorCode.INVALID_PARAMS, "local_hostname must not be empty")
    if not master:
        raise SetupError(ErrorCode.INVALID_PARAMS, "master_server_addr must not be empty")
    segment = parse_size_bytes(global_segment_size, "global_segment_size")
    local_buffer = parse_size_bytes(local_buffer_size, "local_buffer_size")
    transport = _transport(_text(protocol, "protocol"))
    if engine is not None:
        # a Mooncake TransferEngine cannot carry Cellar's frames; Cellar opens its own
        log.warning("setup: the `engine` argument (a Mooncake TransferEngine) is not used")
    disk_dir, disk_bytes = "", 0
    if _flag(enable_ssd_offload, "enable_ssd_offload"):
        disk_dir, disk_bytes = _ssd_offload(_text(ssd_offload_path, "ssd_offload_path"), segment)
    elif ssd_offload_path:
        log.warning("setup: ssd_offload_path is ignored without enable_ssd_offload")
    if _flag(enable_client_http_server, "enable_client_http_server"):
        raise SetupError(ErrorCode.NOT_SUPPORTED,
                         "enable_client_http_server: use cellar.client.metrics instead")
    tenant = str(tenant_id).strip() or DEFAULT_TENANT
    return SetupConfig(hostname, master, segment, local_buffer, transport, tenant,
                       disk_dir, disk_bytes)


def _ssd_offload(path: str, segment_bytes: int) -> tuple[str, int]:
    """enable_ssd_offload -> the embedded node's disk tier: (directory, size in bytes)."""
    directory = path.strip() or os.environ.get(OFFLOAD_PATH_ENV, "").strip()
    if not segment_bytes:
        raise SetupError(ErrorCode.INVALID_PARAMS,
                         "enable_ssd_offload needs global_segment_size > 0: Cellar's disk tier "
                         "sits under the DRAM of the node this client embeds")
    if not directory:
        raise SetupError(ErrorCode.INVALID_PARAMS,
                         f"enable_ssd_offload needs ssd_offload_path (or {OFFLOAD_PATH_ENV})")
    limit = os.environ.get(OFFLOAD_SIZE_ENV, "").strip()
    size = (parse_size_bytes(limit, OFFLOAD_SIZE_ENV) if limit
            else DISK_PER_SEGMENT * segment_bytes)
    return directory, max(MIN_DISK_BYTES, size - size % PAGE_BYTES)


def from_dict(config: Mapping[Any, Any]) -> SetupConfig:
    """`setup({...})`: values as text; local_hostname and metadata_server are required."""
    values = {str(k): str(v) for k, v in config.items()}
    for key in sorted(set(values) - _DICT_KEYS):
        log.warning("setup: unknown config key %r ignored", key)
    for key in ("local_hostname", "metadata_server"):
        if not values.get(key):
            raise SetupError(ErrorCode.INVALID_PARAMS, f"setup(dict): {key} is required")
    return build(
        values["local_hostname"], values["metadata_server"],
        values.get("global_segment_size", DEFAULT_SEGMENT_BYTES),
        values.get("local_buffer_size", DEFAULT_LOCAL_BUFFER_BYTES),
        values.get("protocol", DEFAULT_PROTOCOL), values.get("rdma_devices", ""),
        values.get("master_server_addr", DEFAULT_MASTER),
        enable_ssd_offload=values.get("enable_ssd_offload", "false"),
        ssd_offload_path=values.get("ssd_offload_path", ""),
        tenant_id=values.get("tenant_id", DEFAULT_TENANT),
        enable_client_http_server=values.get("enable_client_http_server", "false"),
    )
