"""cellar.integrations: Cellar as the L3 tier under inference engines.

What it owns
    The adapters that let an engine keep KV pages in Cellar without any change to the engine:
    - `kvformat.py`  the KV format guard every adapter shares: a frozen `KVFormat` (model, KV
                     dtype, layout, page size, parallelism rule, adapter and its version), the
                     key namespace derived from it, and the checks that refuse an object whose
                     format or size is not the reader's.
    - `sglang/`      `CellarHiCacheStorage`, SGLang HiCache's L3 storage backend (loaded by
                     SGLang's `dynamic` backend factory from `cellar.integrations.sglang`):
                     `backend.py` the class, `link.py` its SDK client, `pages.py` the host
                     pool's pages as zero-copy views.
    - `lmcache/`     LMCache (`cellar.integrations.lmcache`): `connector.py` the remote-storage
                     plugin, `l2_adapter.py` the L2 adapter of its multiprocess mode (loaded
                     by LMCache's `plugin` adapter type), `session.py` the event-loop SDK
                     client and batched read both use.

What it guarantees
    A reader whose format differs from the writer's sees a miss, never the writer's bytes
    (reference section 9: upgrades must isolate incompatible KV). A failure of the cluster
    reaches the engine as a miss or a shorter prefix, never as an exception in its threads.

Import rule: may import only cellar, cellar.errors, cellar.client.*
    This room depends only on the SDK (`cellar`, `cellar.client`, `cellar.errors`) and on the
    engine each module adapts; the engine is imported only by that subpackage (SGLang only in
    `sglang/`), so `kvformat` stays importable without any engine installed. Nothing else in
    Cellar imports this room.
"""
