"""Cellar as SGLang HiCache's L3 storage backend (targets SGLang 0.5.23), loaded by SGLang's
`dynamic` backend factory with no change to SGLang:

    python -m sglang.launch_server ... --enable-hierarchical-cache \\
        --hicache-storage-backend dynamic \\
        --hicache-storage-backend-extra-config '{"backend_name": "cellar",
            "module_path": "cellar.integrations.sglang", "class_name": "CellarHiCacheStorage",
            "master": "127.0.0.1:50051", "tenant": "default"}'

What it owns
    `CellarHiCacheStorage`, a `HiCacheStorage`: the zero-copy v1 interface that
    `HiCacheController` uses with `interface_v1` (`batch_set_v1` from its backup thread,
    `batch_exists` and `batch_get_v1` from its prefetch threads), the generic interface it uses
    without it (`get/set/batch_get/batch_set/exists`), and `clear`, `get_stats`, `close`.
    `interface_v1` defaults to 1: the backend sets it in SGLang's own extra config when the
    user leaves it out (the controller reads it after creating the backend); an explicit 0
    keeps the generic path.

Objects and keys
    A page is one object (MLA) or two (MHA: K, then V), each exactly `object_bytes` long, moved
    between Cellar and the host pool's own memory (`sglang_pages`: one range per object in the
    page-first layouts, one range per layer in `layer_first`). Keys are SGLang's page hashes
    under the namespace of the page's `KVFormat` (model, KV dtype, layout, page size, head and
    layer geometry, parallel rule): `<ns>/<hash>.k.r<tp rank>` and `.v.r<tp rank>` for MHA
    (each rank holds its own heads), `<ns>/<hash>.kv` for MLA (rank-replicated; only SGLang's
    storage-writer rank writes, every rank reads). A reader of another format asks for other
    keys and sees a miss; an object of the wrong size under a reader's key is refused.

Guarantees to the engine
    - No exception leaves this class after construction (`sglang_link.Link`): an outage is a
      miss, a shorter prefix or a failed backup, and the backend recovers with the cluster.
    - `batch_exists` is the leading run of pages whose every object exists (one `prefix_len`).
    - `batch_get_v1` returns True exactly for the pages whose every object landed whole with
      the format's size. Under a deadline it returns within its budget and reports only what
      landed: `get_timeout_base_s` + `get_timeout_per_ki_token_s` per 1024 tokens, or, when
      those are unset and the server runs SGLang's `timeout` prefetch policy (its default),
      `POLICY_BUDGET_FRACTION` of that policy's own budget.

Settings (keys of `--hicache-storage-backend-extra-config`, beside SGLang's own)
    master (required), tenant ("default"), token (None: $CELLAR_TOKEN or the token file),
    transport ("auto"), timeout_s (30: per SDK call), replicas (1), soft_pin (false),
    model (override of SGLang's model name in the format), get_timeout_base_s (none: follow
    SGLang's timeout policy, else no deadline) and get_timeout_per_ki_token_s (0).

Sizing SGLang's timeout from Cellar's estimate
    `prefetch_timeout_config()` answers `prefetch_timeout_base` and
    `prefetch_timeout_per_ki_token` from this client's measured load costs (`sglang.timeout`),
    for the extra config of the next launch or attach: SGLang takes them only from there.

Statistics
    `get_stats()` hands SGLang's `StorageMetrics` the pages and GB/s of every backup and
    prefetch call since the last call (both interfaces; a call that moved no page adds no
    sample), as SGLang's hf3fs and mooncake backends do, and forgets them.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from sglang.srt.mem_cache.hicache_storage import HiCacheStorage

from cellar.client import PutHints
from cellar.client.lookup import MAX_TOKENS_PER_KEY, advise, check_rate
from cellar.errors import AlreadyExists, InvalidArgument, Status
from cellar.integrations.kvformat import KVFormat
from cellar.integrations.sglang.link import Link, connect_from, log
from cellar.integrations.sglang.pages import PoolPages
from cellar.integrations.sglang.timeout import DEFAULT_MARGIN, DEFAULT_MIN_BASE_S, timeout_config

ADAPTER = "sglang-hicache"
ADAPTER_VERSION = 1
TARGET_SGLANG = "0.5.23"
# Under SGLang's `timeout` prefetch policy (its default) the backend's own read deadline, when
# not configured, is this fraction of the scheduler's budget: the read returns (with what
# landed) before the scheduler gives up on the prefetch and takes nothing.
POLICY_BUDGET_FRACTION = 0.9
# get_stats() samples kept between two reads (SGLang reads them every few seconds).
MAX_STATS_SAMPLES = 4096
_HEX = frozenset("0123456789abcdefABCDEF")
_STORED = (Status.OK, Status.ALREADY_EXISTS)
_DEFAULTS: dict[str, Any] = {"tenant": "default", "token": None, "transport": "auto",
                             "timeout_s": 30.0, "replicas": 1, "soft_pin": False, "model": None,
                             "get_timeout_base_s": None, "get_timeout_per_ki_token_s": 0.0}


def page_event_hash(page_hash: str) -> int | None:
    """SGLang's own event hash of a page (its `hash_str_to_int64`: the first 16 hex digits of
    the page's SHA-256 hash string as a signed 64-bit int), which SGLang's KV events and the
    routers that read them use; None for a key that is not such a hash string."""
    head = page_hash[:16]
    if len(head) < 16 or not all(c in _HEX for c in head):
        return None
    value = int(head, 16)
    return value - (1 << 64) if value >= 1 << 63 else value


def settings_from(extra: dict[str, Any] | None) -> dict[str, Any]:
    """The backend's settings from SGLang's extra config (InvalidArgument if malformed)."""
    extra = dict(extra or {})
    master = extra.get("master")
    if not isinstance(master, str) or not master:
        raise InvalidArgument("the Cellar HiCache backend needs \"master\" in "
                              "--hicache-storage-backend-extra-config (e.g. 127.0.0.1:50051)")
    out = {k: extra.get(k, v) for k, v in _DEFAULTS.items()}
    out["master"] = master
    for name in ("timeout_s", "get_timeout_per_ki_token_s"):
        if not isinstance(out[name], (int, float)) or out[name] < 0:
            raise InvalidArgument(f"{name} must be a number >= 0, got {out[name]!r}")
    base = out["get_timeout_base_s"]
    if base is not None and (not isinstance(base, (int, float)) or base <= 0):
        raise InvalidArgument(f"get_timeout_base_s must be a number > 0, got {base!r}")
    if not isinstance(out["replicas"], int) or out["replicas"] < 1:
        raise InvalidArgument(f"replicas must be an int >= 1, got {out['replicas']!r}")
    return out


def sglang_timeout_policy() -> tuple[float, float] | None:
    """(base s, s per 1024 tokens) of the launched server's `timeout` prefetch policy, read
    with SGLang's own parser of its extra config; None under another policy or outside a
    launched server (no published configuration)."""
    try:
        from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import (
            HybridCacheController,
        )
        from sglang.srt.runtime_context import get_memory

        memory = get_memory()
        if memory.hicache_storage_prefetch_policy != "timeout":
            return None
        parsed = HybridCacheController.parse_storage_backend_extra_config(
            memory.hicache_storage_backend_extra_config)
        base, per_ki_token = float(parsed[2]), float(parsed[3])
    except Exception:  # noqa: BLE001 - no server configuration here: no policy to follow
        return None
    return base * POLICY_BUDGET_FRACTION, per_ki_token * POLICY_BUDGET_FRACTION


def page_format(pool: Any, pages: PoolPages, *, model: str, tp_size: int) -> KVFormat:
    """The KV format of a registered host pool's pages."""
    g = pages.geometry
    dims: list[tuple[str, str]] = [("layers", f"{pool.start_layer}-{pool.end_layer}"),
                                   ("object_bytes", str(g.object_bytes))]
    if g.is_mla:
        dims.append(("kv_cache_dim", str(pool.kv_cache_dim)))
    else:
        dims += [("heads", str(pool.head_num)), ("head_dim", str(pool.head_dim)),
                 ("v_head_dim", str(pool.v_head_dim))]
    return KVFormat(model=model, kv_dtype=str(pool.dtype).removeprefix("torch."),
                    layout=pages.layout, page_size_tokens=pages.page_size_tokens,
                    parallel_rule="mla" if g.is_mla else f"tp{tp_size}", adapter=ADAPTER,
                    adapter_version=ADAPTER_VERSION, shape=tuple(dims))


