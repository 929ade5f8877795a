import pytest

from dashboard.memory.queue import get_build_queue


@pytest.fixture
def queue(app):
    """This run's build queue, empty before and after the test."""
    queue = get_build_queue(app)
    queue.empty()
    yield queue
    queue.empty()
