-- The dashboard's reads stop growing with history.
--
-- The status page asks for the dashboard every three seconds and Grafana on its own
-- refresh. Before this, each answer read every row of `results` twice and every row of
-- `jobs` three times, which at a million finished jobs takes seconds. Each view below
-- now reads only what it answers for (BENCHMARKS.md, "Dashboard reads at a million
-- jobs"). The same change as Postgres's migration 0012.

-- Batch rewards are counted where the batch's other counters are, by the trigger that
-- ends a job, instead of aggregated from every result of every batch on each read.
ALTER TABLE batches ADD COLUMN rewarded INTEGER NOT NULL DEFAULT 0;
ALTER TABLE batches ADD COLUMN reward_sum REAL NOT NULL DEFAULT 0;
ALTER TABLE batches ADD COLUMN last_result_at INTEGER;
UPDATE batches SET
    rewarded = (SELECT COUNT(reward) FROM results WHERE batch_id = batches.id),
    reward_sum = (SELECT COALESCE(SUM(reward), 0.0) FROM results WHERE batch_id = batches.id),
    last_result_at = (SELECT MAX(created_at) FROM results WHERE batch_id = batches.id);

DROP TRIGGER results_finish_job;
CREATE TRIGGER results_finish_job AFTER INSERT ON results BEGIN
    UPDATE jobs SET
        status = NEW.status,
        error = NEW.error,
        lease_until = NULL,
        updated_at = NEW.created_at,
        finished_at = NEW.created_at,
        init_finished_at = CASE WHEN stage = 'init' AND status = 'running' THEN NEW.created_at ELSE init_finished_at END,
        run_finished_at = CASE WHEN stage = 'run' AND status = 'running' THEN NEW.created_at ELSE run_finished_at END,
        eval_finished_at = CASE WHEN stage = 'eval' AND status = 'running' THEN NEW.created_at ELSE eval_finished_at END
    WHERE id = NEW.job_id;
    UPDATE batches SET
        finished = finished + 1,
        done = done + (NEW.status = 'done'),
        failed = failed + (NEW.status = 'failed'),
        cancelled = cancelled + (NEW.status = 'cancelled'),
        timed_out = timed_out + (NEW.status = 'timed_out'),
        rewarded = rewarded + (NEW.reward IS NOT NULL),
        reward_sum = reward_sum + COALESCE(NEW.reward, 0),
        last_result_at = MAX(COALESCE(last_result_at, NEW.created_at), NEW.created_at)
    WHERE id = NEW.batch_id;
    UPDATE prompt_groups SET
        finished = finished + 1,
        rewarded = rewarded + (NEW.reward IS NOT NULL),
        reward_sum = reward_sum + COALESCE(NEW.reward, 0),
        reward_min = CASE WHEN NEW.reward IS NULL THEN reward_min
            WHEN reward_min IS NULL OR NEW.reward < reward_min THEN NEW.reward ELSE reward_min END,
        reward_max = CASE WHEN NEW.reward IS NULL THEN reward_max
            WHEN reward_max IS NULL OR NEW.reward > reward_max THEN NEW.reward ELSE reward_max END
    WHERE batch_id = NEW.batch_id AND id = NEW.group_id;
END;

DROP VIEW batch_progress;
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
       last_result_at
FROM batches;

-- The latest batches are read through an index of their creation, never by reading
-- every batch (a batch's row is rewritten by each of its results, so until vacuum a
-- long run's table holds many dead versions of each).
CREATE INDEX batches_created ON batches (created_at);

-- Stage timings gain the end of their job, and ended jobs are found by it through a
-- partial index (`finished_at` is set once, when the job ends).
CREATE INDEX jobs_finished ON jobs (finished_at) WHERE finished_at IS NOT NULL;
DROP VIEW stage_timings;
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

-- Unfinished jobs are found through an index of them alone, as on Postgres (0011
-- there): `jobs_status` cannot tell SQLite that few of a million jobs are queued or
-- running, and once the database has been analyzed the planner reads the whole table
-- for the stage queues instead. The view now names its rows as the index does.
CREATE INDEX jobs_unfinished ON jobs (created_at) WHERE finished_at IS NULL;
DROP VIEW stage_queue;
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

-- Results are found by their minute (the view's grouping) and failures apart from the
-- rest: a window of throughput reads that window's results, and the failure reasons
-- read the failed results only.
CREATE INDEX results_minute ON results ((created_at / 60000) * 60000);
CREATE INDEX results_failures ON results (created_at) WHERE status IN ('failed', 'timed_out');

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
