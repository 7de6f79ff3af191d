"""voice previews

Revision ID: fb5f88f84dd0
Revises: 4819c63bfab8
Create Date: 2026-11-29 21:55:10.378656

"""

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision = "fb5f88f84dd0"
down_revision = "4819c63bfab8"
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table("voices", schema=None) as batch_op:
        batch_op.add_column(sa.Column("preview_job_id", sa.String(length=36), nullable=True))


def downgrade():
    with op.batch_alter_table("voices", schema=None) as batch_op:
        batch_op.drop_column("preview_job_id")
