"""The Mooncake methods Cellar cannot honour, each with the reason, as NOT_SUPPORTED methods.

What it owns
    `UNSUPPORTED`: method name -> why Cellar does not serve it, and `not_supported(name)`,
    the method body `MooncakeDistributedStore` gets for each: it returns NOT_SUPPORTED
    (-1012), or a list of it (one per key) when the first argument is a list of keys, so a
    caller that iterates the result still works. docs/mooncake.md lists the same names with
    the same reasons (tests/compat/test_mooncake_doc_table.py keeps them in step).

What it must never do
    Do anything but say no: a NOT_SUPPORTED method reads, writes and allocates nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cellar.compat.mooncake.codes import ErrorCode

_SEGMENTS = "Cellar nodes own their segments; a client cannot mount memory by hand (use the embedded node or `cellar node`)"
_TP = "tensor-parallel sharding of one tensor into per-rank keys is not in the SDK"
_PAR = "Mooncake's parallelism layouts (ParallelAxis/TensorParallelism) have no Cellar counterpart"
_SESSION = "Mooncake's put/get sessions (reserve now, transfer later) have no Cellar RPC"
_TENSOR_PTR = "Mooncake's [TensorMetadata][data] buffer layout is Mooncake's own format"
_CUDA = "GPU memory: the SDK moves host memory only"
_TASKS = "replica copy/move tasks: the Cellar master places replicas itself"
_REPLICAS = "replica descriptors are Mooncake's transfer-engine handles; Cellar's are grants"

_DISK = "the disk tier is the node's (enable_ssd_offload), mounted and read by the node, never by hand"
UNSUPPORTED: dict[str, str] = {
    "alloc_from_mem_pool": "no client-side memory pool (Cellar sends from the caller's buffers)",
    "init_all": _SEGMENTS,
    "mount_segment": _SEGMENTS,
    "unmount_segment": _SEGMENTS,
    "allocate_and_mount_segment": _SEGMENTS,
    "unmount_and_free_segment": _SEGMENTS,
    "unmount_local_disk_segment": _DISK,
    "get_offload_rpc_read_count": _DISK,
    "bind_to_numa_node": "Cellar nodes take NUMA placement from their own configuration",
    "get_alloc_func_addr": "no Mooncake host allocator",
    "get_free_func_addr": "no Mooncake host allocator",
    "put_from_with_metadata": "objects carry no separate metadata buffer",
    "get_replica_desc": _REPLICAS,
    "batch_get_replica_desc": _REPLICAS,
    "batch_replica_clear": _TASKS,
    "create_copy_task": _TASKS,
    "create_move_task": _TASKS,
    "query_task": _TASKS,
    "batch_get_session_start": _SESSION,
    "batch_get_session_end": _SESSION,
    "batch_get_into_multi_buffer_ranges": _SESSION,
    "batch_put_session_start": _SESSION,
    "batch_put_session_end": _SESSION,
    "batch_put_session_revoke": _SESSION,
    "batch_put_from_multi_buffer_ranges": _SESSION,
    "get_tensor_into": _TENSOR_PTR,
    "batch_get_tensor_into": _TENSOR_PTR,
    "put_tensor_from": _TENSOR_PTR,
    "batch_put_tensor_from": _TENSOR_PTR,
    "upsert_tensor_from": _TENSOR_PTR,
    "batch_upsert_tensor_from": _TENSOR_PTR,
    "get_tensor_into_cuda": _CUDA,
    "batch_get_tensor_into_cuda": _CUDA,
    "get_tensor_with_tp": _TP,
    "batch_get_tensor_with_tp": _TP,
    "get_tensor_with_tp_into": _TP,
    "batch_get_tensor_with_tp_into": _TP,
    "put_tensor_with_tp": _TP,
    "batch_put_tensor_with_tp": _TP,
    "put_tensor_with_tp_from": _TP,
    "batch_put_tensor_with_tp_from": _TP,
    "pub_tensor": "replicated tensor publishing: use put_tensor (replicas via the SDK)",
    "batch_pub_tensor": "replicated tensor publishing: use batch_put_tensor",
    "pub_tensor_with_tp": _TP,
    "batch_pub_tensor_with_tp": _TP,
    "upsert_pub_tensor": "replicated tensor publishing: use upsert_tensor",
    "batch_upsert_pub_tensor": "replicated tensor publishing: use batch_upsert_tensor",
    "get_tensor_with_parallelism": _PAR,
    "batch_get_tensor_with_parallelism": _PAR,
    "get_tensor_with_parallelism_into": _PAR,
    "batch_get_tensor_with_parallelism_into": _PAR,
    "put_tensor_with_parallelism": _PAR,
    "batch_put_tensor_with_parallelism": _PAR,
    "put_tensor_with_parallelism_from": _PAR,
    "batch_put_tensor_with_parallelism_from": _PAR,
    "upsert_tensor_with_parallelism": _PAR,
    "batch_upsert_tensor_with_parallelism": _PAR,
    "upsert_tensor_with_parallelism_from": _PAR,
    "batch_upsert_tensor_with_parallelism_from": _PAR,
    "save_tensor_to_safetensor": "file export is not a store operation in Cellar",
    "load_tensor_from_safetensor": "file import is not a store operation in Cellar",
}


def not_supported(name: str) -> Callable[..., Any]:
    """The body of an unsupported method: NOT_SUPPORTED, per key when given a key list."""
    reason = UNSUPPORTED[name]

    def method(self: Any, *args: Any, **kwargs: Any) -> int | list[int]:
        first = args[0] if args else None
        if isinstance(first, (list, tuple)):
            return [int(ErrorCode.NOT_SUPPORTED)] * len(first)
        return int(ErrorCode.NOT_SUPPORTED)

    method.__name__ = name
    method.__doc__ = f"NOT_SUPPORTED (-1012): {reason}."
    return method
