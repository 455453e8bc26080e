import gc
import threading

from engine.memory.collector import frozen_objects


def test_objects_alive_on_entry_are_frozen_while_blocks_run_and_given_back_after():
    assert gc.get_freeze_count() == 0
    with frozen_objects():
        frozen = gc.get_freeze_count()
        assert frozen > 0
        with frozen_objects():  # a nested call freezes nothing more
            assert gc.get_freeze_count() == frozen
        assert gc.get_freeze_count() == frozen  # only the outermost exit unfreezes
    assert gc.get_freeze_count() == 0


def test_garbage_made_while_blocks_run_is_still_collected():
    class Node:
        pass

    with frozen_objects():
        a, b = Node(), Node()
        a.other, b.other = b, a  # a cycle: only the collector frees it
        del a, b
        assert gc.collect() >= 2


def test_a_process_that_froze_objects_itself_keeps_its_freeze():
    gc.freeze()
    try:
        before = gc.get_freeze_count()
        with frozen_objects():
            assert gc.get_freeze_count() == before
        assert gc.get_freeze_count() == before
    finally:
        gc.unfreeze()


def test_engines_in_two_threads_unfreeze_once_the_last_one_leaves():
    entered, leave = threading.Barrier(2), threading.Event()  # both inside at once
    seen = []

    def run():
        with frozen_objects():
            entered.wait()
            leave.wait()
            seen.append(gc.get_freeze_count())

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    leave.set()
    for t in threads:
        t.join()
    assert len(seen) == 2 and min(seen) > 0
    assert gc.get_freeze_count() == 0
