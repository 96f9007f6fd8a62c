def spin(fd: int, window_ns: int) -> bool:
    """Poll `fd` until readable or `window_ns` ends, with the GIL released; reads nothing."""