class CellarHiCacheStorage(HiCacheStorage):  # type: ignore[misc]
    """SGLang HiCache L3 backend over Cellar (see the module docstring)."""

    def __init__(self, storage_config: Any, kwargs: dict[str, Any] | None = None) -> None:
        self.storage_config = storage_config
        extra = getattr(storage_config, "extra_config", None)
        self.settings = settings_from(extra)  # refuses a config without "master" (or None)
        assert isinstance(extra, dict)
        # Zero-copy by default: SGLang's controller reads this key of the same dict after it
        # has created the backend (an explicit 0 stays 0).
        extra.setdefault("interface_v1", 1)
        policy = sglang_timeout_policy() if self.settings["get_timeout_base_s"] is None else None
        if policy is not None:
            self.settings["get_timeout_base_s"], self.settings["get_timeout_per_ki_token_s"] = policy
        self.link = Link(connect_from(self.settings))
        self.is_writer = bool(getattr(storage_config, "is_storage_writer", True))
        self.pages: PoolPages | None = None
        self.format: KVFormat | None = None
        self._tags: tuple[str, ...] = ()
        self._stats: dict[str, list[float]] = {"prefetch_pgs": [], "backup_pgs": [],
                                               "prefetch_bandwidth": [], "backup_bandwidth": []}

    # ---- registration and keys ------------------------------------------------------------

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        super().register_mem_pool_host(mem_pool_host)
        cfg = self.storage_config
        model = self.settings["model"] or getattr(cfg, "model_name", None)
        if not model:
            raise InvalidArgument("the Cellar HiCache backend needs a model name for its KV "
                                  "format: SGLang's served model name, or \"model\" in its config")
        is_mla = bool(getattr(cfg, "is_mla_model", False))
        self.pages = PoolPages(mem_pool_host, is_mla=is_mla)
        # The pool is the memory every transfer uses: vouch for it with each client, so the
        # SDK's pointer and RDMA paths may use it.
        ptr, nbytes = self.pages.base_ptr, self.pages.raw.nbytes
        self.link.on_connect(lambda c: c.register_buffer(ptr, nbytes))
        # The SDK's token metrics: a page's tokens spread over its objects (K and V each count
        # half a page, so a whole page counts its tokens once); unset when they do not divide.
        per_key, rest = divmod(self.pages.page_size_tokens, self.pages.geometry.objects_per_page)
        if not rest and 0 < per_key <= MAX_TOKENS_PER_KEY:
            self.link.on_connect(lambda c: setattr(c, "tokens_per_key", per_key))
        self.format = page_format(mem_pool_host, self.pages, model=str(model),
                                  tp_size=int(getattr(cfg, "tp_size", 1)))
        rank = int(getattr(cfg, "tp_rank", 0))
        self._tags = ("kv",) if is_mla else (f"k.r{rank}", f"v.r{rank}")
        log.info("Cellar HiCache backend (SGLang %s target): namespace %s, %s, %d B per object",
                 TARGET_SGLANG, self.format.namespace(), self.format.layout,
                 self.pages.geometry.object_bytes)
        if self.is_writer:
            self.link.call("describe", self._describe, None)

    def _describe(self, client: Any) -> None:
        assert self.format is not None
        try:
            client.put(self.format.descriptor_key(), self.format.descriptor())
        except AlreadyExists:
            pass

    def _ready(self) -> tuple[PoolPages, KVFormat]:
        if self.pages is None or self.format is None:
            raise InvalidArgument("register_mem_pool_host was not called")
        return self.pages, self.format

    def object_keys(self, page_hashes: Sequence[str]) -> list[str]:
        """The Cellar keys of pages, page-major (K, V per page for MHA)."""
        _, fmt = self._ready()
        return [fmt.key(f"{h}.{tag}") for h in page_hashes for tag in self._tags]

    def engine_hashes(self, page_hashes: Sequence[str], names: Sequence[str]) -> dict[str, int]:
        """Each object's page as SGLang's own event hash (`page_event_hash`), recorded with the
        object so Cellar's KV events name pages as SGLang's do: every object of a page (K and
        V of each rank) carries its page's hash (docs/events.md)."""
        per = len(self._tags)
        out: dict[str, int] = {}
        for i, page in enumerate(page_hashes):
            value = page_event_hash(page)
            if value is not None:
                out.update((name, value) for name in names[i * per:(i + 1) * per])
        return out

    # ---- zero-copy v1 ---------------------------------------------------------------------

    def batch_set_v1(self, keys: list[str], host_indices: Any, extra_info: Any = None) -> list[bool]:
        if not keys:
            return []
        if not self.is_writer:  # an MLA replica: the writer rank stores the shared objects
            return [True] * len(keys)
        try:
            pages, _ = self._ready()
            objects = [obj for page in pages.views(host_indices) for obj in page]
            names = self.object_keys(keys)
        except InvalidArgument as e:
            self.link.warn("backup-args", f"backup refused: {e}")
            return [False] * len(keys)
        started = time.monotonic()
        hashes = self.engine_hashes(keys, names)
        statuses = self.link.call("backup", lambda c: self._put(c, names, objects, hashes),
                                  [Status.UNAVAILABLE] * len(names))
        per = pages.geometry.objects_per_page
        done = [all(s in _STORED for s in statuses[i * per:(i + 1) * per])
                for i in range(len(keys))]
        self._record("backup", sum(done), pages.geometry.page_bytes, started)
        return done

    def batch_get_v1(self, keys: list[str], host_indices: Any, extra_info: Any = None) -> list[bool]:
        filled = [False] * len(keys)
        if not keys:
            return filled
        try:
            pages, _ = self._ready()
            views = pages.views(host_indices)
            names = self.object_keys(keys)
        except InvalidArgument as e:
            self.link.warn("prefetch-args", f"prefetch refused: {e}")
            return filled
        if len(views) != len(keys):
            self.link.warn("prefetch-args", f"{len(keys)} keys for {len(views)} pages")
            return filled
        started = time.monotonic()
        deadline = self._deadline(len(keys), started)
        self.link.call("prefetch", lambda c: self._get_pages(c, names, views, filled, deadline),
                       None)
        self._record("prefetch", sum(filled), pages.geometry.page_bytes, started)
        return filled

    def batch_exists(self, keys: list[str], extra_info: Any = None) -> int:
        if not keys:
            return 0
        try:
            pages, _ = self._ready()
            names = self.object_keys(keys)
        except InvalidArgument as e:
            self.link.warn("exists-args", f"exists refused: {e}")
            return 0
        found = self.link.call("exists", lambda c: int(c.prefix_len(names)), 0)
        return min(len(keys), found // pages.geometry.objects_per_page)

    def lookup(self, keys: list[str], prefill_tokens_per_s: float | None = None,
               tokens_per_page: int | None = None) -> dict[str, Any] | None:
        """`Client.lookup` in pages (docs/lookup.md): the leading run of pages whose every object
        is stored, its bytes, this client's estimated load time and, given the engine's prefill
        rate and tokens per page, "load" or "recompute". None when the cluster cannot answer
        (the same degradation as batch_exists answering 0)."""
        if not keys:
            return None
        try:
            check_rate(prefill_tokens_per_s, tokens_per_page)
            pages, _ = self._ready()
            names = self.object_keys(keys)
        except InvalidArgument as e:
            self.link.warn("lookup-args", f"lookup refused: {e}")
            return None
        result = self.link.call("lookup", lambda c: c.lookup(names), None)
        if result is None:
            return None
        hit = min(len(keys), result.prefix_len // pages.geometry.objects_per_page)
        out = {**result.to_dict(), "pages": hit}
        if prefill_tokens_per_s is not None and tokens_per_page is not None:
            verdict = advise(hit, result.load_s, prefill_tokens_per_s, tokens_per_page)
            out.update(tokens_reused=verdict.tokens_reused, prefill_saved_s=verdict.prefill_saved_s,
                       advice=verdict.advice)
        return out

    def prefetch_timeout_config(self, *, margin: float = DEFAULT_MARGIN,
                                min_base_s: float = DEFAULT_MIN_BASE_S) -> dict[str, float] | None:
        """SGLang's `prefetch_timeout_base` and `prefetch_timeout_per_ki_token` sized from this
        client's load estimate for one page (`sglang.timeout`: SGLang reads them only from its
        extra config, at launch or attach; no call lets a backend set them live). None before
        `register_mem_pool_host` or when the cluster cannot be reached."""
        try:
            pages, _ = self._ready()
        except InvalidArgument:
            return None
        page_bytes = pages.geometry.page_bytes
        estimate = self.link.call("estimate", lambda c: c.load_estimate(page_bytes), None)
        if estimate is None:
            return None
        return timeout_config(estimate, page_bytes, pages.page_size_tokens, margin=margin,
                              min_base_s=min_base_s)

    # ---- generic interface (SGLang without interface_v1) -----------------------------------

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    def set(self, key: str, value: Any = None, target_location: Any = None,
            target_sizes: Any = None) -> bool:
        return self.batch_set([key], [value])

    def batch_set(self, keys: list[str], values: Any = None, target_locations: Any = None,
                  target_sizes: Any = None) -> bool:
        if not keys:
            return True
        if not self.is_writer:
            return True
        try:
            pages, _ = self._ready()
            if values is None or len(values) != len(keys):
                raise InvalidArgument(f"{len(keys)} keys but values for "
                                      f"{0 if values is None else len(values)}")
            objects = [[v] for value in values for v in pages.flat_views(value.contiguous())]
            names = self.object_keys(keys)
        except InvalidArgument as e:
            self.link.warn("backup-args", f"backup refused: {e}")
            return False
        started = time.monotonic()
        hashes = self.engine_hashes(keys, names)
        statuses = self.link.call("backup", lambda c: self._put(c, names, objects, hashes),
                                  [Status.UNAVAILABLE])
        stored = len(statuses) == len(names) and all(s in _STORED for s in statuses)
        self._record("backup", len(keys) if stored else 0, pages.geometry.page_bytes, started)
        return stored

    def get(self, key: str, target_location: Any = None, target_sizes: Any = None) -> Any:
        return self.batch_get([key], None if target_location is None else [target_location])[0]

    def batch_get(self, keys: list[str], target_locations: Any = None,
                  target_sizes: Any = None) -> list[Any]:
        out: list[Any] = [None] * len(keys)
        if not keys:
            return out
        try:
            pages, _ = self._ready()
            targets = (list(target_locations) if target_locations is not None
                       else [pages.pool.get_dummy_flat_data_page() for _ in keys])
            if len(targets) != len(keys):
                raise InvalidArgument(f"{len(keys)} keys but {len(targets)} targets")
            views = [[[v] for v in pages.flat_views(t)] for t in targets]
            names = self.object_keys(keys)
        except InvalidArgument as e:
            self.link.warn("prefetch-args", f"prefetch refused: {e}")
            return out
        filled = [False] * len(keys)
        started = time.monotonic()
        self.link.call("prefetch", lambda c: self._get_pages(c, names, views, filled, None), None)
        self._record("prefetch", sum(filled), pages.geometry.page_bytes, started)
        return [t if ok else None for t, ok in zip(targets, filled, strict=True)]

    # ---- housekeeping ---------------------------------------------------------------------

    def clear(self) -> None:
        """Remove every object of this backend's format (all ranks and all instances that
        share it), as HiCache's `clear` empties its storage."""
        if self.format is not None:
            prefix = self.format.namespace() + "/"
            self.link.call("clear", lambda c: c.remove_prefix(prefix), 0)

    def get_stats(self) -> Any:
        from sglang.srt.observability.metrics_collector import StorageMetrics

        metrics = StorageMetrics()
        for name in list(self._stats):
            # Swap, not copy-and-clear: a sample the backup or prefetch thread appends
            # meanwhile lands in the next report instead of being lost.
            samples, self._stats[name] = self._stats[name], []
            getattr(metrics, name).extend(samples)
        return metrics

    def close(self) -> None:
        self.link.close()

    # ---- moving bytes ---------------------------------------------------------------------

    def _deadline(self, page_count: int, started: float) -> float | None:
        base = self.settings["get_timeout_base_s"]
        if base is None:
            return None
        pages, _ = self._ready()
        tokens = page_count * pages.page_size_tokens
        return started + float(base) + tokens / 1024 * float(self.settings["get_timeout_per_ki_token_s"])

    def _put(self, client: Any, names: list[str], objects: list[list[memoryview]],
             hashes: dict[str, int]) -> list[Status]:
        return list(client.put_many_parts(list(zip(names, objects, strict=True)),
                                          replicas=self.settings["replicas"],
                                          soft_pin=bool(self.settings["soft_pin"]),
                                          hints=PutHints(engine_hashes=hashes)))

    def _get_pages(self, client: Any, names: list[str], views: list[list[list[memoryview]]],
                   filled: list[bool], deadline: float | None) -> None:
        """Fill the leading pages that Cellar holds whole; mark each in `filled` (in place, so
        an outage part-way still reports the pages that landed)."""
        pages, fmt = self._ready()
        per = pages.geometry.objects_per_page
        expected = pages.geometry.object_bytes
        budget_s = None if deadline is None else deadline - time.monotonic()
        if budget_s is not None and budget_s <= 0:
            return
        sizes = self._get(client, names, [obj for page in views for obj in page], expected,
                          budget_s)
        for i in range(len(views)):
            got = sizes[i * per:(i + 1) * per]
            if len(got) < per or any(s != expected for s in got):
                bad = [s for s in got if s >= 0 and s != expected]
                if bad:
                    self.link.warn("format", f"refused an object of {bad[0]} bytes under "
                                   f"{fmt.namespace()} (the format holds {expected})")
                return  # HiCache uses the leading run only: stop at the first hole
            filled[i] = True

    def _get(self, client: Any, names: list[str], objects: list[list[memoryview]],
             expected: int, budget_s: float | None) -> list[int]:
        """Per object: its size, or <0 (miss / late / refused); cut at the first hole
        (prefix=True)."""
        try:
            return self._read(client, names, objects, budget_s)
        except InvalidArgument as e:
            # An object under one of our keys is not of the format's size: the SDK refuses the
            # batch before any byte moves (BufferTooSmall: larger; InvalidArgument: parts that
            # would not be filled exactly). Serve the pages before it, one by one.
            self.link.warn("format", f"refused an object of another size: {e}")
        out: list[int] = []
        for name, parts in zip(names, objects, strict=True):
            try:
                (size,) = self._read(client, [name], [parts], None) or (-1,)
            except InvalidArgument:
                size = -1
            out.append(size)
            if size != expected:
                break
        return out

    @staticmethod
    def _read(client: Any, names: list[str], objects: list[list[memoryview]],
              budget_s: float | None) -> list[int]:
        opts: dict[str, Any] = {} if budget_s is None else {"timeout_s": max(budget_s, 0.0),
                                                           "prefix": True}
        return list(client.get_many_into_parts(names, objects, **opts))

    def _record(self, op: str, page_count: int, page_bytes: int, started: float) -> None:
        if page_count <= 0 or len(self._stats[f"{op}_pgs"]) >= MAX_STATS_SAMPLES:
            return
        seconds = max(time.monotonic() - started, 1e-9)
        self._stats[f"{op}_pgs"].append(page_count)
        self._stats[f"{op}_bandwidth"].append(page_count * page_bytes / seconds / 1e9)
