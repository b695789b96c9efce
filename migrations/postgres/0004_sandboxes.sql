-- Sandboxes: one row per live sandbox, written by INIT before the sandbox starts (so a
-- crash right after leaves a row for the reaper) and deleted when it is stopped. The
-- node's reaper renews the leases of its sandboxes; a lease that ran out means the node
-- stopped looking after them.
CREATE TABLE sandboxes (
    job_id      TEXT PRIMARY KEY,
    node        TEXT NOT NULL,
    backend     TEXT NOT NULL,
    dir         TEXT NOT NULL,
    socket      TEXT NOT NULL,
    lease_until BIGINT NOT NULL,
    created_at  BIGINT NOT NULL
);

CREATE INDEX sandboxes_node ON sandboxes(node);

-- Times the job was sent back to INIT because the state RUN needed (its sandbox) was gone.
ALTER TABLE jobs ADD COLUMN restarts BIGINT NOT NULL DEFAULT 0;
