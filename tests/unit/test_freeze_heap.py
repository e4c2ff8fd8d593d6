"""runtime.freeze_heap: what a service holds when it starts is left out of the
garbage collector's passes, what it makes later is not, and a cycle that was
garbage when a service was made again is still collected. Run in a process
of its own: freezing is process-wide, and the test runner's own objects must
not be frozen for the other tests."""

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import gc, weakref
    from cronwheel.runtime import freeze_heap

    class Node:
        pass

    def cycle():
        a, b = Node(), Node()
        a.other, b.other = b, a
        return a

    held = cycle()                 # the service's state when it starts
    freeze_heap()
    assert gc.get_freeze_count() > 1000, gc.get_freeze_count()
    tracked = {id(o) for g in range(3) for o in gc.get_objects(g)}
    assert id(held) not in tracked, "a started service's object is still walked"

    later = cycle()                # made after the start: collected as before
    tracked = {id(o) for g in range(3) for o in gc.get_objects(g)}
    assert id(later) in tracked, "an object made later is not walked"
    gone = []
    weakref.finalize(later, gone.append, "later")
    del later
    gc.collect()
    assert gone == ["later"], "a cycle made after the start was not collected"

    # The service made again (run_restarting): the last one's state, now a
    # cycle nobody holds, was frozen; the next freeze_heap collects it.
    weakref.finalize(held, gone.append, "held")
    del held
    gc.collect()
    assert gone == ["later"], "a frozen cycle was collected: freezing did nothing"
    freeze_heap()
    assert gone == ["later", "held"], gone
    print("ok")
    """
)


def test_freeze_heap__started_objects_left_out__later_ones_and_old_cycles_collected():
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
