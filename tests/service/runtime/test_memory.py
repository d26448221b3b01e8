"""The heap after a model is loaded: what loading made is set aside from the cycle collector, so
that a collection set off by a large request does not walk it under the interpreter lock (it
paused Health for a second in a process of three million objects); an unload's full collection
still reaches it."""

from __future__ import annotations

import gc
import weakref

from service.runtime.memory import collect_all, freeze_loaded


class _Node:
    pass


def _cycle() -> weakref.ref:
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    return weakref.ref(a)


def test_what_loading_made_is_out_of_reach_of_collections_until_an_unload_collects_all():
    try:
        gone_before = _cycle()  # garbage already when the model is loaded: collected, not kept
        kept = [_Node() for _ in range(1000)]
        freeze_loaded()
        assert gone_before() is None
        assert gc.get_freeze_count() >= len(kept)
        tracked = len(gc.get_objects())
        assert tracked < gc.get_freeze_count()  # a collection now walks only what came after

        frozen_cycle = _cycle()
        gc.freeze()  # a cycle that was alive at a load and is garbage now (an unloaded version's)
        gc.collect()
        assert frozen_cycle() is not None  # an ordinary collection does not reach it
        collect_all()
        assert frozen_cycle() is None
        assert gc.get_freeze_count() > 0  # what is still alive is set aside again
    finally:
        gc.unfreeze()


def test_the_allocators_bytes_in_use_follow_what_is_allocated_and_freed():
    """A model version's size counts what its load allocated even where the load reuses memory an
    eviction freed (service.repository.residency): the allocator's own count of bytes in use."""
    import numpy as np

    from service.runtime.memory import heap_in_use_bytes

    before = heap_in_use_bytes()
    block = np.ones(64 << 20, dtype=np.uint8)  # 64 MiB through malloc
    held = heap_in_use_bytes()
    del block
    after = heap_in_use_bytes()
    # Other threads of the test process allocate and free meanwhile: within 16 MiB.
    assert before > 0
    assert held - before >= 48 << 20
    assert held - after >= 48 << 20
