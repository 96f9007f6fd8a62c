"""Where the bytes of a HiCache page live in SGLang's host KV pool, as zero-copy views.

What it owns
    `PoolPages`: for a registered host pool (`MHATokenToKVPoolHost` or `MLATokenToKVPoolHost`,
    layouts `layer_first`, `page_first`, `page_first_direct`), the Cellar objects of one page
    and, for each object, the memoryviews of the pool that hold it, in object order:
    - MHA: two objects per page, K then V (the rank's heads); MLA: one object per page.
    - `page_first` / `page_first_direct`: an object is one contiguous range of the pool.
    - `layer_first`: an object is one range per layer (scatter-gather), layer 0 first.
    An object's bytes are the same in every layout's reader of that layout, and the same as
    the matching half of SGLang's flat data page (`get_data_page`), so the generic
    (`batch_get`/`batch_set`) and zero-copy (`batch_get_v1`/`batch_set_v1`) paths share objects.

    The pointer arithmetic is SGLang's own: `get_page_buffer_meta(indices)` of the pool gives
    (pointer, size) per part; this module turns each into a view of the pool's buffer after
    checking that it lies inside the buffer and has the part size the geometry expects. When
    that meta is linear in a page's first token index (checked at registration against
    SGLang's answers for pages 0, 1 and the last; true of every supported pool), a batch's
    pointers come from that line instead of a call into SGLang per batch. A pointer outside
    the buffer is a broken invariant (an SGLang change), refused with `cellar.InvalidArgument`,
    never turned into a view.

What it must never do
    Copy a page (views only), or import sglang (it reads the pool object it is given).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cellar.errors import InvalidArgument

SUPPORTED_LAYOUTS = ("layer_first", "page_first", "page_first_direct")


@dataclass(frozen=True)
class PageGeometry:
    """How one page maps to Cellar objects."""

    is_mla: bool
    objects_per_page: int  # 2 (K, V) for MHA, 1 for MLA
    parts_per_object: int  # 1, or the layer count for layer_first
    part_bytes: int

    @property
    def object_bytes(self) -> int:
        return self.parts_per_object * self.part_bytes

    @property
    def page_bytes(self) -> int:
        return self.objects_per_page * self.object_bytes


def _raw_view(tensor: Any) -> memoryview:
    """The tensor's storage as one flat byte view (no copy): torch -> uint8 -> numpy."""
    import torch  # the engine's torch; only this room's SGLang modules use it

    if tensor.device.type != "cpu" or not tensor.is_contiguous():
        raise InvalidArgument("the host KV pool must be a contiguous CPU tensor")
    flat = tensor.reshape(-1).view(torch.uint8)
    return memoryview(flat.numpy()).cast("B")


