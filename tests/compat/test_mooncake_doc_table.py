"""The Mooncake method table of docs/mooncake.md covers every method of Mooncake's
MooncakeDistributedStore, the class has each of them, and the table's NOT_SUPPORTED rows are
exactly the methods that return NOT_SUPPORTED (-1012)."""

from __future__ import annotations

import re
from pathlib import Path

from cellar.compat.mooncake import MooncakeDistributedStore
from cellar.compat.mooncake.unsupported import UNSUPPORTED

DOC = Path(__file__).resolve().parents[2] / "docs" / "mooncake.md"
# The public methods Mooncake's Python store class defines (mooncake-integration/store/
# store_py.cpp at the 0.3.x line the compat layer follows).
MOONCAKE_METHODS = [
    "alloc_from_mem_pool", "allocate_and_mount_segment", "batch_get_buffer", "batch_get_into",
    "batch_get_into_multi_buffer_ranges", "batch_get_into_multi_buffers",
    "batch_get_replica_desc", "batch_get_session_end", "batch_get_session_start",
    "batch_get_tensor", "batch_get_tensor_into", "batch_get_tensor_into_cuda",
    "batch_get_tensor_with_parallelism", "batch_get_tensor_with_parallelism_into",
    "batch_get_tensor_with_tp", "batch_get_tensor_with_tp_into", "batch_is_exist",
    "batch_pub_tensor", "batch_pub_tensor_with_tp", "batch_put_from",
    "batch_put_from_multi_buffer_ranges", "batch_put_from_multi_buffers", "batch_put_session_end",
    "batch_put_session_revoke", "batch_put_session_start", "batch_put_tensor",
    "batch_put_tensor_from", "batch_put_tensor_with_parallelism",
    "batch_put_tensor_with_parallelism_from", "batch_put_tensor_with_tp",
    "batch_put_tensor_with_tp_from", "batch_remove", "batch_replica_clear", "batch_upsert_from",
    "batch_upsert_pub_tensor", "batch_upsert_tensor", "batch_upsert_tensor_from",
    "batch_upsert_tensor_with_parallelism", "batch_upsert_tensor_with_parallelism_from",
    "bind_to_numa_node", "close", "create_copy_task", "create_move_task", "get",
    "get_alloc_func_addr", "get_batch", "get_buffer", "get_free_func_addr", "get_hostname",
    "get_into", "get_into_ranges", "get_offload_rpc_read_count", "get_replica_desc", "get_size",
    "get_tensor", "get_tensor_into", "get_tensor_into_cuda", "get_tensor_with_parallelism",
    "get_tensor_with_parallelism_into", "get_tensor_with_tp", "get_tensor_with_tp_into",
    "health_check", "init_all", "is_exist", "load_tensor_from_safetensor", "mount_segment",
    "pub_tensor", "pub_tensor_with_tp", "put", "put_batch", "put_from", "put_from_with_metadata",
    "put_parts", "put_tensor", "put_tensor_from", "put_tensor_with_parallelism",
    "put_tensor_with_parallelism_from", "put_tensor_with_tp", "put_tensor_with_tp_from",
    "query_task", "register_buffer", "remove", "remove_all", "remove_by_regex",
    "save_tensor_to_safetensor", "setup", "setup_dummy", "unmount_and_free_segment",
    "unmount_local_disk_segment", "unmount_segment", "unregister_buffer", "upsert",
    "upsert_batch", "upsert_from", "upsert_parts", "upsert_pub_tensor", "upsert_tensor",
    "upsert_tensor_from", "upsert_tensor_with_parallelism", "upsert_tensor_with_parallelism_from",
]


def _table() -> dict[str, str]:
    """method name -> its Cellar column, from the "Every Mooncake method" table."""
    text = DOC.read_text()
    section = text.split("\n## Every Mooncake method\n", 1)[1].split("\n#", 1)[0]
    rows: dict[str, str] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].startswith("`"):
            continue
        for name in re.findall(r"`([a-z_0-9]+)`", cells[0]):
            rows[name] = cells[1]
    return rows


def test_every_mooncake_method_has_a_row_and_a_method():
    rows = _table()
    assert sorted(set(MOONCAKE_METHODS) - set(rows)) == []
    assert sorted(n for n in MOONCAKE_METHODS if not callable(getattr(MooncakeDistributedStore, n, None))) == []


def test_not_supported_rows_are_the_not_supported_methods():
    rows = _table()
    documented = {n for n, verdict in rows.items() if verdict == "NOT_SUPPORTED"}
    assert documented == set(UNSUPPORTED)
    store = MooncakeDistributedStore()
    for name in UNSUPPORTED:
        method = getattr(store, name)
        assert method("key") == -1012, name
        assert method(["a", "b"]) == [-1012, -1012], name


def test_served_methods_are_not_stubs():
    rows = _table()
    served = [n for n, verdict in rows.items() if verdict != "NOT_SUPPORTED"]
    assert set(served) == set(MOONCAKE_METHODS) - set(UNSUPPORTED)
    for name in served:
        assert "NOT_SUPPORTED (-1012)" not in (getattr(MooncakeDistributedStore, name).__doc__ or "")
