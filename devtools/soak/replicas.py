"""Where a soak worker's key is stored: the node ids of its replicas, as the master says now.

Why
    After each acknowledged write a worker asks the master where the replicas are, so a later
    loss can be explained by what happened to those nodes (report.py `classify_loss`).

What it owns
    `ReplicaLocator`: a gRPC channel to the master (with --ha, to the leader etcd names, asked
    again after a failed call), one GetReplicas per question whose pin rides on the next one.

What it must never do
    Raise: a master that cannot say right now is None, and the loss stays unexplained.
"""

from __future__ import annotations

from typing import Any

from cellar.errors import Unavailable


class ReplicaLocator:
    """One worker's questions to the master about where its keys are."""

    def __init__(self, master: str) -> None:
        from cellar.coord.target import is_etcd_url, parse_etcd_url

        self._master = master
        self._channel: Any = None
        self._stub: Any = None
        self._stub_address = ""
        self._pending_pin = 0
        self._discovery: Any = None  # etcd:// (--ha): where the leader is
        self._leader_address = ""
        if is_etcd_url(master):
            from cellar.coord.discovery import LeaderDiscovery
            self._discovery = LeaderDiscovery(parse_etcd_url(master))

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
        if self._discovery is not None:
            self._discovery.close()

    def _master_address(self) -> str | None:
        """The gRPC address to ask for replicas: the master, or (etcd://) the leader in etcd."""
        if self._discovery is None:
            return str(self._master)
        if not self._leader_address:
            try:
                record = self._discovery.leader(timeout_s=1.0)
            except Unavailable:
                return None
            if record is None:  # an election is under way
                return None
            self._leader_address = record.address
        return self._leader_address

    def _forget_master(self) -> None:
        """After a failed call: ask etcd again next time (the leader may have changed)."""
        if self._discovery is None:
            return
        self._leader_address = ""
        if self._channel is not None:
            self._channel.close()
        self._channel = self._stub = None
        self._stub_address = ""
        self._pending_pin = 0  # a pin lives on the master that granted it

    def nodes_of(self, key: str) -> list[str] | None:
        """The node ids holding `key`'s replicas (None if the master cannot say right now)."""
        import grpc

        from cellar.client.connect_args import client_id, master_channel
        from cellar.proto import cellar_pb2 as pb
        from cellar.proto import cellar_pb2_grpc as pb_grpc

        address = self._master_address()
        if address is None:
            return None
        if self._stub is None or self._stub_address != address:
            if self._channel is not None:
                self._channel.close()
            # over TLS when a CA is known for it (--tls), as the SDK's own channel: a
            # plaintext channel to a TLS master failed every handshake, so a --tls soak never
            # knew where a key's replicas were (and its masters logged ~170 refused handshakes
            # a second)
            self._channel, _ca = master_channel(address, [])
            self._stub = pb_grpc.MasterStub(self._channel)
            self._stub_address = address
        from cellar.credentials import default_token

        # this process's client id, as its SDK client's: the master counts the lookup as this
        # process's read (master/state/read_trust.py), so this worker's own removes and
        # upserts are not held for a read trust nobody holds (a raw lookup keeps none)
        header = pb.RequestHeader(tenant="default", client_id=client_id(),
                                  token=default_token(address) or "")
        unpin = [self._pending_pin] if self._pending_pin else []
        try:
            reply = self._stub.GetReplicas(
                pb.GetReplicasRequest(header=header, keys=[key], unpin_ids=unpin), timeout=2.0)
        except grpc.RpcError:
            self._forget_master()
            return None
        self._pending_pin = 0
        if len(reply.results) != 1 or reply.results[0].status != pb.OK:
            return None
        result = reply.results[0]
        self._pending_pin = result.pin_id
        return sorted({r.node_id for r in result.replicas})
