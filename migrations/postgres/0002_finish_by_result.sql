-- A job ends by inserting its result (INSERT … SELECT … FOR UPDATE guarded by the job's
-- state, see the store). This trigger applies the terminal status to the job and counts
-- the result in its batch and prompt group in the same statement.
CREATE FUNCTION results_finish_job() RETURNS trigger AS $$
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
        timed_out = timed_out + (NEW.status = 'timed_out')::int
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

CREATE TRIGGER results_finish_job AFTER INSERT ON results
    FOR EACH ROW EXECUTE FUNCTION results_finish_job();
