"""Audit log: indexes for paging newest-first under every filter, append-only checkpoints.

The audit view lists events by ``seq`` descending, filtered by action, actor, owner,
target, mode or date; each filter gets an index ending in ``seq`` so a page is an index
range read, whatever the log's size. Checkpoints refuse UPDATE, DELETE and TRUNCATE like
the events they vouch for.
"""
from alembic import op

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None

CHECKPOINT_GUARD = """
CREATE FUNCTION audit_checkpoints_refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit_checkpoints is append-only: % refused', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$;
CREATE TRIGGER audit_checkpoints_no_update_delete
    BEFORE UPDATE OR DELETE ON audit_checkpoints
    FOR EACH ROW EXECUTE FUNCTION audit_checkpoints_refuse_change();
CREATE TRIGGER audit_checkpoints_no_truncate
    BEFORE TRUNCATE ON audit_checkpoints
    FOR EACH STATEMENT EXECUTE FUNCTION audit_checkpoints_refuse_change();
"""

NEW_INDEXES = {
    "ix_audit_events_action_seq": ["action", "seq"],
    "ix_audit_events_owner_id_seq": ["owner_id", "seq"],
    "ix_audit_events_actor_seq": ["actor_type", "actor_id", "seq"],
    "ix_audit_events_target_seq": ["target_type", "target_id", "seq"],
    "ix_audit_events_mode_seq": ["mode", "seq"],
    "ix_audit_events_occurred_at": ["occurred_at"],
}
OLD_INDEXES = {
    "ix_audit_events_action_occurred_at": ["action", "occurred_at"],
    "ix_audit_events_owner_id_occurred_at": ["owner_id", "occurred_at"],
    "ix_audit_events_actor": ["actor_type", "actor_id"],
}


def upgrade():
    for name in OLD_INDEXES:
        op.drop_index(name, table_name="audit_events")
    for name, columns in NEW_INDEXES.items():
        op.create_index(name, "audit_events", columns)
    op.execute(CHECKPOINT_GUARD)


def downgrade():
    op.execute("DROP TRIGGER IF EXISTS audit_checkpoints_no_truncate ON audit_checkpoints")
    op.execute("DROP TRIGGER IF EXISTS audit_checkpoints_no_update_delete ON audit_checkpoints")
    op.execute("DROP FUNCTION IF EXISTS audit_checkpoints_refuse_change()")
    for name in NEW_INDEXES:
        op.drop_index(name, table_name="audit_events")
    for name, columns in OLD_INDEXES.items():
        op.create_index(name, "audit_events", columns)
