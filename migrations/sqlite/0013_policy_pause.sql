-- A weight update in progress (POST /v1/policy with a mode): the version being moved to,
-- how generation was stopped for it, and until when the pause holds. The pause is a
-- lease: a trainer or gateway that dies during it leaves no backend paused for longer
-- (the reconciler resumes the backends once `pause_until` has passed). `seq` counts
-- every change of the row, so a process that hears of changes out of order (a broadcast
-- and a database read crossing) keeps the latest.
ALTER TABLE policy ADD COLUMN seq INTEGER NOT NULL DEFAULT 0;
ALTER TABLE policy ADD COLUMN pause_version INTEGER;
ALTER TABLE policy ADD COLUMN pause_mode TEXT;
ALTER TABLE policy ADD COLUMN pause_since INTEGER;
ALTER TABLE policy ADD COLUMN pause_until INTEGER;
