-- Dynamic-sampling (DAPO) batches. A sampling batch is a batch (its jobs, results and
-- counters live in the tables above) plus what the service needs to run it without the
-- trainer: the prompt pool, the parameters, where launching has got to, and the
-- counters a dashboard reads. Every row here is written in the transaction that causes
-- the change (a launch, a group's last result), so any number of gateways and workers
-- can drive one batch and none double-counts.

CREATE TABLE sampling_batches (
    id                   TEXT PRIMARY KEY REFERENCES batches(id),
    group_size           BIGINT NOT NULL,
    target_groups        BIGINT NOT NULL,
    max_groups_in_flight BIGINT NOT NULL,
    -- The most prompts tried (already capped at the pool's size).
    max_groups           BIGINT NOT NULL,
    prompt_count         BIGINT NOT NULL,
    rule                 TEXT NOT NULL,
    eps                  DOUBLE PRECISION NOT NULL DEFAULT 0,
    min_mean             DOUBLE PRECISION,
    max_mean             DOUBLE PRECISION,
    policy_version       BIGINT,
    -- running, complete, exhausted, cancelled
    status               TEXT NOT NULL DEFAULT 'running',
    -- Index of the next prompt to launch; advanced by compare-and-set.
    next_prompt          BIGINT NOT NULL DEFAULT 0,
    groups_launched      BIGINT NOT NULL DEFAULT 0,
    groups_decided       BIGINT NOT NULL DEFAULT 0,
    -- Accepted informative groups (never more than target_groups).
    informative          BIGINT NOT NULL DEFAULT 0,
    -- Informative groups decided after the batch had ended (not accepted).
    surplus              BIGINT NOT NULL DEFAULT 0,
    uniform              BIGINT NOT NULL DEFAULT 0,
    incomplete           BIGINT NOT NULL DEFAULT 0,
    cancelled_groups     BIGINT NOT NULL DEFAULT 0,
    -- Sandbox time of samples that ran to their end (INIT start to result), and how
    -- many: the mean prices what a cancelled sample saved.
    sandbox_ms_used      BIGINT NOT NULL DEFAULT 0,
    samples_completed    BIGINT NOT NULL DEFAULT 0,
    jobs_saved           BIGINT NOT NULL DEFAULT 0,
    sandbox_ms_saved     BIGINT NOT NULL DEFAULT 0,
    created_at           BIGINT NOT NULL,
    updated_at           BIGINT NOT NULL,
    ended_at             BIGINT,
    -- Why it ended (for exhausted and cancelled batches).
    reason               TEXT
);

CREATE INDEX sampling_batches_status ON sampling_batches(status);

-- The prompt pool, written once when the batch is created: each task is sampled
-- group_size times as the group `p<idx>`.
CREATE TABLE sampling_prompts (
    batch_id TEXT NOT NULL REFERENCES sampling_batches(id),
    idx      BIGINT NOT NULL,
    task     TEXT NOT NULL,
    PRIMARY KEY (batch_id, idx)
);

-- One row per launched group: its verdict once its last sample ended, and its place
-- among the accepted groups.
CREATE TABLE sampling_groups (
    batch_id      TEXT NOT NULL REFERENCES sampling_batches(id),
    idx           BIGINT NOT NULL,
    group_id      TEXT NOT NULL,
    -- in_flight, informative, uniform, incomplete, cancelled
    state         TEXT NOT NULL DEFAULT 'in_flight',
    accepted_rank BIGINT,
    reward_mean   DOUBLE PRECISION,
    reward_std    DOUBLE PRECISION,
    launched_at   BIGINT NOT NULL,
    decided_at    BIGINT,
    -- When the accepted group was published on `<prefix>.groups.<batch>`.
    published_at  BIGINT,
    PRIMARY KEY (batch_id, idx)
);

CREATE UNIQUE INDEX sampling_groups_group ON sampling_groups(batch_id, group_id);
-- No two groups can take one rank: the K-th acceptance happens once.
CREATE UNIQUE INDEX sampling_groups_rank ON sampling_groups(batch_id, accepted_rank);
