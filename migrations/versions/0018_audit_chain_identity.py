"""The audit chain's identity: one row, a random id made with the database, that every
signed anchor names. Anchors of another database (an earlier one's file left beside a
fresh database) are then told apart from a cut. Append-only like the events."""
from alembic import op

revision = '0018'
down_revision = '0017'
branch_labels = None
depends_on = None

CHAIN = """
CREATE TABLE audit_chain (
    id smallint PRIMARY KEY DEFAULT 1 CHECK (id = 1),
    chain_id uuid NOT NULL DEFAULT gen_random_uuid(),
    created_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO audit_chain DEFAULT VALUES;
CREATE FUNCTION audit_chain_refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit_chain is fixed: % refused', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$;
CREATE TRIGGER audit_chain_no_update_delete
    BEFORE UPDATE OR DELETE ON audit_chain
    FOR EACH ROW EXECUTE FUNCTION audit_chain_refuse_change();
CREATE TRIGGER audit_chain_no_truncate
    BEFORE TRUNCATE ON audit_chain
    FOR EACH STATEMENT EXECUTE FUNCTION audit_chain_refuse_change();
"""


def upgrade():
    op.execute(CHAIN)


def downgrade():
    op.execute("DROP TABLE audit_chain")
    op.execute("DROP FUNCTION audit_chain_refuse_change()")
