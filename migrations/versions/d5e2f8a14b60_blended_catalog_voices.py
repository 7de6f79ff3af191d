"""blended catalog voices

A catalog voice kept as a blend keeps its parts (voices.mix), so the catalog can show it as a blend,
list its parts and export it by them. Blends kept before this kept only their mixed embedding: they
stay voices of that embedding.

Revision ID: d5e2f8a14b60
Revises: d41c7a9e2b10
Create Date: 2026-12-02 13:00:00.000000

"""

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision = "d5e2f8a14b60"
down_revision = "d41c7a9e2b10"
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table("voices", schema=None) as batch_op:
        batch_op.add_column(sa.Column("mix", sa.JSON(none_as_null=True), nullable=True))


def downgrade():
    with op.batch_alter_table("voices", schema=None) as batch_op:
        batch_op.drop_column("mix")
