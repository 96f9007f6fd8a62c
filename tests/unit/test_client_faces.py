"""The two faces expose the same API: every public method of `cellar.Client` exists on
`cellar.AsyncClient` as a coroutine with the same parameters (names, kinds, defaults)."""

from __future__ import annotations

import inspect

import cellar

SYNC_ONLY = {"close"}          # AsyncClient.close is aclose (a coroutine), checked below
ASYNC_ONLY = {"aclose", "open"}


def public(cls: type) -> dict[str, object]:
    return {name: member for name, member in vars(cls).items()
            if not name.startswith("_") and callable(member)}


def test_same_methods_same_parameters():
    sync, aio = public(cellar.Client), public(cellar.AsyncClient)
    assert set(sync) - SYNC_ONLY == set(aio) - ASYNC_ONLY - {"close"}
    for name in set(sync) - SYNC_ONLY:
        assert inspect.iscoroutinefunction(aio[name]), name
        assert not inspect.iscoroutinefunction(sync[name]), name
        s_params = list(inspect.signature(sync[name]).parameters.values())
        a_params = list(inspect.signature(aio[name]).parameters.values())
        assert [(p.name, p.kind, p.default) for p in s_params] == \
            [(p.name, p.kind, p.default) for p in a_params], name
    assert inspect.iscoroutinefunction(cellar.AsyncClient.aclose)
    assert cellar.AsyncClient.close is cellar.AsyncClient.aclose


def test_the_contracts_new_methods_are_on_both_faces():
    wanted = {"put_many", "get_many_into", "register_buffer", "unregister_buffer", "put_from",
              "get_into_ptr", "put_many_from", "get_many_into_ptrs", "put_parts",
              "get_into_parts", "put_many_parts", "get_many_into_parts", "put_tensor",
              "get_tensor", "get_tensor_into", "put_tensors", "get_tensors", "prefix_len",
              "exists_many"}
    assert wanted <= set(public(cellar.Client)) and wanted <= set(public(cellar.AsyncClient))
    params = inspect.signature(cellar.Client.get_many_into).parameters
    assert params["timeout_s"].default is None and params["prefix"].default is False
    assert inspect.signature(cellar.Client.put_many).parameters["upsert"].default is False
    assert (cellar.MISS, cellar.LATE) == (-1, -2)
