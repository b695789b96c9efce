-- Jobs and prompt groups no longer reference their batch by foreign key (Postgres only).
--
-- A foreign-key check takes a KEY SHARE lock on the referenced row until its transaction
-- commits: every submit and every sampling launch locked its batch's row that way while
-- every job end updated the same row (its counters). A row updated while another
-- transaction holds such a lock gets a MultiXact as its lock holder, and every later
-- reader of the row's versions looks the MultiXact's members up: on a busy batch, a
-- measurable share of the server's CPU. The batch row is always written first, in the
-- same transaction as its jobs and groups, and batches are never deleted, so the keys
-- guarded nothing the store does not already guarantee. SQLite takes no such locks and
-- keeps its keys.
ALTER TABLE jobs DROP CONSTRAINT jobs_batch_id_fkey;
ALTER TABLE prompt_groups DROP CONSTRAINT prompt_groups_batch_id_fkey;
