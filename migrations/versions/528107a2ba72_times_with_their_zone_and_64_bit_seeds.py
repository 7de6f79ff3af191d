"""times with their zone and 64-bit seeds

Times are moments in UTC; they were stored without a zone, which SQLite ignores but PostgreSQL reads
in its session's zone: they become ``timestamp with time zone``, the values written so far read as UTC.
Seeds go up to 2**32 - 1, past PostgreSQL's 32-bit integer: they become 64-bit (SQLite's integers
always were). Going back on PostgreSQL fails while a seed past 2**31 - 1 is stored.

Revision ID: 528107a2ba72
Revises: b123ec541096
Create Date: 2026-11-30 21:18:46.735366

"""

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision = "528107a2ba72"
down_revision = "b123ec541096"
branch_labels = None
depends_on = None

# table: (column, nullable) of its times, and its seed column
TIMES = {
    "api_keys": (("created_at", False), ("revoked_at", True)),
    "jobs": (("created_at", False), ("finished_at", True)),
    "voices": (("created_at", False), ("updated_at", False)),
}
SEEDS = {"jobs": "voice_seed", "voices": "seed"}


def upgrade():
    _change(times=(sa.DateTime(), sa.DateTime(timezone=True)), seeds=(sa.Integer(), sa.BigInteger()))


def downgrade():
    _change(times=(sa.DateTime(timezone=True), sa.DateTime()), seeds=(sa.BigInteger(), sa.Integer()))


def _change(times, seeds):
    (time_was, time_becomes), (seed_was, seed_becomes) = times, seeds
    for table, columns in TIMES.items():
        with op.batch_alter_table(table, schema=None) as batch_op:
            for column, nullable in columns:
                # Both ways, the moment is kept: a time without a zone is one in UTC.
                batch_op.alter_column(
                    column,
                    existing_type=time_was,
                    type_=time_becomes,
                    existing_nullable=nullable,
                    postgresql_using=f"{column} AT TIME ZONE 'UTC'",
                )
            if table in SEEDS:
                batch_op.alter_column(SEEDS[table], existing_type=seed_was, type_=seed_becomes, existing_nullable=True)
