-- A batch can end before its jobs do: the trainer cancels it (a plain batch or a
-- sampling batch). From that moment no job of the batch may start a stage, move on to
-- the next, or be scored: the statements that claim, advance, renew and end jobs read
-- `ended_at` in the same statement, and an end written after it records the job
-- `cancelled` with `end_reason`. The canceller then ends the jobs that are left; until
-- it has, they are live but can do nothing. (A sampling batch that completes or gives
-- up cancels its stragglers too, but does not fence them: one that finishes first is
-- scored and counted as surplus.)
ALTER TABLE batches ADD COLUMN ended_at INTEGER;
ALTER TABLE batches ADD COLUMN end_reason TEXT;

-- Partial: the reconciler looks for ended batches with jobs left, and there are few.
CREATE INDEX batches_ended ON batches(ended_at) WHERE ended_at IS NOT NULL;

-- A sampling batch's cancel ends its batch row in the same transaction.
CREATE TRIGGER sampling_batch_ends AFTER UPDATE OF status ON sampling_batches
WHEN OLD.status = 'running' AND NEW.status = 'cancelled'
BEGIN
    UPDATE batches SET ended_at = COALESCE(NEW.ended_at, NEW.updated_at),
        end_reason = 'the sampling batch was cancelled'
    WHERE id = NEW.id AND ended_at IS NULL;
END;
