"""A change of embedding model: every user's memory is rebuilt in it, a batch at a time,
resumable from the data; each user's recall works throughout (in the old model's vectors
until their rebuild commits) and afterwards uses the new vectors only."""

from __future__ import annotations

from sqlalchemy import select

from dashboard.extensions import db
from dashboard.memory import (
    OWN_CUT,
    MemoryBuild,
    MemoryChunk,
    execute_build,
    get_embedder,
    model_change_progress,
    request_build,
    request_model_change_builds,
    search_memory,
    settings_from,
)
from dashboard.memory import search as search_module
from dashboard.memory.embedders import HashingEmbedder
from dashboard.memory.model_change import MODEL_CHANGE
from tests.factories import ShiftedHashingEmbedder, make_memory

NEW = "tests.factories:ShiftedHashingEmbedder"
TOPICS = ("aisle seats on long flights", "green tea without sugar", "metric units always",
          "dark mode in every editor", "tabs over spaces")


def _recalls_everyone(session, world, embedder) -> bool:
    for user_id, topic in world:
        hits = search_memory(session, user_id, topic.split()[0], 3, embedder=embedder,
                             max_distance=OWN_CUT)
        if [h.content for h in hits][:1] != [f"Remember: {topic}"]:
            return False
    return True


def _models(session, world) -> set[str]:
    return set(session.scalars(select(MemoryChunk.embedding_model).distinct().where(
        MemoryChunk.user_id.in_([u for u, _ in world]))))


def test_switching_models_rebuilds_everyone_in_batches_and_recall_never_stops(
        app, committed, queue, monkeypatch):
    session = committed.session
    settings = settings_from(app.config)
    world = []
    for topic in TOPICS:
        user = committed.user()
        make_memory(session, user, f"Remember: {topic}")
        world.append((user.id, topic))
    session.commit()
    old = HashingEmbedder()
    for user_id, _ in world:
        build = request_build(session, user_id, trigger="admin", mode="full")
        session.commit()
        assert execute_build(db.engine, build.build_id, settings=settings,
                             embedder=old) == "succeeded"
    assert _models(session, world) == {old.name}

    monkeypatch.setitem(app.config, "EMBEDDER", NEW)
    new = get_embedder(NEW)
    assert isinstance(new, ShiftedHashingEmbedder)
    before = model_change_progress(session, new.name)
    assert before.done == 0 and before.left >= len(world) and before.under_way
    assert _recalls_everyone(session, world, new)  # nobody rebuilt yet: the old vectors

    rebuilt = 0
    while True:
        asked = request_model_change_builds(session, model=new.name, batch=2)
        session.commit()
        waiting = session.scalars(select(MemoryBuild.id).where(
            MemoryBuild.trigger == MODEL_CHANGE, MemoryBuild.status == "queued")
            .order_by(MemoryBuild.id)).all()
        assert len(waiting) <= 2  # never more than a batch waits
        if not waiting:
            assert asked == 0
            break
        # Asked again at once: the batch is full, nothing more is asked.
        assert request_model_change_builds(session, model=new.name, batch=2) == 0
        # One at a time, recall checked for everyone between each: some users are in the
        # new model, the rest still in the old one.
        assert execute_build(db.engine, waiting[0], settings=settings,
                             embedder=new) == "succeeded"
        rebuilt += 1
        session.expire_all()
        assert _recalls_everyone(session, world, new)
        progress = model_change_progress(session, new.name)
        assert progress.done == before.done + rebuilt
    assert rebuilt >= len(world)
    after = model_change_progress(session, new.name)
    assert after.left == 0 and not after.under_way
    assert _models(session, world) == {new.name}

    # Afterwards only the new model is asked: the old one is never looked up again.
    def no_other_model(model):
        raise AssertionError(f"looked up {model}")

    monkeypatch.setattr(search_module, "embedder_for_model", no_other_model)
    assert _recalls_everyone(session, world, new)


def test_a_query_in_one_model_finds_nothing_among_the_other_models_vectors(db_session):
    """What the test above relies on: the two models' vectors are strangers."""
    from tests.factories import make_user

    user = make_user(db_session)
    make_memory(db_session, user, "Remember: aisle seats")
    from dashboard.memory.pipeline import run_memory_build

    run_memory_build(user, "full", session=db_session, embedder=HashingEmbedder())
    from dashboard.memory.search import _exact

    vector = ShiftedHashingEmbedder().embed(["aisle"])[0]
    hits = _exact(db_session, user.id, vector, 3, HashingEmbedder.name)
    assert all(found.hit.distance > HashingEmbedder.match_distance for found in hits)


def test_the_staff_home_shows_how_far_a_model_change_has_come(app, client, auth, db_session,
                                                              monkeypatch):
    from dashboard.memory.pipeline import run_memory_build
    from tests.factories import make_user
    from tests.orbitpilot.dom import parse

    for topic in TOPICS[:3]:
        user = make_user(db_session)
        make_memory(db_session, user, f"Remember: {topic}")
        run_memory_build(user, "full", session=db_session, embedder=HashingEmbedder())
    admin = make_user(db_session, role="admin")
    db_session.commit()
    auth.login(admin.email)

    def panel():
        page = parse(client.get("/admin/").get_data(as_text=True))
        return page.find(data_model_change=True)

    assert panel().attrs["data-model-change"] == "done"
    assert HashingEmbedder.name in panel().normalized_text
    monkeypatch.setitem(app.config, "EMBEDDER", NEW)
    shown = panel()
    assert shown.attrs["data-model-change"] == "under-way"
    left = model_change_progress(db_session, ShiftedHashingEmbedder.name)
    assert f"0 of {left.total} users done" in shown.normalized_text
    assert shown.find("progress").attrs["max"] == str(left.total)
