-- The dashboard views, each written once: the one definition both databases use.
--
-- They are a stable, documented read interface over the job tables for Grafana
-- (deploy/grafana/), the gateway's status page and ad-hoc SQL. Columns are only ever
-- added to them, never renamed or removed; the tables beneath may change. Times are
-- epoch milliseconds. README "Dashboards" documents every column.
--
-- This file is not a migration. The store applies it after the migrations, every time
-- it migrates, under the same lock: it drops every view named here and creates it again,
-- in one transaction, so a change to a view is a change to this file alone. Migrations
-- up to SQLite's 0018 and Postgres's 0020 still create and replace these views as they
-- did (their checksums are recorded in every database they ran on); later migrations
-- must not touch a view, and they run with the views dropped, so a migration may alter
-- or drop a column a view reads as long as this file stops reading it. Write each view
-- in SQL both databases take; `crates/store/src/schema_check.rs` compares the columns
-- each database gives.

-- One row per batch: its counters (kept by the results trigger), what is still in
-- flight, the mean of its rewards so far and how many of its results came back stale.
CREATE VIEW batch_progress AS
SELECT id AS batch_id,
       created_at,
       submitted,
       finished,
       submitted - finished AS in_flight,
       done,
       failed,
       cancelled,
       timed_out,
       rewarded,
       reward_sum / NULLIF(rewarded, 0) AS reward_mean,
       last_result_at,
       stale
FROM batches;

-- One row per stage (always all three, in pipeline order): jobs waiting in its queue,
-- jobs a worker holds, and when the longest-waiting queued job was queued. Only
-- unfinished jobs are counted (a job's `finished_at` is set exactly when it leaves
-- `queued`/`running`), found through the partial index on them.
CREATE VIEW stage_queue AS
WITH stages(stage, position) AS (
    VALUES ('init', CAST(1 AS BIGINT)), ('run', CAST(2 AS BIGINT)), ('eval', CAST(3 AS BIGINT))
)
SELECT s.stage,
       s.position,
       COALESCE(j.queued, 0) AS queued,
       COALESCE(j.running, 0) AS running,
       j.oldest_queued_at
FROM stages s
LEFT JOIN (
    SELECT stage,
           SUM(CASE WHEN status = 'queued' THEN 1 ELSE 0 END) AS queued,
           SUM(CASE WHEN status = 'running' THEN 1 ELSE 0 END) AS running,
           MIN(CASE WHEN status = 'queued' THEN
               CASE stage WHEN 'init' THEN init_queued_at
                          WHEN 'run' THEN run_queued_at
                          ELSE eval_queued_at END
           END) AS oldest_queued_at
    FROM jobs
    WHERE finished_at IS NULL
    GROUP BY stage
) j ON j.stage = s.stage;

