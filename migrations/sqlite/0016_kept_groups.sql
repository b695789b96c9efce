-- Partial rollouts across batches. A sampling batch with `on_cancel = 'keep'` does not
-- cancel the groups still running when it ends: they are marked `kept` (counted among
-- its decided groups, in `kept_groups`) and run on. A later batch created with
-- `carry_from` adopts them: it gets a row of its own per group (`source_batch`,
-- `source_group`: where its jobs and results are), the kept row points at it
-- (`carried_to`), and the group's verdict, once its last sample ends, is taken in the
-- adopter. A kept group that ends before it is adopted keeps its verdict in
-- `kept_verdict` until then. A trainer's cancel of a `keep` batch fences nothing: its
-- kept groups are meant to run on. The same change as Postgres's migration 0018.
ALTER TABLE sampling_batches ADD COLUMN on_cancel TEXT NOT NULL DEFAULT 'discard';
ALTER TABLE sampling_batches ADD COLUMN carry_from TEXT;
ALTER TABLE sampling_batches ADD COLUMN kept_groups INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sampling_batches ADD COLUMN adopted_groups INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sampling_groups ADD COLUMN source_batch TEXT;
ALTER TABLE sampling_groups ADD COLUMN source_group TEXT;
ALTER TABLE sampling_groups ADD COLUMN carried_to TEXT;
ALTER TABLE sampling_groups ADD COLUMN kept_verdict TEXT;

DROP TRIGGER sampling_batch_ends;
CREATE TRIGGER sampling_batch_ends AFTER UPDATE OF status ON sampling_batches
WHEN OLD.status = 'running' AND NEW.status = 'cancelled' AND NEW.on_cancel = 'discard'
BEGIN
    UPDATE batches SET ended_at = COALESCE(NEW.ended_at, NEW.updated_at),
        end_reason = 'the sampling batch was cancelled'
    WHERE id = NEW.id AND ended_at IS NULL;
END;
