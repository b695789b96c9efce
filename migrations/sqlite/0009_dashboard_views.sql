-- Dashboard views: a stable, documented read interface over the job tables for
-- Grafana (deploy/grafana/), the gateway's status page and ad-hoc SQL. Columns are
-- only ever added to these views, never renamed or removed; the tables beneath may
-- change. Times are epoch milliseconds. README "Dashboards" documents every column.

-- One row per batch: its counters (kept by the results trigger), what is still in
-- flight, and the rewards of its results so far.
CREATE VIEW batch_progress AS
SELECT b.id AS batch_id,
       b.created_at,
       b.submitted,
       b.finished,
       b.submitted - b.finished AS in_flight,
       b.done,
       b.failed,
       b.cancelled,
       b.timed_out,
       COALESCE(r.rewarded, 0) AS rewarded,
       r.reward_mean,
       r.last_result_at
FROM batches b
LEFT JOIN (
    SELECT batch_id, COUNT(reward) AS rewarded, AVG(reward) AS reward_mean,
           MAX(created_at) AS last_result_at
    FROM results
    GROUP BY batch_id
) r ON r.batch_id = b.id;

-- One row per stage (always all three, in pipeline order): jobs waiting in its queue,
-- jobs a worker holds, and when the longest-waiting queued job was queued.
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
    WHERE status IN ('queued', 'running')
    GROUP BY stage
) j ON j.stage = s.stage;

-- One row per finished stage of a job (the latest attempt's times): how long it
-- waited in the queue and how long a worker worked on it. Percentiles over a time
-- window are computed from this (Grafana: percentile_cont on Postgres).
CREATE VIEW stage_timings AS
SELECT id AS job_id, batch_id, kind, 'init' AS stage, node,
       init_queued_at AS queued_at, init_started_at AS started_at, init_finished_at AS finished_at,
       init_started_at - init_queued_at AS wait_ms, init_finished_at - init_started_at AS work_ms
FROM jobs WHERE init_finished_at IS NOT NULL AND init_started_at IS NOT NULL
UNION ALL
SELECT id, batch_id, kind, 'run', node,
       run_queued_at, run_started_at, run_finished_at,
       run_started_at - run_queued_at, run_finished_at - run_started_at
FROM jobs WHERE run_finished_at IS NOT NULL AND run_started_at IS NOT NULL
UNION ALL
SELECT id, batch_id, kind, 'eval', node,
       eval_queued_at, eval_started_at, eval_finished_at,
       eval_started_at - eval_queued_at, eval_finished_at - eval_started_at
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

-- One row per dynamic-sampling batch: its target and counters.
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
       ended_at
FROM sampling_batches;
