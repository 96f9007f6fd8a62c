"""What loading costs this client: its own measured master round trip and read throughput.

`lookup` (client/lookup.py) turns the bytes of a leading run into an estimated load time for
this client, and that estimate must come from what this client has seen, not a constant: a
client on the nodes' host reads over shm at memory speed, one across a network over tcp at
that link's speed, one behind a loaded node slower still.

What it records (the faces' `FlowRun` calls these after each effect):
- `rpc`: the round trip of each metadata call a load makes (GetReplicas; Lookup, PrefixLen and
  Exists cost the same line), the last `WINDOW` of them;
- `read`: each read round (a `Move` of kind "read"): the transport that carried most of its
  bytes, the bytes, the seconds; the last `WINDOW` per transport;
- `load`: each whole get call that returned bytes, start to finish (its round trips, its
  reads and this process's own per-key work: on a loaded 2-core host that work is most of a
  load, and a transport-only figure underestimated it 2.6x), the last `WINDOW`.

The estimate for B bytes: B at the median seconds per byte of the recent whole loads, when
there are any (what a load of that size took this client lately, round trips included);
otherwise the median metadata round trip plus B over the read throughput of the transport used
last (bytes over seconds summed across its window). Before any read it uses
`PRIOR_BYTES_PER_S` and says so (`basis` = "prior"); before any round trip, `PRIOR_RTT_S`. Thread-safe (the sync face records from many threads),
bounded (a fixed window per transport, at most `MAX_TRANSPORTS` transports), no I/O.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass

WINDOW = 32                      # recent samples kept per kind (round trips; reads per transport)
MAX_TRANSPORTS = 8               # tcp, shm, rdma, ...: names beyond this are not recorded
PRIOR_RTT_S = 2e-4               # before any round trip was measured (the fast line's order)
PRIOR_BYTES_PER_S = 1 << 30      # before any read was measured (1 GiB/s)
LOAD_RPCS = frozenset({"GetReplicas", "Lookup", "PrefixLen", "Exists"})


@dataclass(frozen=True, slots=True)
class LoadEstimate:
    load_s: float           # rtt_s + nbytes / bytes_per_s
    rtt_s: float            # the metadata round trip it assumes
    bytes_per_s: float      # the read throughput it assumes
    transport: str          # whose throughput ("" before any read)
    basis: str              # "measured" | "prior" (no read measured yet)


class LoadCosts:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rtts: deque[float] = deque(maxlen=WINDOW)
        self._reads: dict[str, deque[tuple[int, float]]] = {}
        self._last = ""
        self._loads: deque[float] = deque(maxlen=WINDOW)  # seconds per byte of whole loads

    def rpc(self, method: str, seconds: float) -> None:
        if method in LOAD_RPCS and seconds > 0:
            with self._lock:
                self._rtts.append(seconds)

    def read(self, transport: str, nbytes: int, seconds: float) -> None:
        if nbytes <= 0 or seconds <= 0:
            return
        with self._lock:
            window = self._reads.get(transport)
            if window is None:
                if len(self._reads) >= MAX_TRANSPORTS:
                    return
                window = self._reads[transport] = deque(maxlen=WINDOW)
            window.append((nbytes, seconds))
            self._last = transport

    def load(self, nbytes: int, seconds: float) -> None:
        """A whole get call that returned `nbytes`, start to finish."""
        if nbytes > 0 and seconds > 0:
            with self._lock:
                self._loads.append(seconds / nbytes)

    def estimate(self, nbytes: int) -> LoadEstimate:
        assert nbytes >= 0
        with self._lock:
            rtts = sorted(self._rtts)
            transport = self._last
            window = list(self._reads.get(transport, ()))
            loads = sorted(self._loads)
        rtt_s = rtts[len(rtts) // 2] if rtts else PRIOR_RTT_S
        if loads and window:  # whole loads include the round trip: no separate rtt term
            per_byte_s = loads[len(loads) // 2]
            return LoadEstimate(nbytes * per_byte_s, rtt_s, 1.0 / per_byte_s, transport,
                                "measured")
        if window:
            rate = sum(n for n, _ in window) / sum(s for _, s in window)
            basis = "measured"
        else:
            rate, basis = float(PRIOR_BYTES_PER_S), "prior"
        load_s = rtt_s + nbytes / rate if nbytes else 0.0
        return LoadEstimate(load_s, rtt_s, rate, transport, basis)
