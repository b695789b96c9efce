-- The inference backend pool. `backends` holds what was registered (from the config file
-- or the API) and what the health probe last saw. `backend_assignments` holds one row per
-- job in RUN naming its backend: a backend's active count is its number of rows, so every
-- RUN worker reads the same counts, and a job's prompt group (`group_key`) finds the
-- backend its other samples use.
CREATE TABLE backends (
    id         TEXT PRIMARY KEY,
    url        TEXT NOT NULL,
    kind       TEXT NOT NULL,
    model      TEXT NOT NULL,
    tokenizer  TEXT NOT NULL,
    weight     DOUBLE PRECISION NOT NULL DEFAULT 1.0,
    healthy    BIGINT NOT NULL DEFAULT 1,
    checked_at BIGINT,
    last_error TEXT,
    source     TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
);

CREATE TABLE backend_assignments (
    job_id      TEXT PRIMARY KEY,
    backend_id  TEXT NOT NULL,
    group_key   TEXT,
    model       TEXT NOT NULL,
    assigned_at BIGINT NOT NULL
);

-- Where each prompt group's last sample was placed: its prompt stays in that backend's
-- prefix cache after the sample ends, so later samples of the group go there too.
-- Rows of groups not seen for a while are pruned by the health prober.
CREATE TABLE backend_group_homes (
    group_key  TEXT PRIMARY KEY,
    backend_id TEXT NOT NULL,
    updated_at BIGINT NOT NULL
);

CREATE INDEX backend_group_homes_updated ON backend_group_homes(updated_at);

CREATE INDEX backend_assignments_backend ON backend_assignments(backend_id);
CREATE INDEX backend_assignments_group ON backend_assignments(group_key);

-- A job's assignment goes in the same statement that moves it out of RUN or ends it,
-- however that happens (RUN done, failed, timed out, cancelled while queued or running,
-- sent back to INIT), so counts never leak, even when the worker holding the job died.
-- A job requeued within RUN keeps its backend.
CREATE FUNCTION jobs_release_backend() RETURNS trigger AS $$
BEGIN
    DELETE FROM backend_assignments WHERE job_id = NEW.id;
    RETURN NULL;
END
$$ LANGUAGE plpgsql;

CREATE TRIGGER jobs_release_backend AFTER UPDATE OF stage, status ON jobs
    FOR EACH ROW
    WHEN (OLD.stage = 'run' AND (NEW.stage <> 'run' OR NEW.status IN ('done', 'failed', 'cancelled', 'timed_out')))
    EXECUTE FUNCTION jobs_release_backend();
