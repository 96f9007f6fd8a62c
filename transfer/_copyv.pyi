from array import array

def copy_pieces(table: array) -> None:
    """memmove each (dst address, src address, bytes) int64 triple, with the GIL released."""
