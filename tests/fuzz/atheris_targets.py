"""Coverage-guided fuzzing of the decoders with atheris (`make fuzz`; not collected by pytest).

    python tests/fuzz/atheris_targets.py frame|servicer|http [libFuzzer flags, e.g. -atheris_runs=200000]

Targets (each input is raw bytes; a crash is any exception the code under test does not raise
on purpose, or a broken invariant):
- frame: a request header, write meta and commit meta (cellar.transfer.frame): FrameError or
  values within the limits;
- servicer: the first byte picks an RPC, the second a credential, the rest is its request
  message (the credential's header appended), through
  MasterServicer.dispatch over a seeded MasterService: never INTERNAL; a refused request changes
  nothing stored;
- http: an HTTP request to the master's admin API (cellar.http + cellar.master.serving.http_api): a
  response below 500; a refused request changes nothing stored.
"""

from __future__ import annotations

import asyncio
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import atheris  # noqa: E402

with atheris.instrument_imports():
    from fuzzkit import CREDENTIALS, fingerprint, seeded_servicer  # noqa: E402

    from cellar.http import Response  # noqa: E402
    from cellar.master.serving.http_api import build_http  # noqa: E402
    from cellar.master.serving.metrics import make_registry  # noqa: E402
    from cellar.master.serving.servicer import MasterServicer  # noqa: E402
    from cellar.proto import cellar_pb2 as pb  # noqa: E402
    from cellar.transfer.frame import (  # noqa: E402
        MAX_META_BYTES,
        OPS_COMMIT_LIKE,
        REQUEST,
        FrameError,
        decode_commit_meta,
        decode_request,
        decode_write_meta,
    )

MAX_PAYLOAD = 64 << 20
INTERNAL = 13
NAMES = sorted(MasterServicer._messages())


def frame(data: bytes) -> None:
    head, meta = data[:REQUEST.size], data[REQUEST.size:]
    if len(head) == REQUEST.size:
        try:
            req = decode_request(head, max_payload_bytes=MAX_PAYLOAD)
            assert req.meta_len <= MAX_META_BYTES
            assert req.length <= MAX_PAYLOAD or req.op in OPS_COMMIT_LIKE
        except FrameError:
            pass
    for decode in (decode_write_meta, decode_commit_meta):
        try:
            decode(meta)
        except FrameError:
            pass


_SERVICER = None


def servicer(data: bytes) -> None:
    global _SERVICER
    if _SERVICER is None:
        _SERVICER = seeded_servicer()
    if len(data) < 2:
        return
    name = NAMES[data[0] % len(NAMES)]
    # protobuf merges concatenated messages: a header carrying a credential, appended, gets
    # most inputs past authentication to the handler itself
    token = CREDENTIALS[data[1] % len(CREDENTIALS)]
    suffix = pb.KeysRequest(header=pb.RequestHeader(token=token)).SerializeToString()
    before = fingerprint(_SERVICER.service)
    code, out = _SERVICER.dispatch(name, bytes(data[2:]) + suffix)
    assert code != INTERNAL, (name, out)
    if code:
        assert fingerprint(_SERVICER.service) == before, (name, code, out)


_HTTP = None


def http(data: bytes) -> None:
    global _HTTP, _SERVICER
    if _HTTP is None:
        _SERVICER = seeded_servicer(max_tenants=50)
        _HTTP = build_http(_SERVICER.leadership,
                           make_registry(_SERVICER.leadership, _SERVICER.stats),
                           _SERVICER.authorizer)
    assert _SERVICER is not None

    async def run() -> Response:
        reader = asyncio.StreamReader(limit=16 * 1024)
        reader.feed_data(bytes(data))
        reader.feed_eof()
        try:
            return await _HTTP._handle(reader)  # type: ignore[union-attr]
        except (ValueError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, UnicodeError):
            return Response(400)

    before = fingerprint(_SERVICER.service)
    response = asyncio.run(run())
    assert response.status < 500, response.body
    if response.status != 200:
        assert fingerprint(_SERVICER.service) == before


TARGETS = {"frame": frame, "servicer": servicer, "http": http}

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in TARGETS:
        sys.exit(f"usage: {sys.argv[0]} {'|'.join(TARGETS)} [libFuzzer flags]")
    target = TARGETS[sys.argv.pop(1)]
    atheris.Setup(sys.argv, target)
    atheris.Fuzz()
