"""The one narrow interface through which the object lifecycle is observed.

The object table (objects.py) tells an observer, if one is attached, when a version becomes
visible (`stored`: a PutEnd completed it, or a rebuild adopted it from a node's report) and when a
visible version leaves (`dropped`: remove, eviction, upsert replacement, loss of every replica),
and when a visible version's serving tier changes (`moved`: a demotion to a node's disk tier, or
a promotion back, state/tiers.py; `on_disk` says where it is served from now).
RemoveAll is told as one `cleared` by the serving room around the call (it knows the request;
the table only sees one drop per object), with the drops inside it muted.

The contract: an observer is called on the master's one loop in the middle of a transition, so
it must only note the event and return (no I/O, no blocking, no exception, no table access
beyond reading the object's tenant name, key, size and engine hash); it never changes what
the table does.
KV events (master/serving/kv_events.py) are the one observer today.
"""

from __future__ import annotations

from typing import Protocol

from cellar.master.state.records import Obj


class LifecycleObserver(Protocol):
    def stored(self, obj: Obj) -> None: ...

    def dropped(self, obj: Obj) -> None: ...

    def moved(self, obj: Obj, on_disk: bool) -> None: ...
