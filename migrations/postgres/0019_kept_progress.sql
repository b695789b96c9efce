-- The dashboard's view of sampling batches shows the groups a batch kept running for a
-- later batch (on_cancel = 'keep') and the ones it adopted (carry_from). The same change
-- as SQLite's migration 0017.
CREATE OR REPLACE VIEW sampling_progress AS
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
       stale_groups,
       kept_groups,
       adopted_groups
FROM sampling_batches;
