import pytest


@pytest.fixture
def offload_copies(monkeypatch):
    """Every disk-tier layer converted into the offload folder, as for a format that changes the bytes, even where
    the checkpoint's own files could be read instead: the tests of that folder's files use it."""
    from engine.memory import weight_store

    monkeypatch.setattr(weight_store, "checkpoint_plans", lambda *args: {})
