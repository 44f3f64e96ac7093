"""The revisions, one file each: Alembic loads them by path and skips this file."""
