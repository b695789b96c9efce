-- The staleness bound (a task's or sampling batch's `max_staleness`): a sample whose
-- oldest model token is too old when it finishes ends `stale` (scored and kept, not a
-- training sample), and a sampling group with one is decided `stale` and replaced by the
-- next prompt. Both are counted where their kind is: `batches.stale` by the trigger that
-- ends a job, `sampling_batches.stale_groups` by the verdict. The same change as
-- Postgres's migration 0016.
ALTER TABLE batches ADD COLUMN stale INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sampling_batches ADD COLUMN stale_groups INTEGER NOT NULL DEFAULT 0;

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
        stale = stale + (NEW.status = 'stale'),
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
       last_result_at,
       stale
FROM batches;

DROP VIEW sampling_progress;
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
       stale_groups
FROM sampling_batches;