-- One row per finished stage of a job (the latest attempt's times): how long it
-- waited in the queue and how long a worker worked on it, and when the job ended, so a
-- dashboard can bound its window by time. Percentiles over a window are computed from
-- this (Grafana: percentile_cont on Postgres).
CREATE VIEW stage_timings AS
SELECT id AS job_id, batch_id, kind, 'init' AS stage, node,
       init_queued_at AS queued_at, init_started_at AS started_at, init_finished_at AS finished_at,
       init_started_at - init_queued_at AS wait_ms, init_finished_at - init_started_at AS work_ms,
       finished_at AS job_finished_at
FROM jobs WHERE init_finished_at IS NOT NULL AND init_started_at IS NOT NULL
UNION ALL
SELECT id, batch_id, kind, 'run', node,
       run_queued_at, run_started_at, run_finished_at,
       run_started_at - run_queued_at, run_finished_at - run_started_at,
       finished_at
FROM jobs WHERE run_finished_at IS NOT NULL AND run_started_at IS NOT NULL
UNION ALL
SELECT id, batch_id, kind, 'eval', node,
       eval_queued_at, eval_started_at, eval_finished_at,
       eval_started_at - eval_queued_at, eval_finished_at - eval_started_at,
       finished_at
FROM jobs WHERE eval_finished_at IS NOT NULL AND eval_started_at IS NOT NULL;

-- Results per minute (the minute's start) and final status, with their mean reward.
CREATE VIEW throughput_per_minute AS
SELECT (created_at / 60000) * 60000 AS minute,
       status,
       COUNT(*) AS jobs,
       AVG(reward) AS reward_mean
FROM results
GROUP BY (created_at / 60000) * 60000, status;

-- Jobs that ended `failed` or `timed_out`, grouped by kind and the first 160
-- characters of their error, with the latest one's time and a job to look at.
CREATE VIEW failures_by_reason AS
SELECT r.status,
       j.kind,
       SUBSTR(COALESCE(r.error, ''), 1, 160) AS reason,
       COUNT(*) AS jobs,
       MAX(r.created_at) AS last_at,
       MAX(r.job_id) AS example_job_id
FROM results r
JOIN jobs j ON j.id = r.job_id
WHERE r.status IN ('failed', 'timed_out')
GROUP BY r.status, j.kind, SUBSTR(COALESCE(r.error, ''), 1, 160);

-- One row per inference backend: health as the prober last saw it and the RUN jobs
-- assigned to it now (its load). API keys are not in it.
CREATE VIEW backend_load AS
SELECT b.id AS backend_id,
       b.kind,
       b.model,
       b.url,
       b.weight,
       b.healthy,
       b.checked_at,
       b.last_error,
       b.source,
       COALESCE(a.in_flight, 0) AS in_flight
FROM backends b
LEFT JOIN (
    SELECT backend_id, COUNT(*) AS in_flight
    FROM backend_assignments
    GROUP BY backend_id
) a ON a.backend_id = b.id;

-- Live RUN sandboxes (kept from INIT to EVAL) per node and backend, with the oldest's
-- creation and the earliest lease to lapse (a lapsed lease is a sandbox to reap).
CREATE VIEW sandbox_counts AS
SELECT node,
       backend,
       COUNT(*) AS sandboxes,
       MIN(created_at) AS oldest_created_at,
       MIN(lease_until) AS earliest_lease_until
FROM sandboxes
GROUP BY node, backend;

-- One row per dynamic-sampling batch: its status and why, its target, what its groups
-- came to (informative, surplus, uniform, incomplete, cancelled, stale), the jobs and
-- sandbox time early cancelling saved, and the groups it kept running for a later batch
-- (`on_cancel = 'keep'`) or adopted from an earlier one (`carry_from`).
CREATE VIEW sampling_progress AS
SELECT id AS batch_id,
       status,
       reason,
       group_size,
       target_groups,
       informative,
       surplus,
       uniform,
       incomplete,
       cancelled_groups,
       groups_launched,
       groups_decided,
       samples_completed,
       jobs_saved,
       sandbox_ms_used,
       sandbox_ms_saved,
       created_at,
       ended_at,
       stale_groups,
       kept_groups,
       adopted_groups
FROM sampling_batches;

-- One row per failed or timed-out job, with its kind and the reason `failures_by_reason`
-- groups it under: the dashboard groups the latest of these itself, so its list of
-- recent failures reads the failures of its window, not every failure there ever was.
CREATE VIEW failed_results AS
SELECT r.job_id,
       r.batch_id,
       j.kind,
       r.status,
       SUBSTR(COALESCE(r.error, ''), 1, 160) AS reason,
       r.created_at AS ended_at
FROM results r
JOIN jobs j ON j.id = r.job_id
WHERE r.status IN ('failed', 'timed_out');

-- One row per batch with results: mean reward of its scored results, and the means and
-- sums a training run follows from batch to batch.
CREATE VIEW training_by_batch AS
SELECT batch_id,
       MIN(created_at) AS first_result_at,
       MAX(created_at) AS last_result_at,
       COUNT(*) AS results,
       CAST(SUM(CASE WHEN status = 'done' THEN 1 ELSE 0 END) AS BIGINT) AS done,
       AVG(CASE WHEN status = 'done' THEN reward END) AS reward_mean,
       AVG(CAST(turns AS DOUBLE PRECISION)) AS turns_mean,
       AVG(CAST(response_tokens AS DOUBLE PRECISION)) AS response_tokens_mean,
       MAX(response_tokens) AS response_tokens_max,
       CAST(SUM(tool_calls) AS BIGINT) AS tool_calls,
       CAST(SUM(tool_errors) AS BIGINT) AS tool_errors
FROM results
GROUP BY batch_id;

-- Results per batch, status and finish reason (NULL for results without an episode).
CREATE VIEW finish_reasons_by_batch AS
SELECT batch_id, status, finish_reason, COUNT(*) AS jobs
FROM results
GROUP BY batch_id, status, finish_reason;

-- Mean reward per policy version (the oldest version of each result's tokens).
CREATE VIEW reward_by_policy_version AS
SELECT policy_version,
       COUNT(*) AS results,
       CAST(SUM(CASE WHEN status = 'done' THEN 1 ELSE 0 END) AS BIGINT) AS done,
       AVG(CASE WHEN status = 'done' THEN reward END) AS reward_mean,
       MIN(created_at) AS first_result_at,
       MAX(created_at) AS last_result_at
FROM results
WHERE policy_version IS NOT NULL
GROUP BY policy_version;
