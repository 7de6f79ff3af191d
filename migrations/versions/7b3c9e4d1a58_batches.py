"""batches

Jobs may be submitted as a batch (POST /api/batches): the batch's row keeps its size, its key, when it
ended or was cancelled, and its callback as a job's does. Each item is a job row naming its batch, its
place in it and the caller's custom_id; indexed with the status, because a batch's unfinished items
are looked for each time one ends.

Revision ID: 7b3c9e4d1a58
Revises: 5d2e8f1a9c47
Create Date: 2026-12-02 16:00:00.000000

"""

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision = "7b3c9e4d1a58"
down_revision = "5d2e8f1a9c47"
branch_labels = None
depends_on = None


def upgrade():
    op.create_table(
        "batches",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("api_key_id", sa.Integer(), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("cancelled_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("callback_url", sa.Text(), nullable=True),
        sa.Column("callback_state", sa.String(length=16), nullable=True),
        sa.Column("callback_attempts", sa.JSON(), nullable=True),
        sa.ForeignKeyConstraint(["api_key_id"], ["api_keys.id"], ondelete="SET NULL"),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("batches", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_batches_created_at"), ["created_at"], unique=False)
        batch_op.create_index(batch_op.f("ix_batches_callback_state"), ["callback_state"], unique=False)
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("batch_id", sa.String(length=36), nullable=True))
        batch_op.add_column(sa.Column("batch_item", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("custom_id", sa.String(length=100), nullable=True))
        batch_op.create_foreign_key("fk_jobs_batch_id_batches", "batches", ["batch_id"], ["id"], ondelete="CASCADE")
        batch_op.create_index("ix_jobs_batch_id_status", ["batch_id", "status"], unique=False)


def downgrade():
    # A batch's items stay, as jobs of their own.
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index("ix_jobs_batch_id_status")
        batch_op.drop_constraint("fk_jobs_batch_id_batches", type_="foreignkey")
        batch_op.drop_column("custom_id")
        batch_op.drop_column("batch_item")
        batch_op.drop_column("batch_id")
    with op.batch_alter_table("batches", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_batches_callback_state"))
        batch_op.drop_index(batch_op.f("ix_batches_created_at"))
    op.drop_table("batches")
