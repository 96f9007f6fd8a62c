"""cellar.compat: other stores' client APIs, served by Cellar.

What it owns
    `cellar.compat.mooncake`: Mooncake Store's Python API (`MooncakeDistributedStore`,
    `ReplicateConfig`) so code written for Mooncake moves to Cellar by changing one import
    (docs/mooncake.md: the method table, the migration line, the opt-in shim).
    The subpackage `mooncake/` (its `__init__` re-exports the public names):
    - `store.py`       the store class: Mooncake's methods, signatures and integer results.
    - `codes.py`       Mooncake's ErrorCode numbers and the one table Cellar outcomes map by.
    - `setup_args.py`  setup's arguments (positional or dict, human-readable sizes).
    - `config.py`      ReplicateConfig and which of its options Cellar honours.
    - `memory.py`      registered buffers: raw pointers become bounds-checked views.
    - `io.py`          every SDK call the store makes, as per-key codes.
    - `ranges.py`      get_into_ranges.
    - `node.py`        the storage node a store with global_segment_size > 0 embeds.
    - `unsupported.py` the Mooncake methods Cellar cannot honour, as NOT_SUPPORTED.
    - `shim.py`        writes the opt-in `mooncake.store` shim for code that cannot change.

Import rule: may import only cellar, cellar.errors, cellar.client.*
    (the SDK; checked by tests/compat/test_mooncake_imports.py). It never imports
    `cellar.master` or `cellar.storage_node`: the embedded storage node is a `cellar node` child
    process started through the public `python -m cellar node` entry point, and found ready
    through the SDK (the master lists it). No module named `mooncake` is shipped: it would
    shadow a real Mooncake install (the opt-in shim is written on request instead). Nothing
    else in Cellar imports this room.
"""
