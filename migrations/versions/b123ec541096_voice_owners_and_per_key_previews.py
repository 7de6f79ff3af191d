"""voice owners and per-key previews

Voices get an owner (the key that made them; none for the voices already there, which only admin keys
may then change) and keys an admin flag. A voice's preview becomes a flag on the job that spoke it, so
each key has its own: the one kept preview of each voice stays the preview of the key (or of no key)
that made it. Going back keeps, for each voice, the newest preview made without a key: a shared preview
must not hand one key's job to every caller.

Revision ID: b123ec541096
Revises: eb663827707c
Create Date: 2026-11-30 12:45:52.390151

"""

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision = "b123ec541096"
down_revision = "eb663827707c"
branch_labels = None
depends_on = None

jobs = sa.table(
    "jobs",
    sa.column("id", sa.String),
    sa.column("created_at", sa.DateTime),
    sa.column("voice_id", sa.Integer),
    sa.column("api_key_id", sa.Integer),
    sa.column("is_preview", sa.Boolean),
)
voices = sa.table("voices", sa.column("id", sa.Integer), sa.column("preview_job_id", sa.String))


def upgrade():
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.add_column(sa.Column("is_admin", sa.Boolean(), server_default=sa.false(), nullable=False))

    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("is_preview", sa.Boolean(), server_default=sa.false(), nullable=False))
        batch_op.create_index(batch_op.f("ix_jobs_voice_id"), ["voice_id"], unique=False)

    op.execute(jobs.update().where(jobs.c.id.in_(sa.select(voices.c.preview_job_id))).values(is_preview=True))

    with op.batch_alter_table("voices", schema=None) as batch_op:
        batch_op.add_column(sa.Column("owner_key_id", sa.Integer(), nullable=True))
        batch_op.create_foreign_key("fk_voices_owner_key_id", "api_keys", ["owner_key_id"], ["id"], ondelete="SET NULL")
        batch_op.drop_column("preview_job_id")


def downgrade():
    with op.batch_alter_table("voices", schema=None) as batch_op:
        batch_op.add_column(sa.Column("preview_job_id", sa.String(length=36), nullable=True))
        batch_op.drop_constraint("fk_voices_owner_key_id", type_="foreignkey")
        batch_op.drop_column("owner_key_id")

    newest_shared_preview = (
        sa.select(jobs.c.id)
        .where(jobs.c.voice_id == voices.c.id, jobs.c.is_preview, jobs.c.api_key_id.is_(None))
        .order_by(jobs.c.created_at.desc())
        .limit(1)
        .scalar_subquery()
    )
    op.execute(voices.update().values(preview_job_id=newest_shared_preview))

    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_jobs_voice_id"))
        batch_op.drop_column("is_preview")

    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.drop_column("is_admin")
