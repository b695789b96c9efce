-- A backend the service paused for a weight update and then could not resume (it was
-- down or did not answer) is owed a resume: the reconciler asks it again at every sweep
-- until it answers, so no server stays paused because it was away at the resume. Only
-- the service's own pauses are repaid: a server a trainer paused itself is left alone.
-- The same change as Postgres's migration 0017.
ALTER TABLE backends ADD COLUMN resume_owed INTEGER NOT NULL DEFAULT 0;
