-- The cluster's API keys (storage/keys.py): cluster-wide, not per tenant (the tenant is in the body), never
-- swept. `body` is the node's record without the secret; `revoked_at` (unix seconds, 0: live) only ever
-- goes from 0 to the earliest revocation time written (the upsert in storage/postgres.py enforces it).

CREATE TABLE {prefix}api_keys (
    id text PRIMARY KEY,
    body jsonb NOT NULL,
    revoked_at double precision NOT NULL DEFAULT 0,
    updated_at timestamptz NOT NULL DEFAULT now()
);
