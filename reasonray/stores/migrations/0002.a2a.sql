-- A2A tasks and the conversations of A2A contexts, in the same database as the sessions.
-- depends: 0001.initial

CREATE TABLE a2a_tasks (
    task_id     text PRIMARY KEY,
    owner       text,                          -- the principal's `sub`; NULL when authentication is off
    context_id  text NOT NULL,
    state       integer NOT NULL,              -- the a2a TaskState number
    status_ns   bigint NOT NULL,               -- the status timestamp in ns since the epoch (0: none): ListTasks' order
    task        jsonb NOT NULL,                -- the Task in the protocol's JSON form
    updated_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX a2a_tasks_owner ON a2a_tasks (owner, status_ns DESC, task_id DESC);
CREATE INDEX a2a_tasks_context ON a2a_tasks (owner, context_id);

CREATE TABLE a2a_conversations (
    conversation_id text PRIMARY KEY,          -- derived from the owner and the context id
    owner       text,
    context_id  text NOT NULL,
    version     bigint NOT NULL,               -- optimistic concurrency, as for sessions
    exchanges   jsonb NOT NULL,                -- the completed exchanges, oldest first
    updated_at  timestamptz NOT NULL DEFAULT now()
);
