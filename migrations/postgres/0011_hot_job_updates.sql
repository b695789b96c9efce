-- A job's claims and hand-offs update its row in place (Postgres only).
--
-- Every job's row is updated about seven times (three claims, two hand-offs, its end),
-- and the index `jobs_status` covered two columns every one of those updates changes
-- (`status`, `updated_at`). An update that changes an indexed column cannot be a
-- heap-only-tuple (HOT) update: it adds an entry to every index of the table (five
-- here) and leaves the old ones for vacuum. Without it, an update that finds room on
-- its row's page touches no index at all: measured here, half the server time per
-- claimed row. Inserts now fill a page only half way (fillfactor 50), so a row's
-- updates find that room; the sweeps that found stale jobs through `jobs_status`
-- read the unfinished jobs through a partial index instead, on a column no update
-- changes (`finished_at` is set once, when the job ends, and its only index use is
-- this predicate, so updates before the end stay HOT).
DROP INDEX jobs_status;
CREATE INDEX jobs_unfinished ON jobs (created_at) WHERE finished_at IS NULL;
ALTER TABLE jobs SET (fillfactor = 50);

-- Stage queue depths count the unfinished jobs: the same rows as before (a job's
-- `finished_at` is set exactly when it leaves `queued`/`running`), found through the
-- partial index.
CREATE OR REPLACE VIEW stage_queue AS
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
