"""ListKeys on a MasterService (master/listing.py): which keys a page holds, their order, the
page bound and `more`, and the refusals that change nothing."""

from __future__ import annotations

import random

import pytest
from test_master_support import SECRET, FakeClock, make_service, mount, put, put_start

from cellar.master.listing import key_page
from cellar.master.service import MasterService, PutEndItem, RequestRejected
from tests.support.receipts import receipts_for


@pytest.fixture
def svc() -> MasterService:
    service = make_service(FakeClock(), node_suspect_after_s=1000, node_expire_after_s=2000,
                           tenants={"default": {}, "other": {}}, max_list_keys=50)
    mount(service, "n1", 1)
    return service


def test_a_page_is_the_visible_keys_in_str_order(svc: MasterService) -> None:
    keys = ["b/2", "a/10", "a/9", "a/1", "é", "Z", "a/"]
    for key in keys:
        put(svc, key, 64)
    put_start(svc, "a/writing", 64)            # in flight: not listed
    put(svc, "a/gone", 64)
    svc.remove("", ["a/gone"])                 # removed: not listed
    put(svc, "a/theirs", 64, tenant="other")   # another tenant's: not listed
    assert svc.list_keys("", "", "", 50) == (sorted(keys), False)
    assert sorted(keys) == ["Z", "a/", "a/1", "a/10", "a/9", "b/2", "é"]  # code point order
    assert svc.list_keys("", "a/", "", 50) == (["a/", "a/1", "a/10", "a/9"], False)
    assert svc.list_keys("", "a/", "a/1", 2) == (["a/10", "a/9"], False)
    assert svc.list_keys("", "a/", "a/", 2) == (["a/1", "a/10"], True)
    assert svc.list_keys("", "", "é", 50) == ([], False)
    assert svc.list_keys("other", "", "", 50) == (["a/theirs"], False)


def test_the_writing_key_appears_once_its_put_ends(svc: MasterService) -> None:
    started = put_start(svc, "w", 64)
    assert svc.list_keys("", "", "", 5) == ([], False)
    svc.put_end("", "writer", [PutEndItem("w", started.put_id, 1, receipts_for(SECRET, started, 1))])
    assert svc.list_keys("", "", "", 5) == (["w"], False)


def test_walking_pages_lists_every_key_once(svc: MasterService) -> None:
    keys = [f"k/{i}" for i in range(37)]
    for key in keys:
        put(svc, key, 64)
    for limit in (1, 5, 36, 37, 50):
        seen: list[str] = []
        start_after, more = "", True
        while more:
            page, more = svc.list_keys("", "k/", start_after, limit)
            assert len(page) <= limit and (not more or len(page) == limit)
            seen += page
            start_after = page[-1] if page else start_after
        assert seen == sorted(keys), limit


@pytest.mark.parametrize(("prefix", "start_after", "limit", "says"), [
    ("", "", 0, "max_list_keys"),
    ("", "", 51, "max_list_keys"),
    ("x" * 1025, "", 10, "prefix"),
    ("", "é" * 513, 10, "start_after"),     # 1026 bytes in UTF-8, 513 characters
])
def test_a_bad_request_is_refused_and_changes_nothing(svc: MasterService, prefix: str,
                                                      start_after: str, limit: int, says: str) -> None:
    put(svc, "k", 64)
    with pytest.raises(RequestRejected, match=says) as info:
        svc.list_keys("", prefix, start_after, limit)
    assert info.value.code == "INVALID_ARGUMENT"
    assert svc.list_keys("", "", "", 50) == (["k"], False)
    with pytest.raises(RequestRejected, match="unknown tenant"):
        svc.list_keys("nobody", "", "", 10)


def test_key_page_matches_sorting_everything() -> None:
    rng = random.Random(7)
    alphabet = "ab/é\U0001f600"
    for _ in range(200):
        keys = {"".join(rng.choices(alphabet, k=rng.randint(1, 4))) for _ in range(rng.randint(0, 40))}
        prefix = "".join(rng.choices(alphabet, k=rng.randint(0, 2)))
        start_after = "".join(rng.choices(alphabet, k=rng.randint(0, 3)))
        limit = rng.randint(1, 10)
        want = sorted(k for k in keys if k.startswith(prefix) and k > start_after)
        assert key_page(keys, prefix, start_after, limit) == (want[:limit], len(want) > limit)
        # str order is UTF-8 byte order, so a client comparing bytes pages alike
        assert sorted(want, key=lambda k: k.encode()) == want
