-- The dashboard's reads stop growing with history.
--
-- The status page asks for the dashboard every three seconds and Grafana on its own
-- refresh. Before this, each answer read every row of `results` twice and every row of
-- `jobs` three times: measured at a million finished jobs, 1.7 s of server time per
-- answer, taken from the job-ending statements on the same server. Each view below now
-- reads only what it answers for (BENCHMARKS.md, "Dashboard reads at a million jobs").

-- Batch rewards are counted where the batch's other counters are, by the trigger that
-- ends a job, instead of aggregated from every result of every batch on each read.
ALTER TABLE batches ADD COLUMN rewarded BIGINT NOT NULL DEFAULT 0;
ALTER TABLE batches ADD COLUMN reward_sum DOUBLE PRECISION NOT NULL DEFAULT 0;
ALTER TABLE batches ADD COLUMN last_result_at BIGINT;
UPDATE batches b
SET rewarded = r.rewarded, reward_sum = r.reward_sum, last_result_at = r.last_result_at
FROM (
    SELECT batch_id, COUNT(reward) AS rewarded, COALESCE(SUM(reward), 0) AS reward_sum,
           MAX(created_at) AS last_result_at
    FROM results
    GROUP BY batch_id
) r
WHERE r.batch_id = b.id;

CREATE OR REPLACE FUNCTION results_finish_job() RETURNS trigger AS $$
BEGIN
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
        done = done + (NEW.status = 'done')::int,
        failed = failed + (NEW.status = 'failed')::int,
        cancelled = cancelled + (NEW.status = 'cancelled')::int,
        timed_out = timed_out + (NEW.status = 'timed_out')::int,
        rewarded = rewarded + (NEW.reward IS NOT NULL)::int,
        reward_sum = reward_sum + COALESCE(NEW.reward, 0),
        last_result_at = GREATEST(last_result_at, NEW.created_at)
    WHERE id = NEW.batch_id;
    IF NEW.group_id IS NOT NULL THEN
        UPDATE prompt_groups SET
            finished = finished + 1,
            rewarded = rewarded + (NEW.reward IS NOT NULL)::int,
            reward_sum = reward_sum + COALESCE(NEW.reward, 0),
            reward_min = CASE WHEN NEW.reward IS NULL THEN reward_min
                WHEN reward_min IS NULL OR NEW.reward < reward_min THEN NEW.reward ELSE reward_min END,
            reward_max = CASE WHEN NEW.reward IS NULL THEN reward_max
                WHEN reward_max IS NULL OR NEW.reward > reward_max THEN NEW.reward ELSE reward_max END
        WHERE batch_id = NEW.batch_id AND id = NEW.group_id;
    END IF;
    RETURN NULL;
END
$$ LANGUAGE plpgsql;

CREATE OR REPLACE VIEW batch_progress AS
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
-- partial index. `finished_at` is set once, by the update that ends the job, which
-- already changes the predicate of `jobs_unfinished`: claims and hand-offs stay HOT.
CREATE INDEX jobs_finished ON jobs (finished_at) WHERE finished_at IS NOT NULL;
CREATE OR REPLACE VIEW stage_timings AS
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

-- Results are found by their minute (the view's grouping) and failures apart from the
-- rest: a window of throughput reads that window's results, and the failure reasons
-- read the failed results only.
CREATE INDEX results_minute ON results (((created_at / 60000) * 60000));
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
