"""cellar.integrations: Cellar as the L3 tier under inference engines.

What it owns
    The adapters that let an engine keep KV pages in Cellar without any change to the engine:
    - `kvformat.py`  the KV format guard every adapter shares: a frozen `KVFormat` (model, KV
                     dtype, layout, page size, parallelism rule, adapter and its version), the
                     key namespace derived from it, and the checks that refuse an object whose
                     format or size is not the reader's.
    - `sglang.py`    `CellarHiCacheStorage`, SGLang HiCache's L3 storage backend (loaded by
                     SGLang's `dynamic` backend factory).
    - `lmcache.py`   the LMCache remote-storage plugin (helper eng-lmcache).

What it guarantees
    A reader whose format differs from the writer's sees a miss, never the writer's bytes
    (reference section 9: upgrades must isolate incompatible KV). A failure of the cluster
    reaches the engine as a miss or a shorter prefix, never as an exception in its threads.

Import rule: may import only cellar, cellar.errors, cellar.client.*
    This room depends only on the SDK (`cellar`, `cellar.client`, `cellar.errors`) and on the
    engine each module adapts; the engine is imported only by that module (SGLang only in
    `sglang.py`), so `kvformat` stays importable without any engine installed. Nothing else in
    Cellar imports this room.
Import rule: may import only cellar, cellar.errors, cellar.client.*
"""
