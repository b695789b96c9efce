-- Starts of the current stage entry. The delivery limit is enforced on this count, kept
-- by the claims themselves, rather than on the queue's delivery counter, which also
-- counts deliveries that never started the stage (a copy that found the stage leased
-- elsewhere, a claim that failed while the database was unreachable).
ALTER TABLE jobs ADD COLUMN stage_attempts INTEGER NOT NULL DEFAULT 0;
