"""job callbacks

A job may name a callback_url: its status is POSTed there, signed, when it ends. The row keeps the URL,
how far the delivery got (indexed: the reconciler looks for deliveries not yet queued) and, once it is
over, its attempts.

Revision ID: d41c7a9e2b10
Revises: c3a9d51e0f27
Create Date: 2026-12-02 13:00:00.000000

"""

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision = "d41c7a9e2b10"
down_revision = "c3a9d51e0f27"
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("callback_url", sa.Text(), nullable=True))
        batch_op.add_column(sa.Column("callback_state", sa.String(length=16), nullable=True))
        batch_op.add_column(sa.Column("callback_attempts", sa.JSON(), nullable=True))
        batch_op.create_index(batch_op.f("ix_jobs_callback_state"), ["callback_state"], unique=False)


def downgrade():
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_jobs_callback_state"))
        batch_op.drop_column("callback_attempts")
        batch_op.drop_column("callback_state")
        batch_op.drop_column("callback_url")
