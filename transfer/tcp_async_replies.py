"""How an asyncio TCP channel (`tcp_async._Channel`) reads the reply to its oldest frame.

The reply is read by a synchronous stepper, not a coroutine per frame: `_advance` moves it on
as far as the socket allows without waiting and says whether it is complete; the channel's
reader task awaits readability only when it is not. 64 replies that are already in the socket
buffer then cost no coroutine and no loop turn. Where the reply stands between two calls:
_stage 0 = its header, 1 = its payload (`_rest` still to fill, `_left` bytes to go), 2 = its
error message (`_error`), 3 = a write's receipt. A read that wants its checksum is hashed as
it lands (`tcp_reads.frame_digest`), HASHED_PIECE_BYTES at a time, as the threaded transport
does.

It owns only the stepper's state; the channel owns the socket, the inbox and the frames.
"""

from __future__ import annotations

import socket
from typing import Any

from xxhash import xxh3_64, xxh3_64_intdigest

from cellar.transfer._sockio import MAX_IOV, Inbox, PeerClosed, advance_views
from cellar.transfer.base import hash_views
from cellar.transfer.frame import OP_READ, RESP_FLAG_CLOSE, RESPONSE, ST_OK
from cellar.transfer.tcp_async_frames import Frame
from cellar.transfer.tcp_plan import check_response
from cellar.transfer.tcp_reads import HASHED_PIECE_BYTES, frame_digest, frame_hashed

SCRATCH_BYTES = 256 << 10  # where a cancelled frame's payload is received and dropped
RESPONSE_SIZE = RESPONSE.size
_HEADER, _PAYLOAD, _MESSAGE, _RECEIPT = 0, 1, 2, 3  # the stages of reading one reply


class ReplyStepper:
    """The reply-reading half of a channel; `init_reader` sets its state."""

    sock: socket.socket
    inbox: Inbox
    pool: Any                              # tcp_async._Pool (its address names errors)
    load_bytes: int

    def init_reader(self) -> None:
        self._scratch: memoryview | None = None
        self._stage = _HEADER                  # where the oldest reply stands (`_advance`)
        self._rest: list[memoryview] = []
        self._left = 0
        # a payload hashed as it lands (tcp_reads.frame_digest): its digest, and how much of
        # the frame's one view the digest has had
        self._digest: xxh3_64 | None = None
        self._hashed_to = 0
        self._error: tuple[int, int, int] = (ST_OK, 0, 0)

    def _advance(self, frame: Frame) -> bool:
        if self._stage == _HEADER and not self._read_header(frame):
            return False
        if self._stage == _PAYLOAD:
            if not self._read_payload(frame):
                return False
            op_i, offset, views, size, _ = frame.chunk
            digest, self._digest = self._digest, None
            if not frame.cancelled:
                if digest is not None:
                    frame_hashed(frame.plan, op_i, offset, size, digest)
                elif frame.plan.hashed[op_i]:
                    frame.plan.sums[op_i] = (xxh3_64_intdigest(views[0]) if len(views) == 1
                                             else hash_views(views))
            self._stage = _HEADER
            frame.finish()
            return True
        if self._stage == _MESSAGE:
            status, msg_len, flags = self._error
            try:
                msg = bytes(self.inbox.take(msg_len)).decode("utf-8", "replace")
            except BlockingIOError:
                return False
            self._stage = _HEADER
            frame.finish(status, f"{self.pool.address}: {msg}")
            if flags & RESP_FLAG_CLOSE:
                raise PeerClosed(f"node closed the connection after: {msg}")
            return True
        if self._stage == _RECEIPT:  # a write's OK reply that carries its receipt
            try:
                receipt = bytes(self.inbox.take(self._error[1]))
            except BlockingIOError:
                return False
            self._stage = _HEADER
            frame.plan.receipts[frame.chunk[0]] = receipt
            frame.finish()
            return True
        return True  # a write's reply: the header was all of it

    def _read_header(self, frame: Frame) -> bool:
        """The header and, for a read, its first payload bytes straight into its first view;
        False if the header is not all there yet (nothing consumed then)."""
        inbox = self.inbox
        _, _, views, size, _ = frame.chunk
        is_read = frame.op_code == OP_READ
        try:
            if is_read and size and not frame.cancelled:
                head, early = inbox.take_scatter(RESPONSE_SIZE, views[0])
            else:
                head, early = inbox.take(RESPONSE_SIZE), 0
        except BlockingIOError:
            return False
        status, flags, msg_len, length = check_response(head, frame.rid, size, is_read)
        self.load_bytes -= size
        if status == ST_OK:
            if is_read:
                self._rest = [] if frame.cancelled else inbox.drain_into(views, early)
                self._left = size - early if frame.cancelled else sum(len(v) for v in self._rest)
                self._stage = _PAYLOAD
                if not frame.cancelled and len(views) == 1:
                    op_i, offset = frame.chunk[0], frame.chunk[1]
                    self._digest = frame_digest(frame.plan, op_i, offset, size)
                    self._hashed_to = 0
            elif length:
                self._error = (status, length, flags)
                self._stage = _RECEIPT
            else:
                frame.finish()
            return True
        if early:  # not payload after all: the error message and whatever follows it
            inbox.unread(views[0][:early])
            views[0][:early] = bytes(early)  # no refusal text left in the caller's buffer
        self._error = (status, msg_len, flags)
        self._stage = _MESSAGE
        return True

    def _read_payload(self, frame: Frame) -> bool:
        """The rest of a read's payload into its views, into scratch once it is cancelled
        (checked before every receive: never into the caller's view); False when the socket
        has nothing more for now."""
        rest = self._rest
        while self._left:
            if frame.cancelled:
                self._left -= self.inbox.discard_buffered(self._left)
                if not self._left:
                    break
                if self._scratch is None:
                    self._scratch = memoryview(bytearray(SCRATCH_BYTES))
                targets = [self._scratch[:min(self._left, SCRATCH_BYTES)]]
            elif self._digest is not None:  # HASHED_PIECE_BYTES at a time, each hashed on landing
                self._hash_landed(frame, HASHED_PIECE_BYTES)
                targets = [rest[0][:HASHED_PIECE_BYTES]]
            else:
                targets = rest[:MAX_IOV]
            try:
                got = self.sock.recvmsg_into(targets)[0]
            except (BlockingIOError, InterruptedError):
                return False
            if not got:
                raise PeerClosed("peer closed the connection")
            self._left -= got
            if not frame.cancelled:
                advance_views(rest, got)
        if self._digest is not None and not frame.cancelled:
            self._hash_landed(frame, 0)
        self._rest = []
        return True

    def _hash_landed(self, frame: Frame, at_least: int) -> None:
        """Feed the digest what landed in the frame's view since it last did, once that is at
        least `at_least` bytes (0: whatever there is)."""
        assert self._digest is not None
        view = frame.chunk[2][0]
        landed = len(view) - self._left
        if landed - self._hashed_to >= max(at_least, 1):
            self._digest.update(view[self._hashed_to:landed])
            self._hashed_to = landed
