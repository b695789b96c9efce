-- The backbone schema: jobs, their append-only event log, results, batches and prompt groups.
-- Timestamps are epoch milliseconds; JSON is stored as TEXT.

CREATE TABLE batches (
    id          TEXT PRIMARY KEY,
    created_at  INTEGER NOT NULL,
    submitted   INTEGER NOT NULL DEFAULT 0,
    finished    INTEGER NOT NULL DEFAULT 0,
    done        INTEGER NOT NULL DEFAULT 0,
    failed      INTEGER NOT NULL DEFAULT 0,
    cancelled   INTEGER NOT NULL DEFAULT 0,
    timed_out   INTEGER NOT NULL DEFAULT 0
);

-- Group ids are the caller's and only unique within a batch.
CREATE TABLE prompt_groups (
    batch_id    TEXT NOT NULL REFERENCES batches(id),
    id          TEXT NOT NULL,
    created_at  INTEGER NOT NULL,
    submitted   INTEGER NOT NULL DEFAULT 0,
    finished    INTEGER NOT NULL DEFAULT 0,
    rewarded    INTEGER NOT NULL DEFAULT 0,
    reward_sum  REAL NOT NULL DEFAULT 0,
    reward_min  REAL,
    reward_max  REAL,
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
    epoch            INTEGER NOT NULL DEFAULT 0,
    attempts         INTEGER NOT NULL DEFAULT 0,
    node             TEXT,
    route            TEXT,
    lease_until      INTEGER,
    init_output      TEXT,
    run_output       TEXT,
    error            TEXT,
    created_at       INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL,
    finished_at      INTEGER,
    init_queued_at   INTEGER,
    init_started_at  INTEGER,
    init_finished_at INTEGER,
    run_queued_at    INTEGER,
    run_started_at   INTEGER,
    run_finished_at  INTEGER,
    eval_queued_at   INTEGER,
    eval_started_at  INTEGER,
    eval_finished_at INTEGER
);

CREATE INDEX jobs_batch ON jobs(batch_id, id);
CREATE INDEX jobs_status ON jobs(status, updated_at);
CREATE INDEX jobs_group ON jobs(group_id);

-- Append-only history of every job. Rows for status, stage and attempt changes are written
-- by triggers on `jobs`, so no code path can change a job without leaving a trace; other
-- events (re-publish, dead-letter) are inserted by the code that causes them.
CREATE TABLE job_events (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id  TEXT NOT NULL,
    at      INTEGER NOT NULL,
    event   TEXT NOT NULL,
    stage   TEXT,
    epoch   INTEGER,
    attempt INTEGER,
    node    TEXT,
    detail  TEXT
);

CREATE INDEX job_events_job ON job_events(job_id, id);

-- `seq` is the delivery order of results and the long-poll cursor. SQLite serialises
-- writers, so AUTOINCREMENT values become visible in increasing order.
CREATE TABLE results (
    seq          INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id       TEXT NOT NULL UNIQUE REFERENCES jobs(id),
    batch_id     TEXT NOT NULL,
    group_id     TEXT,
    client_id    TEXT,
    status       TEXT NOT NULL,
    reward       REAL,
    error        TEXT,
    output       TEXT NOT NULL,
    created_at   INTEGER NOT NULL,
    published_at INTEGER
);

CREATE INDEX results_batch ON results(batch_id, seq);
CREATE INDEX results_unpublished ON results(published_at, created_at);

CREATE TRIGGER jobs_event_insert AFTER INSERT ON jobs BEGIN
    INSERT INTO job_events (job_id, at, event, stage, epoch, attempt, node, detail)
    VALUES (NEW.id, NEW.updated_at, NEW.status, NEW.stage, NEW.epoch, NEW.attempts, NEW.node, NEW.error);
END;

CREATE TRIGGER jobs_event_update AFTER UPDATE OF status, stage, epoch, attempts ON jobs BEGIN
    INSERT INTO job_events (job_id, at, event, stage, epoch, attempt, node, detail)
    VALUES (NEW.id, NEW.updated_at, NEW.status, NEW.stage, NEW.epoch, NEW.attempts, NEW.node, NEW.error);
END;
