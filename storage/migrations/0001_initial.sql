-- Responses with their input items, conversations with their items.
-- `{prefix}` is replaced by the configured table prefix. Forward-only: never edit an applied file
-- (its checksum is recorded); add 0002_*.sql instead.

CREATE TABLE {prefix}responses (
    tenant text NOT NULL,
    id text NOT NULL,
    -- Allocation order of all responses. A previous_response_id link always points to a smaller seq
    -- (the parent existed before the child's INSERT drew its number), which makes chains acyclic.
    -- Must keep CACHE 1 (the default): per-session caches would break that ordering.
    seq bigint GENERATED ALWAYS AS IDENTITY,
    created_at bigint NOT NULL,
    previous_response_id text,
    conversation_id text,
    body jsonb NOT NULL,
    output jsonb NOT NULL,
    PRIMARY KEY (tenant, id)
);

CREATE TABLE {prefix}response_input_items (
    tenant text NOT NULL,
    response_id text NOT NULL,
    position integer NOT NULL,
    item_id text NOT NULL,
    type text NOT NULL,
    body jsonb NOT NULL,
    PRIMARY KEY (tenant, response_id, position),
    UNIQUE (tenant, response_id, item_id),
    FOREIGN KEY (tenant, response_id) REFERENCES {prefix}responses (tenant, id) ON DELETE CASCADE
);

CREATE TABLE {prefix}conversations (
    tenant text NOT NULL,
    id text NOT NULL,
    created_at bigint NOT NULL,
    metadata jsonb NOT NULL,
    -- Position the next appended item gets; UPDATEs of it also serialize concurrent appends.
    next_position bigint NOT NULL,
    PRIMARY KEY (tenant, id)
);

CREATE TABLE {prefix}conversation_items (
    tenant text NOT NULL,
    conversation_id text NOT NULL,
    position bigint NOT NULL,
    item_id text NOT NULL,
    type text NOT NULL,
    body jsonb NOT NULL,
    PRIMARY KEY (tenant, conversation_id, position),
    UNIQUE (tenant, conversation_id, item_id),
    FOREIGN KEY (tenant, conversation_id) REFERENCES {prefix}conversations (tenant, id) ON DELETE CASCADE
);
