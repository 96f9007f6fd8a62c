"""TLS for the HTTP server (`http_tls`), run over a connection the server already admitted.

Why not the event loop's own TLS (`ssl=` on the server, or `StreamWriter.start_tls`): with the
loop's TLS the server meets a connection only once its handshake ended, so the connection
limits (`http_max_connections`, per peer) would not bound a stranger's half-done handshakes;
and upgrading an admitted stream loses the bytes the stream read before the upgrade (the
client sends its ClientHello at once; under uvloop, which starts reading right after
`connection_made` whatever the protocol paused, the race was lost about one time in three).
Here the TLS state machine (`ssl.SSLObject` over two `MemoryBIO`s) takes the stream's bytes as
they come, those it already buffered first, and the server reads and writes the decrypted
request and reply through `TlsReader` and `TlsWriter`, which offer the two stream methods the
server uses (`readuntil`, `readexactly`) and the writer's (`write`, `drain`, `close`,
`transport`).

Bounds: the handshake must end by the caller's deadline (the header deadline); raw bytes are
read RAW_CHUNK_BYTES at a time and decrypted on demand, never ahead of what the server asked
for plus one record; `readuntil` keeps at most `limit` bytes, as a StreamReader's would.
"""

from __future__ import annotations

import asyncio
import ssl

RAW_CHUNK_BYTES = 64 << 10  # ciphertext read from the socket at a time
PLAIN_CHUNK_BYTES = 64 << 10  # plaintext taken from the TLS object at a time


class _Tls:
    """One connection's TLS object and its two memory pipes."""

    def __init__(self, context: ssl.SSLContext, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter) -> None:
        self.incoming = ssl.MemoryBIO()
        self.outgoing = ssl.MemoryBIO()
        self.obj = context.wrap_bio(self.incoming, self.outgoing, server_side=True)
        self.reader = reader
        self.writer = writer

    def push(self) -> None:
        """Hand what the TLS object wants sent to the socket."""
        out = self.outgoing.read()
        if out:
            self.writer.write(out)

    async def pull(self, deadline: float | None) -> bool:
        """Feed the next ciphertext from the socket (False at its end)."""
        await self.writer.drain()
        read = self.reader.read(RAW_CHUNK_BYTES)
        if deadline is None:
            data = await read
        else:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                read.close()
                raise asyncio.TimeoutError()
            data = await asyncio.wait_for(read, left)
        if not data:
            self.incoming.write_eof()
            return False
        self.incoming.write(data)
        return True


async def handshake(context: ssl.SSLContext, reader: asyncio.StreamReader,
                    writer: asyncio.StreamWriter, deadline: float,
                    limit: int) -> tuple[TlsReader, TlsWriter]:
    """Run the server side of a handshake by `deadline` (loop time); the decrypted reader and
    the encrypting writer. Raises ssl.SSLError (a bad handshake), asyncio.TimeoutError,
    ConnectionError (the peer left first)."""
    tls = _Tls(context, reader, writer)
    while True:
        try:
            tls.obj.do_handshake()
            break
        except ssl.SSLWantReadError:
            tls.push()
            if not await tls.pull(deadline):
                raise ConnectionError("the peer closed the connection during the TLS "
                                      "handshake") from None
    tls.push()  # the handshake's last flight (and TLS 1.3 session tickets)
    return TlsReader(tls, limit), TlsWriter(tls)


class TlsReader:
    """The decrypted request: `readuntil` and `readexactly` as asyncio.StreamReader's."""

    def __init__(self, tls: _Tls, limit: int) -> None:
        self._tls = tls
        self._limit = limit
        self._buffer = bytearray()
        self._eof = False

    async def _more(self) -> bool:
        """Add the next plaintext to the buffer; False at the end of the stream."""
        tls = self._tls
        while not self._eof:
            try:
                data = tls.obj.read(PLAIN_CHUNK_BYTES)
            except ssl.SSLWantReadError:
                tls.push()
                if not await tls.pull(None):  # the caller's wait_for bounds the time
                    self._eof = True
                continue
            except ssl.SSLZeroReturnError:  # the peer's close_notify
                data = b""
            if not data:
                self._eof = True
                break
            self._buffer += data
            return True
        return False

    async def readuntil(self, separator: bytes) -> bytes:
        start = 0
        while True:
            found = self._buffer.find(separator, start)
            if found >= 0:
                end = found + len(separator)
                if end > self._limit:
                    raise asyncio.LimitOverrunError("separator found past the limit", found)
                out = bytes(self._buffer[:end])
                del self._buffer[:end]
                return out
            if len(self._buffer) > self._limit:
                raise asyncio.LimitOverrunError("separator not found within the limit",
                                                len(self._buffer))
            start = max(0, len(self._buffer) - len(separator) + 1)
            if not await self._more():
                partial = bytes(self._buffer)
                self._buffer.clear()
                raise asyncio.IncompleteReadError(partial, None)

    async def readexactly(self, n: int) -> bytes:
        while len(self._buffer) < n:
            if not await self._more():
                partial = bytes(self._buffer)
                self._buffer.clear()
                raise asyncio.IncompleteReadError(partial, n)
        out = bytes(self._buffer[:n])
        del self._buffer[:n]
        return out


class TlsWriter:
    """The encrypted reply: `write`, `drain`, `close` and `transport` as StreamWriter's."""

    def __init__(self, tls: _Tls) -> None:
        self._tls = tls
        self.transport = tls.writer.transport

    def write(self, data: bytes) -> None:
        self._tls.obj.write(data)
        self._tls.push()

    async def drain(self) -> None:
        await self._tls.writer.drain()

    def close(self) -> None:
        try:
            self._tls.obj.unwrap()  # close_notify: the reply ended here, not cut short
        except ssl.SSLError:
            pass  # the peer has not answered ours: nothing to wait for
        self._tls.push()
        self._tls.writer.close()
