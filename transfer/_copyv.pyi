from array import array

def copy_pieces(table: array | bytes) -> None:
    """memmove each (dst address, src address, bytes) int64 triple, with the GIL released."""

def cut_runs(views: object, span_address: int, to_span: bool, step: int,
             hashed: bool) -> tuple[list[tuple[bytes, int, int]], int]:
    """memcopy._runs in C: (runs of (int64 triples, hash mark or -1, bytes), total bytes)."""
