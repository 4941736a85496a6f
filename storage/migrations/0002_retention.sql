-- Retention (--history-retention-s), as in the memory and Redis backends: every write to a response or a
-- conversation sets its `expires_at` to the write time plus the retention, like a Redis TTL; reads do not
-- change it. Reads skip rows with expires_at <= now; the sweeper (storage/sweeper.py) deletes them.
-- '-infinity' marks a row the sweeper has claimed: no clock reads it as live again, while its items are
-- deleted in batches before the row itself.
-- Rows stored before this migration, and rows inserted by nodes that predate it during a rolling upgrade,
-- get the default 'infinity': they were written under "kept until deleted" and stay so.
-- A constant default adds the column without rewriting the table (Postgres >= 11).

ALTER TABLE {prefix}responses ADD COLUMN expires_at timestamptz NOT NULL DEFAULT 'infinity';
ALTER TABLE {prefix}conversations ADD COLUMN expires_at timestamptz NOT NULL DEFAULT 'infinity';

-- The sweeper finds expired and claimed rows through these. Short names: the table prefix may take 40 of
-- Postgres' 63 identifier bytes. Not CONCURRENTLY (a migration is one transaction): on a large existing
-- table, writes wait for the build once, when the first node with this migration starts.
CREATE INDEX {prefix}responses_exp ON {prefix}responses (expires_at);
CREATE INDEX {prefix}conversations_exp ON {prefix}conversations (expires_at);
