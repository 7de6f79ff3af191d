"""voices from reference clips

A catalog voice may be a reference clip's speaker sample (spk_smp, the DVAE encoder's codes) with the
clip's words (txt_smp) instead of a speaker embedding, so spk_emb may be empty. A job speaking one keeps
it (spk_smp and txt_smp, as sent) so the reconciler can send a lost job again as it was first sent.

Revision ID: 5d2e8f1a9c47
Revises: d5e2f8a14b60
Create Date: 2026-12-02 13:00:00.000000

"""

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision = "5d2e8f1a9c47"
down_revision = "d5e2f8a14b60"
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table("voices", schema=None) as batch_op:
        batch_op.add_column(sa.Column("spk_smp", sa.Text(), nullable=True))
        batch_op.add_column(sa.Column("txt_smp", sa.Text(), nullable=True))
        batch_op.alter_column("spk_emb", existing_type=sa.Text(), nullable=True)
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("voice_sample", sa.JSON(), nullable=True))


def downgrade():
    # Clip voices have no embedding to keep: they go with their columns.
    op.execute("DELETE FROM voices WHERE spk_emb IS NULL")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("voice_sample")
    with op.batch_alter_table("voices", schema=None) as batch_op:
        batch_op.alter_column("spk_emb", existing_type=sa.Text(), nullable=False)
        batch_op.drop_column("txt_smp")
        batch_op.drop_column("spk_smp")