class PoolPages:
    """Views of a host pool's pages; built once at `register_mem_pool_host`."""

    def __init__(self, pool: Any, *, is_mla: bool) -> None:
        layout = getattr(pool, "layout", None)
        if layout not in SUPPORTED_LAYOUTS:
            raise InvalidArgument(f"host pool layout {layout!r} is not supported by Cellar "
                                  f"(supported: {', '.join(SUPPORTED_LAYOUTS)})")
        self.pool = pool
        self.layout: str = layout
        self.page_size_tokens = int(pool.page_size)
        self.raw = _raw_view(pool.kv_buffer)
        self.base_ptr = int(pool.kv_buffer.data_ptr())
        ptrs, sizes = pool.get_page_buffer_meta(self._token_indices([0]))
        objects = 1 if is_mla else 2
        if not sizes or len(sizes) % objects or len(set(sizes)) != 1:
            raise InvalidArgument(f"unexpected page meta from {type(pool).__name__}: "
                                  f"{len(sizes)} parts of sizes {sorted(set(sizes))}")
        self.geometry = PageGeometry(is_mla=is_mla, objects_per_page=objects,
                                     parts_per_object=len(sizes) // objects,
                                     part_bytes=int(sizes[0]))
        if self.geometry.page_bytes != self.page_size_tokens * int(pool.size_per_token):
            raise InvalidArgument(f"page meta covers {self.geometry.page_bytes} bytes, the pool "
                                  f"holds {self.page_size_tokens * int(pool.size_per_token)} "
                                  "per page")
        self._linear = self._learn_linear(ptrs)

    def _learn_linear(self, page0: list[int]) -> tuple[int, list[int]] | None:
        """(bytes per token, each part's offset at token 0) when SGLang's meta is linear in a
        page's first token index, as every supported pool computes it (pointer = base + first
        token x stride + the part's offset); checked against SGLang's own answer for pages 1
        and the last. Then `views` needs no call into SGLang per batch (its Python loop over
        every part cost ~8% of a 256 MiB layer_first prefetch). None: ask SGLang every time."""
        pages = int(getattr(self.pool, "size", 0)) // self.page_size_tokens
        if pages < 2:
            return None
        rel = [int(p) - self.base_ptr for p in page0]
        p = self.page_size_tokens
        p1, _ = self.pool.get_page_buffer_meta(self._token_indices([1]))
        delta = int(p1[0]) - int(page0[0])
        if delta <= 0 or delta % p:
            return None
        stride = delta // p
        for page in (1, pages - 1):
            got, _ = self.pool.get_page_buffer_meta(self._token_indices([page]))
            if [int(x) - self.base_ptr for x in got] != [page * p * stride + r for r in rel]:
                return None
        return stride, rel

    def _part_offsets(self, host_indices: Any) -> list[int]:
        """Each part's byte offset in the pool, page by page, in SGLang's order."""
        if self._linear is not None:
            stride, rel = self._linear
            firsts = host_indices[::self.page_size_tokens].tolist()  # as SGLang reads them
            return [int(f) * stride + r for f in firsts for r in rel]
        ptrs, sizes = self.pool.get_page_buffer_meta(host_indices)
        n = self.geometry.part_bytes
        if len(sizes) != len(ptrs) or any(int(x) != n for x in sizes):
            raise InvalidArgument(f"page meta gave parts of sizes {sorted(set(map(int, sizes)))}"
                                  f", expected {n}")
        return [int(p) - self.base_ptr for p in ptrs]

    def _token_indices(self, pages: list[int]) -> Any:
        import torch

        p = self.page_size_tokens
        return torch.tensor([page * p + t for page in pages for t in range(p)], dtype=torch.int64)

    def page_count(self, host_indices: Any) -> int:
        n = int(host_indices.numel())
        if n % self.page_size_tokens:
            raise InvalidArgument(f"{n} host indices is not a whole number of "
                                  f"{self.page_size_tokens}-token pages")
        return n // self.page_size_tokens

    def views(self, host_indices: Any) -> list[list[list[memoryview]]]:
        """Per page, per object, the parts (views into the pool) holding that object."""
        pages = self.page_count(host_indices)
        if pages == 0:
            return []
        g = self.geometry
        per_page = g.objects_per_page * g.parts_per_object
        offsets = self._part_offsets(host_indices)
        if len(offsets) != pages * per_page:
            raise InvalidArgument(f"page meta gave {len(offsets)} parts for {pages} pages, "
                                  f"expected {pages * per_page}")
        # Checked and cut for the whole batch at once: a layer_first batch is thousands of
        # parts, and this runs for every backup and prefetch.
        n, raw = g.part_bytes, self.raw
        if min(offsets) < 0 or max(offsets) + n > raw.nbytes:
            bad = next(i for i, o in enumerate(offsets) if o < 0 or o + n > raw.nbytes)
            raise InvalidArgument(f"page part {bad % per_page} of page {bad // per_page} "
                                  f"({n} bytes at offset {offsets[bad]}) lies outside the "
                                  "host pool")
        parts = [raw[o:o + n] for o in offsets]
        k = g.objects_per_page
        # SGLang lists a page's parts part-major: (part 0 of each object), (part 1 ...), ...
        return [[parts[page * per_page + obj:(page + 1) * per_page:k] for obj in range(k)]
                for page in range(pages)]

    def flat_views(self, flat_page: Any) -> list[memoryview]:
        """A flat data page tensor (generic path) cut into its objects' byte views."""
        raw = _raw_view(flat_page)
        g = self.geometry
        if raw.nbytes != g.page_bytes:
            raise InvalidArgument(f"flat page of {raw.nbytes} bytes, the format's page holds "
                                  f"{g.page_bytes}")
        n = g.object_bytes
        return [raw[i * n:(i + 1) * n] for i in range(g.objects_per_page)]
