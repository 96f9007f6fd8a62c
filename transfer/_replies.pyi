def read_replies(fd: int, inbox: bytearray, start: int, end: int,
                 items: list[tuple[int, memoryview]], deadline_ns: int,
                 max_bytes: int) -> tuple[int, int, int, int, int]:
    """Receive a run of OK READ replies with the GIL released (transfer/_replies.c says how)."""
