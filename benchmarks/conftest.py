"""Each benchmark starts with a fresh session (jobs retrace; compiled steps come from the cache)."""
import pytest


@pytest.fixture(autouse=True)
def fresh_session():
    import flow
    flow.clear_default_session()
    yield
    flow.clear_default_session()
