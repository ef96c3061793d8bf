-- Ownership of sessions, agent cards and memory workspaces (the tenancy guard's table), shared by
-- every replica and every deployment that points at this database.
-- depends: 0002.a2a

CREATE TABLE ownership (
    kind        text NOT NULL,                 -- "session", "agent" or "workspace"
    ident       text NOT NULL,
    owner       text NOT NULL,                 -- the owner's `sub`
    readers     text[] NOT NULL DEFAULT '{}',  -- principals that may read it (workspaces shared read-only)
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (kind, ident)
);
CREATE INDEX ownership_owner ON ownership (kind, owner);
