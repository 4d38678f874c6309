"""Stage bodies' garbage collections skip older objects, and the skipped objects come back."""

from __future__ import annotations

import gc
import subprocess
import sys

from edgebuild.collections_scope import older_objects_frozen


class _Cycle:
    def __init__(self):
        self.me = self


def test_nested_scopes_unfreeze_with_the_outer_one():
    assert gc.get_freeze_count() == 0
    with older_objects_frozen():
        outer = gc.get_freeze_count()
        assert outer > 0
        with older_objects_frozen():
            assert gc.get_freeze_count() >= outer
        assert gc.get_freeze_count() >= outer  # the inner scope left it frozen
    assert gc.get_freeze_count() == 0


def test_young_objects_are_collected_less_often_inside_and_as_before_after():
    before = gc.get_threshold()
    with older_objects_frozen():
        with older_objects_frozen():
            inside = gc.get_threshold()
        assert gc.get_threshold() == inside  # the inner scope leaves the outer one's setting
    assert inside[0] >= 100_000 and inside[1:] == before[1:]
    assert gc.get_threshold() == before


def test_a_switched_off_collector_stays_off():
    before = gc.get_threshold()
    gc.set_threshold(0)
    try:
        with older_objects_frozen():
            assert gc.get_threshold()[0] == 0
    finally:
        gc.set_threshold(*before)


def test_a_scope_collects_its_own_garbage_as_it_ends():
    import weakref

    with older_objects_frozen(collect_at_end=True):
        made = _Cycle()
        alive = weakref.ref(made)
        del made
    assert alive() is None


def test_the_command_freezes_the_collector_as_it_exits():
    code = ("import atexit, gc\nfrom edgebuild.__main__ import skip_collections_at_exit\n"
            "skip_collections_at_exit()\natexit.register(lambda: print(gc.get_freeze_count()))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    # the handler registered later ran first, before the freeze
    assert done.stdout.strip() == "0"
