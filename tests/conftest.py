import pytest

from tests.checkpoints import make_checkpoint


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory):
    """`checkpoint(variant)` builds (once per session) and returns the folder of a tiny random checkpoint."""
    made = {}

    def get(variant: str):
        if variant not in made:
            made[variant] = make_checkpoint(tmp_path_factory.mktemp(variant), variant)
        return made[variant]

    return get


@pytest.fixture(scope="session")
def tiny_llama_dir(checkpoint):
    return checkpoint("llama_gqa_llama3")
