"""HA masters keep the tokens the admin API creates and revokes in etcd (master/serving/
token_log.py): a token made on one leader is accepted by the next, whose token file never held
it, and a revocation (of an API token or of one from the file) holds across failovers too.
Real etcd, two real masters, one node; failovers by kill -9."""

from __future__ import annotations

import time
import urllib.error

import pytest

import cellar
from cellar.devtools.local_cluster import LocalCluster


def works(cluster: LocalCluster, token: str, key: str) -> bool:
    """Whether `token` may put and read back `key` (False when refused as unauthenticated)."""
    try:
        with cellar.connect(cluster.address, token=token, timeout_s=30) as client:
            client.upsert(key, key.encode())
            return client.get(key) == key.encode()
    except cellar.Unauthenticated:
        return False


def failover(cluster: LocalCluster, leader: int) -> int:
    """kill -9 the leader; the new leader's index once its node is mounted again."""
    cluster.kill_master(leader)
    new = cluster.leader(timeout_s=30, not_index=leader)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        status = cluster.master_status(new) or {}
        if any(s.get("state") == "ACTIVE" for s in status.get("segments", [])):
            return new
        time.sleep(0.1)
    raise AssertionError(f"the node did not mount on master {new} within 30 s")


def test_api_tokens_and_revocations_outlive_the_leader_that_made_them() -> None:
    with LocalCluster(1, "64MiB", ha=True, masters=2) as cluster:
        first = cluster.leader()
        file_before = cluster.tokens_path.read_bytes()

        def api(method: str, path: str, body: object = None) -> object:
            reply = cluster.admin_request(method, path, body)
            cluster.tokens_path.write_bytes(file_before)  # the file as a Secret keeps it
            return reply

        made = cluster.admin_request("POST", "/api/v1/tokens",
                                     {"kind": "tenant", "tenant": "default", "label": "api"})
        assert cluster.tokens_path.read_bytes() == file_before  # in etcd, not in the file
        assert works(cluster, made["token"], "k/made-on-the-first-leader")
        file_token = cluster.token  # the file's tenant token: revoked through the API below

        second = failover(cluster, first)
        assert works(cluster, made["token"], "k/after-the-first-failover")
        listed = {r["id"] for r in cluster.admin_request("GET", "/api/v1/tokens")}
        assert made["id"] in listed
        for token_id in (made["id"], file_token.split("_")[1]):
            reply = api("POST", "/api/v1/tokens/revoke", {"id": token_id})
            assert reply == {"id": token_id, "revoked": True}
        assert not works(cluster, made["token"], "k/revoked")
        assert not works(cluster, file_token, "k/revoked")
        with pytest.raises(urllib.error.HTTPError) as unknown:  # nothing to revoke twice
            cluster.admin_request("POST", "/api/v1/tokens/revoke", {"id": made["id"]})
        assert unknown.value.code == 404

        cluster.start_master(first)  # back as the standby, its file unchanged
        third = failover(cluster, second)
        assert third == first
        assert not works(cluster, made["token"], "k/revoked-after-the-second-failover")
        assert not works(cluster, file_token, "k/revoked-after-the-second-failover")
        listed = {r["id"] for r in cluster.admin_request("GET", "/api/v1/tokens")}
        assert made["id"] not in listed and file_token.split("_")[1] not in listed
        again = api("POST", "/api/v1/tokens", {"kind": "tenant", "tenant": "default"})
        assert isinstance(again, dict)
        assert works(cluster, again["token"], "k/a-token-of-the-third-leader")
