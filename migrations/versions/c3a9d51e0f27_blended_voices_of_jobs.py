"""blended voices of jobs

A job may speak a blend of voices: its parts, as sent, are kept with the job (so the reconciler sends a
lost job again as it was first sent) until a worker reports the embedding it mixed.

Revision ID: c3a9d51e0f27
Revises: 528107a2ba72
Create Date: 2026-12-02 08:00:00.000000

"""

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision = "c3a9d51e0f27"
down_revision = "528107a2ba72"
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("voice_mix", sa.JSON(), nullable=True))


def downgrade():
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("voice_mix")
