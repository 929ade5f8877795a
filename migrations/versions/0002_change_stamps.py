"""Change stamps for the build safety net, plan fan-outs, periodic-task leases.

- users.plan_changed_at, plans.memory_changed_at: stamped by triggers, so every path that
  changes a user's plan or a plan's cap or assignments (a deleted plan's SET NULL
  included) is visible to the schedule;
- plans.fanned_out_at: how far the per-user build requests have caught up;
- memory_builds.inputs_read_at, and two new build triggers;
- maintenance_leases: one run per interval across all workers;
- plan names unique regardless of case.
"""
from alembic import op
import sqlalchemy as sa

revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None

OLD_TRIGGERS = "('conversation_end', 'conversation_idle', 'user', 'admin', 'schedule', 'system')"
NEW_TRIGGERS = ("('conversation_end', 'conversation_idle', 'user', 'admin', 'schedule', "
                "'system', 'content_change', 'plan_change')")

STAMPS = """
CREATE FUNCTION users_stamp_plan_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.plan_changed_at := clock_timestamp();
    RETURN NEW;
END;
$$;
CREATE TRIGGER users_plan_changed
    BEFORE UPDATE OF plan_id ON users
    FOR EACH ROW WHEN (OLD.plan_id IS DISTINCT FROM NEW.plan_id)
    EXECUTE FUNCTION users_stamp_plan_change();

CREATE FUNCTION plans_stamp_cap_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.memory_changed_at := clock_timestamp();
    RETURN NEW;
END;
$$;
CREATE TRIGGER plans_cap_changed
    BEFORE UPDATE OF included_sources ON plans
    FOR EACH ROW WHEN (OLD.included_sources IS DISTINCT FROM NEW.included_sources)
    EXECUTE FUNCTION plans_stamp_cap_change();

CREATE FUNCTION source_assignments_stamp_plan() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND OLD.plan_id = NEW.plan_id AND OLD.source_key = NEW.source_key
            AND OLD.enabled = NEW.enabled THEN
        RETURN NULL;
    END IF;
    UPDATE plans SET memory_changed_at = clock_timestamp()
     WHERE id IN (CASE WHEN TG_OP <> 'INSERT' THEN OLD.plan_id END,
                  CASE WHEN TG_OP <> 'DELETE' THEN NEW.plan_id END);
    RETURN NULL;
END;
$$;
CREATE TRIGGER source_assignments_changed
    AFTER INSERT OR UPDATE OR DELETE ON source_assignments
    FOR EACH ROW EXECUTE FUNCTION source_assignments_stamp_plan();
"""


def upgrade():
    op.add_column('users', sa.Column('plan_changed_at', sa.DateTime(timezone=True), nullable=True))
    op.add_column('plans', sa.Column('memory_changed_at', sa.DateTime(timezone=True), nullable=True))
    op.add_column('plans', sa.Column('fanned_out_at', sa.DateTime(timezone=True), nullable=True))
    op.add_column('memory_builds', sa.Column('inputs_read_at', sa.DateTime(timezone=True), nullable=True))
    op.drop_constraint(op.f('ck_memory_builds_trigger'), 'memory_builds', type_='check')
    op.create_check_constraint(op.f('ck_memory_builds_trigger'), 'memory_builds',
                               f"trigger IN {NEW_TRIGGERS}")
    op.create_table('maintenance_leases',
    sa.Column('task', sa.String(length=32), nullable=False),
    sa.Column('last_run_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('holder', sa.String(length=128), server_default='', nullable=False),
    sa.PrimaryKeyConstraint('task', name=op.f('pk_maintenance_leases'))
    )
    op.create_index('uq_plans_name_lower', 'plans', [sa.text('lower(name)')], unique=True)
    op.execute(STAMPS)


def downgrade():
    op.execute("DROP TRIGGER IF EXISTS source_assignments_changed ON source_assignments")
    op.execute("DROP FUNCTION IF EXISTS source_assignments_stamp_plan()")
    op.execute("DROP TRIGGER IF EXISTS plans_cap_changed ON plans")
    op.execute("DROP FUNCTION IF EXISTS plans_stamp_cap_change()")
    op.execute("DROP TRIGGER IF EXISTS users_plan_changed ON users")
    op.execute("DROP FUNCTION IF EXISTS users_stamp_plan_change()")
    op.drop_index('uq_plans_name_lower', table_name='plans')
    op.drop_table('maintenance_leases')
    op.execute("UPDATE memory_builds SET trigger = 'system' "
               "WHERE trigger IN ('content_change', 'plan_change')")
    op.drop_constraint(op.f('ck_memory_builds_trigger'), 'memory_builds', type_='check')
    op.create_check_constraint(op.f('ck_memory_builds_trigger'), 'memory_builds',
                               f"trigger IN {OLD_TRIGGERS}")
    op.drop_column('memory_builds', 'inputs_read_at')
    op.drop_column('plans', 'fanned_out_at')
    op.drop_column('plans', 'memory_changed_at')
    op.drop_column('users', 'plan_changed_at')
