-- The backbone schema: jobs, their append-only event log, results, batches and prompt groups.
-- Timestamps are epoch milliseconds; JSON is stored as TEXT.

CREATE TABLE batches (
    id          TEXT PRIMARY KEY,
    created_at  BIGINT NOT NULL,
    submitted   BIGINT NOT NULL DEFAULT 0,
    finished    BIGINT NOT NULL DEFAULT 0,
    done        BIGINT NOT NULL DEFAULT 0,
    failed      BIGINT NOT NULL DEFAULT 0,
    cancelled   BIGINT NOT NULL DEFAULT 0,
    timed_out   BIGINT NOT NULL DEFAULT 0
);

-- Group ids are the caller's and only unique within a batch.
CREATE TABLE prompt_groups (
    batch_id    TEXT NOT NULL REFERENCES batches(id),
    id          TEXT NOT NULL,
    created_at  BIGINT NOT NULL,
    submitted   BIGINT NOT NULL DEFAULT 0,
    finished    BIGINT NOT NULL DEFAULT 0,
    rewarded    BIGINT NOT NULL DEFAULT 0,
    reward_sum  DOUBLE PRECISION NOT NULL DEFAULT 0,
    reward_min  DOUBLE PRECISION,
    reward_max  DOUBLE PRECISION,
    PRIMARY KEY (batch_id, id)
);

CREATE TABLE jobs (
    id               TEXT PRIMARY KEY,
    batch_id         TEXT NOT NULL REFERENCES batches(id),
    group_id         TEXT,
    client_id        TEXT UNIQUE,
    kind             TEXT NOT NULL,
    task             TEXT NOT NULL,
    status           TEXT NOT NULL,
    stage            TEXT NOT NULL,
    epoch            BIGINT NOT NULL DEFAULT 0,
    attempts         BIGINT NOT NULL DEFAULT 0,
    node             TEXT,
    route            TEXT,
    lease_until      BIGINT,
    init_output      TEXT,
    run_output       TEXT,
    error            TEXT,
    created_at       BIGINT NOT NULL,
    updated_at       BIGINT NOT NULL,
    finished_at      BIGINT,
    init_queued_at   BIGINT,
    init_started_at  BIGINT,
    init_finished_at BIGINT,
    run_queued_at    BIGINT,
    run_started_at   BIGINT,
    run_finished_at  BIGINT,
    eval_queued_at   BIGINT,
    eval_started_at  BIGINT,
    eval_finished_at BIGINT
);

CREATE INDEX jobs_batch ON jobs(batch_id, id);
CREATE INDEX jobs_status ON jobs(status, updated_at);
CREATE INDEX jobs_group ON jobs(group_id);

-- Append-only history of every job. Rows for status, stage and attempt changes are written
-- by triggers on `jobs`, so no code path can change a job without leaving a trace; other
-- events (re-publish, dead-letter) are inserted by the code that causes them.
CREATE TABLE job_events (
    id      BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id  TEXT NOT NULL,
    at      BIGINT NOT NULL,
    event   TEXT NOT NULL,
    stage   TEXT,
    epoch   BIGINT,
    attempt BIGINT,
    node    TEXT,
    detail  TEXT
);

CREATE INDEX job_events_job ON job_events(job_id, id);

-- `seq` is the delivery order of results and the long-poll cursor. Identity values can
-- commit out of order in Postgres, so writers take a transaction-level advisory lock
-- before inserting a result (see the store), which makes seq order equal commit order.
CREATE TABLE results (
    seq          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id       TEXT NOT NULL UNIQUE REFERENCES jobs(id),
    batch_id     TEXT NOT NULL,
    group_id     TEXT,
    client_id    TEXT,
    status       TEXT NOT NULL,
    reward       DOUBLE PRECISION,
    error        TEXT,
    output       TEXT NOT NULL,
    created_at   BIGINT NOT NULL,
    published_at BIGINT
);

CREATE INDEX results_batch ON results(batch_id, seq);
CREATE INDEX results_unpublished ON results(published_at, created_at);

CREATE FUNCTION jobs_log_event() RETURNS trigger AS $$
BEGIN
    INSERT INTO job_events (job_id, at, event, stage, epoch, attempt, node, detail)
    VALUES (NEW.id, NEW.updated_at, NEW.status, NEW.stage, NEW.epoch, NEW.attempts, NEW.node, NEW.error);
    RETURN NULL;
END
$$ LANGUAGE plpgsql;

CREATE TRIGGER jobs_event_insert AFTER INSERT ON jobs
    FOR EACH ROW EXECUTE FUNCTION jobs_log_event();

CREATE TRIGGER jobs_event_update AFTER UPDATE OF status, stage, epoch, attempts ON jobs
    FOR EACH ROW EXECUTE FUNCTION jobs_log_event();
