-- The cluster store's first schema: sessions, agent cards, the run index, the audit log and counters.
-- depends:

CREATE TABLE sessions (
    session_id  text PRIMARY KEY,
    version     bigint NOT NULL,               -- optimistic concurrency: a save names the version it read
    status      text NOT NULL,
    state       jsonb NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE agent_cards (
    agent_id    text PRIMARY KEY,
    card        jsonb NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE runs (
    trace_id     text PRIMARY KEY,
    kind         text NOT NULL,                -- "execute" or "session"
    principal    text,
    strategy     text NOT NULL,
    status       text NOT NULL,
    prompt_tokens     integer NOT NULL,
    completion_tokens integer NOT NULL,
    started_at   timestamptz NOT NULL,
    elapsed_ms   integer NOT NULL,
    error        text,
    events       jsonb NOT NULL                -- the full event log, oldest first
);
CREATE INDEX runs_started_at ON runs (started_at DESC);
CREATE INDEX runs_principal ON runs (principal, started_at DESC);

CREATE TABLE audit_log (
    id          bigserial PRIMARY KEY,
    at          timestamptz NOT NULL DEFAULT now(),
    principal   text,
    action      text NOT NULL,
    detail      jsonb NOT NULL
);
CREATE INDEX audit_log_principal ON audit_log (principal, at DESC);

CREATE TABLE counters (
    key         text NOT NULL,
    window_start bigint NOT NULL,              -- unix seconds the window began; 0 for counters without a window
    value       bigint NOT NULL,
    expires_at  timestamptz,
    PRIMARY KEY (key, window_start)
);
