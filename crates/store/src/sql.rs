//! Every statement the store runs, as text.
//!
//! Statements are written once in the dialect SQLite and Postgres share (`$N`
//! parameters, `RETURNING`, `ON CONFLICT`); the few that cannot be (a job's end builds
//! JSON, marking results published takes a list) come in one variant per database,
//! named for it. Keeping the SQL here, apart from the Rust that binds it, lets a reader
//! see every query the service runs on one page.

macro_rules! job_cols {
    () => {
        "id, batch_id, group_id, client_id, kind, task, status, stage, epoch, attempts, node, \
         route, lease_until, init_output, run_output, error, created_at, updated_at, \
         finished_at, init_queued_at, init_started_at, init_finished_at, run_queued_at, \
         run_started_at, run_finished_at, eval_queued_at, eval_started_at, eval_finished_at, \
         stage_attempts, restarts"
    };
}

macro_rules! result_cols {
    () => {
        "seq, job_id, batch_id, group_id, client_id, status, reward, error, output, created_at"
    };
}

/// The summary columns of a result, read from its RUN output when it is written (see
/// [`run_stats_sqlite!`]): what the training view and Grafana group and chart without
/// parsing every trajectory again.
macro_rules! stats_cols {
    () => {
        "finish_reason, turns, response_tokens, tool_calls, tool_errors, policy_version"
    };
}

/// SQLite: the [`stats_cols!`] values of the RUN output `$run` (an expression giving
/// its JSON text, or NULL): its `finish_reason`, the length of its `turns` and
/// `response_ids`, its `tool_calls` and `tool_errors` counts and its oldest policy
/// version. A RUN output without them (a shell task's) gives NULLs.
macro_rules! run_stats_sqlite {
    ($run:literal) => {
        concat!(
            "json_extract(",
            $run,
            ", '$.finish_reason'), ",
            "json_array_length(",
            $run,
            ", '$.turns'), ",
            "json_array_length(",
            $run,
            ", '$.response_ids'), ",
            "json_extract(",
            $run,
            ", '$.tool_calls'), ",
            "json_extract(",
            $run,
            ", '$.tool_errors'), ",
            "json_extract(",
            $run,
            ", '$.policy_version_oldest')"
        )
    };
}

/// Postgres: [`run_stats_sqlite!`] in Postgres's JSON operators; a field of the wrong
/// JSON type gives NULL rather than failing the result's insert.
macro_rules! run_stats_postgres {
    ($run:literal) => {
        concat!(
            "(",
            $run,
            ")::json ->> 'finish_reason', ",
            "CASE WHEN json_typeof((",
            $run,
            ")::json -> 'turns') = 'array' \
             THEN json_array_length((",
            $run,
            ")::json -> 'turns') END, ",
            "CASE WHEN json_typeof((",
            $run,
            ")::json -> 'response_ids') = 'array' \
             THEN json_array_length((",
            $run,
            ")::json -> 'response_ids') END, ",
            "CASE WHEN json_typeof((",
            $run,
            ")::json -> 'tool_calls') = 'number' \
             THEN ((",
            $run,
            ")::json ->> 'tool_calls')::numeric::bigint END, ",
            "CASE WHEN json_typeof((",
            $run,
            ")::json -> 'tool_errors') = 'number' \
             THEN ((",
            $run,
            ")::json ->> 'tool_errors')::numeric::bigint END, ",
            "CASE WHEN json_typeof((",
            $run,
            ")::json -> 'policy_version_oldest') = 'number' \
             THEN ((",
            $run,
            ")::json ->> 'policy_version_oldest')::numeric::bigint END"
        )
    };
}

/// Creates the batch row if it is new, without locking an existing one: a submit into a
/// live batch must not hold its row (which every result of the batch updates) while it
/// inserts its jobs.
pub(super) const INSERT_BATCH: &str = "INSERT INTO batches (id, created_at, submitted) \
     VALUES ($1, $2, 0) ON CONFLICT (id) DO NOTHING";

/// Counts a submit's new jobs into its batch: the last statement of a submit, so the
/// row is held only until the commit right after.
pub(super) const COUNT_BATCH: &str = "UPDATE batches SET submitted = submitted + $2 WHERE id = $1";

pub(super) const INSERT_GROUP: &str = "INSERT INTO prompt_groups (batch_id, id, created_at, submitted) \
     VALUES ($1, $2, $3, $4) ON CONFLICT (batch_id, id) DO UPDATE SET submitted = prompt_groups.submitted + excluded.submitted";

/// Inserts the jobs of a JSON array into batch `$2`, queued for INIT at `$3`, in the
/// array's order, skipping a job whose `client_id` exists already (or comes earlier in
/// the array); returns the inserted jobs' ids. `$from` yields the array (`$1`) as rows
/// with the columns `id`, `group_id`, `client_id`, `kind` and `task` (the task's JSON
/// text). One statement for a whole submit: a statement per job made a submit of
/// thousands hold SQLite's single writer, or a Postgres transaction, for as many round
/// trips. (`WHERE true` tells SQLite's parser the `ON CONFLICT` is the insert's.)
macro_rules! insert_jobs {
    ($from:literal) => {
        concat!(
            "INSERT INTO jobs (id, batch_id, group_id, client_id, kind, task, \
             status, stage, epoch, attempts, created_at, updated_at, init_queued_at) \
             SELECT c.id, $2, c.group_id, c.client_id, c.kind, c.task, \
             'queued', 'init', 0, 0, $3, $3, $3 ",
            $from,
            " WHERE true ON CONFLICT (client_id) DO NOTHING RETURNING id"
        )
    };
}

/// SQLite: [`insert_jobs!`] over the JSON array `$1` of objects with those keys.
pub(super) const INSERT_JOBS_SQLITE: &str = insert_jobs!(
    "FROM (SELECT value ->> 'id' AS id, value ->> 'group_id' AS group_id, \
     value ->> 'client_id' AS client_id, value ->> 'kind' AS kind, value ->> 'task' AS task \
     FROM json_each($1)) AS c"
);

/// Postgres: [`insert_jobs!`] over the JSON array `$1` of objects with those keys.
pub(super) const INSERT_JOBS_POSTGRES: &str = insert_jobs!(
    "FROM json_to_recordset(CAST($1 AS json)) \
     AS c(id text, group_id text, client_id text, kind text, task text)"
);

pub(super) const SELECT_BY_CLIENT: &str =
    "SELECT id, status, stage, epoch FROM jobs WHERE client_id = $1";

pub(super) const SELECT_JOB: &str = concat!("SELECT ", job_cols!(), " FROM jobs WHERE id = $1");

/// A page of jobs after the id `$3`: at most `$4`, and none after the job with which the
/// page's stored bytes (task, stage outputs, error) reach `$5` (as result pages keep
/// theirs: the budget plus at most one job), never empty when a job exists. The sizes come from `OCTET_LENGTH`, which neither database reads the
/// value for (Postgres takes a TOASTed value's size from its header, SQLite skips the
/// content); only the jobs on the page are then read whole, so a page of one 15 MB job
/// never reads the other 999. Each job comes with its result's reward and finish reason,
/// found through the results' unique index on `job_id`.
pub(super) const LIST_JOBS: &str = concat!(
    "SELECT ",
    job_cols!(),
    ", (SELECT r.reward FROM results r WHERE r.job_id = jobs.id) AS reward, \
     (SELECT r.finish_reason FROM results r WHERE r.job_id = jobs.id) AS finish_reason \
     FROM jobs WHERE id IN (SELECT id FROM (SELECT id, SUM(size) OVER (ORDER BY id) - size \
     AS bytes_before FROM (SELECT id, OCTET_LENGTH(task) \
     + COALESCE(OCTET_LENGTH(init_output), 0) + COALESCE(OCTET_LENGTH(run_output), 0) \
     + COALESCE(OCTET_LENGTH(error), 0) AS size FROM jobs \
     WHERE ($1 IS NULL OR batch_id = $1) AND ($2 IS NULL OR status = $2) AND id > $3 \
     ORDER BY id LIMIT CAST($4 AS INTEGER)) AS first_rows) AS page \
     WHERE bytes_before < $5 OR bytes_before = 0) ORDER BY id"
);

/// Whether a job of [`LIST_JOBS`]'s filter follows the id `$3` (ids only).
pub(super) const LIST_JOBS_MORE: &str = "SELECT id FROM jobs WHERE ($1 IS NULL OR batch_id = $1) \
     AND ($2 IS NULL OR status = $2) AND id > $3 ORDER BY id LIMIT 1";

/// The condition that the job's batch has not ended (see the `batch_ends` migration):
/// once it has, no job of it starts a stage, renews a lease or moves on.
macro_rules! batch_open {
    () => {
        " AND NOT EXISTS (SELECT 1 FROM batches eb WHERE eb.id = jobs.batch_id \
         AND eb.ended_at IS NOT NULL)"
    };
}

/// What an end records when the job's batch has ended: `cancelled`, no reward, the
/// batch's reason. `eb` is the job's batch when it has ended (a left join), else NULL;
/// `$status`, `$reward` and `$error` are what the end asked for.
macro_rules! end_values {
    ($status:literal, $reward:literal, $error:literal) => {
        concat!(
            "CASE WHEN eb.id IS NULL THEN ",
            $status,
            " ELSE 'cancelled' END, CASE WHEN eb.id IS NULL THEN ",
            $reward,
            " END, CASE WHEN eb.id IS NULL THEN ",
            $error,
            " ELSE eb.end_reason END"
        )
    };
}

/// The join that gives [`end_values!`] the job's batch when it has ended.
macro_rules! ended_batch {
    () => {
        " LEFT JOIN batches eb ON eb.id = jobs.batch_id AND eb.ended_at IS NOT NULL"
    };
}

/// Starts a stage: only from `queued`, or from `running` whose lease has ended (the
/// previous holder died), and only while the job's batch has not ended. Sets the
/// stage's start time to this start.
pub(super) const CLAIM: &str = concat!(
    "UPDATE jobs SET status = 'running', attempts = attempts + 1, \
     stage_attempts = stage_attempts + 1, node = $4, lease_until = $5, \
     updated_at = $6, \
     init_started_at = CASE WHEN stage = 'init' THEN $6 ELSE init_started_at END, \
     run_started_at = CASE WHEN stage = 'run' THEN $6 ELSE run_started_at END, \
     eval_started_at = CASE WHEN stage = 'eval' THEN $6 ELSE eval_started_at END \
     WHERE id = $1 AND stage = $2 AND epoch = $3 \
     AND (status = 'queued' OR (status = 'running' AND lease_until < $6))",
    batch_open!(),
    " RETURNING ",
    job_cols!()
);

// Statements of a claimed stage entry also match `attempts`: the claim's token. A worker
// whose lease lapsed and was taken over cannot renew, release or advance the new claim.

/// Renews a claim's lease; refused once the job's batch has ended, which stops the
/// stage even when the cancel broadcast was missed.
pub(super) const EXTEND_LEASE: &str = concat!(
    "UPDATE jobs SET lease_until = $4 \
     WHERE id = $1 AND stage = $2 AND epoch = $3 AND status = 'running' AND attempts = $5",
    batch_open!()
);

/// Finishes the current stage and queues the next one in a single compare-and-set, while
/// the job's batch has not ended.
pub(super) const ADVANCE: &str = concat!(
    "UPDATE jobs SET status = 'queued', stage = $4, epoch = epoch + 1, \
     stage_attempts = 0, \
     lease_until = NULL, updated_at = $5, route = COALESCE($6, route), \
     init_output = CASE WHEN stage = 'init' THEN $7 ELSE init_output END, \
     run_output = CASE WHEN stage = 'run' THEN $7 ELSE run_output END, \
     init_finished_at = CASE WHEN stage = 'init' THEN $5 ELSE init_finished_at END, \
     run_finished_at = CASE WHEN stage = 'run' THEN $5 ELSE run_finished_at END, \
     run_queued_at = CASE WHEN $4 = 'run' THEN $5 ELSE run_queued_at END, \
     eval_queued_at = CASE WHEN $4 = 'eval' THEN $5 ELSE eval_queued_at END \
     WHERE id = $1 AND stage = $2 AND epoch = $3 AND status = 'running' AND attempts = $8",
    batch_open!(),
    " RETURNING epoch"
);

/// Hands a claimed stage back; `$6` = 1 takes the start back too (a graceful hand-back is
/// not a failed attempt), 0 keeps it (a transient fault is).
pub(super) const RELEASE: &str = "UPDATE jobs SET status = 'queued', lease_until = NULL, \
     updated_at = $4, stage_attempts = stage_attempts - $6 \
     WHERE id = $1 AND stage = $2 AND epoch = $3 AND status = 'running' AND attempts = $5";

/// Sends a running stage back to INIT (its node-local state is gone) under a new stage
/// entry, unless the job has been sent back `$6` times already; `$7` (0 or 1) says
/// whether this one counts.
pub(super) const RESTART: &str = "UPDATE jobs SET status = 'queued', stage = 'init', \
     epoch = epoch + 1, stage_attempts = 0, restarts = restarts + $7, lease_until = NULL, \
     route = NULL, init_output = NULL, run_output = NULL, updated_at = $4, init_queued_at = $4 \
     WHERE id = $1 AND stage = $2 AND epoch = $3 AND status = 'running' AND attempts = $5 \
     AND restarts < $6 RETURNING epoch";

/// RUN jobs still waiting for a sandbox whose node stopped renewing its lease.
pub(super) const ABANDONED_RUNS: &str = "SELECT j.id, j.epoch, j.restarts, s.node FROM sandboxes s \
     JOIN jobs j ON j.id = s.job_id WHERE s.lease_until < $1 AND j.stage = 'run' \
     AND j.status = 'queued' ORDER BY s.lease_until LIMIT CAST($2 AS INTEGER)";

/// Sends a job queued for RUN back to INIT (its node is gone), like `RESTART` does for a
/// running one.
pub(super) const RESTART_QUEUED: &str = "UPDATE jobs SET status = 'queued', stage = 'init', \
     epoch = epoch + 1, stage_attempts = 0, restarts = restarts + 1, lease_until = NULL, \
     route = NULL, init_output = NULL, run_output = NULL, updated_at = $3, init_queued_at = $3 \
     WHERE id = $1 AND stage = 'run' AND epoch = $2 AND status = 'queued' AND restarts < $4 \
     RETURNING epoch";

macro_rules! sandbox_cols {
    () => {
        "job_id, node, backend, dir, socket, lease_until, created_at"
    };
}

pub(super) const PUT_SANDBOX: &str = concat!(
    "INSERT INTO sandboxes (",
    sandbox_cols!(),
    ") VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (job_id) DO UPDATE SET \
     node = excluded.node, backend = excluded.backend, dir = excluded.dir, \
     socket = excluded.socket, lease_until = excluded.lease_until, created_at = excluded.created_at"
);

pub(super) const SELECT_SANDBOX: &str = concat!(
    "SELECT ",
    sandbox_cols!(),
    " FROM sandboxes WHERE job_id = $1"
);

pub(super) const DELETE_SANDBOX: &str = "DELETE FROM sandboxes WHERE job_id = $1";

/// A node's sandboxes that must go: their job ended or is unknown.
pub(super) const SANDBOXES_TO_REAP: &str = "SELECT s.job_id, s.node, s.backend, s.dir, s.socket, \
     s.lease_until, s.created_at FROM sandboxes s LEFT JOIN jobs j ON j.id = s.job_id \
     WHERE s.node = $1 AND (j.id IS NULL OR j.status IN ('done', 'failed', 'cancelled', 'timed_out', 'stale')) \
     ORDER BY s.job_id";

pub(super) const SANDBOXES_OF_NODE: &str = concat!(
    "SELECT ",
    sandbox_cols!(),
    " FROM sandboxes WHERE node = $1 ORDER BY job_id"
);

/// Renews the leases of all of a node's sandboxes (the node is alive to say so), never
/// moving one backwards.
pub(super) const RENEW_SANDBOXES: &str =
    "UPDATE sandboxes SET lease_until = $2 WHERE node = $1 AND lease_until < $2";

/// A page of results after `$1`: at most `$2` rows, and none after the row with which
/// the page's stored bytes (output and error) reach `$3`, never empty when a row
/// exists. The running total is taken over the `$2` rows only, never over the
/// whole table after the cursor, and from the sizes alone (`OCTET_LENGTH`, which reads
/// no value, see [`LIST_JOBS`]): only the rows on the page are read whole.
macro_rules! results_page {
    ($filter:literal) => {
        concat!(
            "SELECT ",
            result_cols!(),
            " FROM results WHERE seq IN (SELECT seq FROM (SELECT seq, SUM(size) OVER \
             (ORDER BY seq) - size AS bytes_before FROM (SELECT seq, OCTET_LENGTH(output) \
             + COALESCE(OCTET_LENGTH(error), 0) AS size FROM results WHERE seq > $1",
            $filter,
            " ORDER BY seq LIMIT CAST($2 AS INTEGER)) AS first_rows) AS page \
             WHERE bytes_before < $3 OR bytes_before = 0) ORDER BY seq"
        )
    };
}

pub(super) const RESULTS_AFTER: &str = results_page!("");

pub(super) const RESULTS_AFTER_IN_BATCH: &str = results_page!(" AND batch_id = $4");

pub(super) const RESULT_OF_JOB: &str =
    concat!("SELECT ", result_cols!(), " FROM results WHERE job_id = $1");

pub(super) const UNPUBLISHED: &str = concat!(
    "SELECT ",
    result_cols!(),
    " FROM results WHERE published_at IS NULL AND created_at < $1 ORDER BY seq LIMIT CAST($2 AS INTEGER)"
);

/// Queued jobs untouched since `$1` and running ones whose lease ended before it.
/// `finished_at IS NULL` holds for exactly the queued and running jobs; it is there so
/// Postgres reads them through its partial index `jobs_unfinished` (its jobs have no
/// index on `status`, which would stop their updates from being HOT).
pub(super) const SELECT_STALE: &str = "SELECT id, stage, epoch, route, status, attempts FROM jobs \
     WHERE finished_at IS NULL \
     AND ((status = 'queued' AND updated_at < $1) OR (status = 'running' AND lease_until < $1)) \
     ORDER BY updated_at LIMIT CAST($2 AS INTEGER)";

/// Queued jobs whose hand-off is between `$2` and `$1` old and untouched since (so each
/// is checked once per hand-off): `updated_at` still equals the stage's queued time.
pub(super) const SELECT_OVERDUE: &str = "SELECT id, stage, epoch, route, status, attempts FROM jobs \
     WHERE finished_at IS NULL AND status = 'queued' AND updated_at < $1 AND updated_at >= $2 \
     AND updated_at = CASE stage WHEN 'init' THEN init_queued_at WHEN 'run' THEN run_queued_at \
     ELSE eval_queued_at END \
     ORDER BY updated_at LIMIT CAST($3 AS INTEGER)";

pub(super) const TOUCH: &str =
    "UPDATE jobs SET updated_at = $3 WHERE id = $1 AND epoch = $2 AND status = 'queued'";

/// A new stage entry for a job whose lease lapsed: new epoch, queued again.
pub(super) const REQUEUE: &str = "UPDATE jobs SET status = 'queued', epoch = epoch + 1, \
     lease_until = NULL, updated_at = $3, \
     init_queued_at = CASE WHEN stage = 'init' THEN $3 ELSE init_queued_at END, \
     run_queued_at = CASE WHEN stage = 'run' THEN $3 ELSE run_queued_at END, \
     eval_queued_at = CASE WHEN stage = 'eval' THEN $3 ELSE eval_queued_at END \
     WHERE id = $1 AND epoch = $2 AND status = 'running' AND lease_until < $3 RETURNING epoch";

pub(super) const COUNTS: &str =
    "SELECT status, stage, COUNT(*) AS n FROM jobs GROUP BY status, stage ORDER BY status, stage";

/// Jobs by status without reading a finished job's row: the unfinished ones counted
/// through an index of them (`jobs_unfinished`, whose predicate `finished_at IS NULL`
/// this implies, or on SQLite possibly the live statuses of `jobs_status`), the finished ones
/// summed from their batches' counters, which the results trigger keeps as each job
/// ends (every end inserts a result).
pub(super) const TOTALS: &str = "SELECT status, CAST(COUNT(*) AS BIGINT) AS n FROM jobs \
     WHERE finished_at IS NULL AND status IN ('queued', 'running') GROUP BY status \
     UNION ALL SELECT 'done', CAST(COALESCE(SUM(done), 0) AS BIGINT) FROM batches \
     UNION ALL SELECT 'failed', CAST(COALESCE(SUM(failed), 0) AS BIGINT) FROM batches \
     UNION ALL SELECT 'cancelled', CAST(COALESCE(SUM(cancelled), 0) AS BIGINT) FROM batches \
     UNION ALL SELECT 'timed_out', CAST(COALESCE(SUM(timed_out), 0) AS BIGINT) FROM batches \
     UNION ALL SELECT 'stale', CAST(COALESCE(SUM(stale), 0) AS BIGINT) FROM batches";

pub(super) const COUNTS_IN_BATCH: &str = "SELECT status, stage, COUNT(*) AS n FROM jobs \
     WHERE batch_id = $1 GROUP BY status, stage ORDER BY status, stage";

pub(super) const SELECT_BATCH: &str = "SELECT id, submitted, finished, done, failed, cancelled, timed_out, stale, ended_at, end_reason \
     FROM batches WHERE id = $1";

/// Ends a batch before its jobs (see the `batch_ends` migration), once.
pub(super) const END_BATCH: &str = "UPDATE batches SET ended_at = $3, end_reason = $2 \
     WHERE id = $1 AND ended_at IS NULL";

pub(super) const BATCH_EXISTS: &str = "SELECT id FROM batches WHERE id = $1";

/// Ended batches with jobs that have not ended (the partial index keeps this to the few
/// ended batches).
pub(super) const ENDED_WITH_LIVE_JOBS: &str = "SELECT id FROM batches \
     WHERE ended_at IS NOT NULL AND finished < submitted ORDER BY ended_at, id";

pub(super) const SELECT_GROUP: &str = "SELECT id, batch_id, submitted, finished, rewarded, reward_sum, \
     reward_min, reward_max FROM prompt_groups WHERE batch_id = $1 AND id = $2";

pub(super) const SELECT_EVENTS: &str = "SELECT at, event, stage, epoch, attempt, node, detail \
     FROM job_events WHERE job_id = $1 ORDER BY id";

pub(super) const INSERT_EVENT: &str = "INSERT INTO job_events (job_id, at, event, stage, node, detail) \
     VALUES ($1, $2, $3, $4, $5, $6)";

macro_rules! backend_cols {
    () => {
        "b.id, b.url, b.kind, b.model, b.tokenizer, b.weight, b.healthy, b.checked_at, \
         b.last_error, b.source, b.served_model_name, b.api_key, b.logprobs_mode"
    };
}

/// Every backend with its active count (`$1` = a job not to count, `$2` = a group whose
/// members to count separately).
pub(super) const SELECT_BACKENDS: &str = concat!(
    "SELECT ",
    backend_cols!(),
    ", (SELECT COUNT(*) FROM backend_assignments a WHERE a.backend_id = b.id \
     AND a.job_id <> $1) AS active, \
     (SELECT COUNT(*) FROM backend_assignments a WHERE a.backend_id = b.id \
     AND a.job_id <> $1 AND a.group_key = $2) AS group_members, \
     (SELECT COUNT(*) FROM backend_group_homes h WHERE h.group_key = $2 \
     AND h.backend_id = b.id) AS group_home \
     FROM backends b ORDER BY b.id"
);

pub(super) const SELECT_BACKEND: &str = concat!(
    "SELECT ",
    backend_cols!(),
    ", (SELECT COUNT(*) FROM backend_assignments a WHERE a.backend_id = b.id) AS active, \
     CAST(0 AS BIGINT) AS group_members, CAST(0 AS BIGINT) AS group_home \
     FROM backends b WHERE b.id = $1"
);

/// Registers or replaces a backend; a changed URL resets its health to unknown (up).
pub(super) const UPSERT_BACKEND: &str = "INSERT INTO backends (id, url, kind, model, tokenizer, \
     weight, healthy, checked_at, last_error, source, created_at, updated_at, \
     served_model_name, api_key, logprobs_mode) \
     VALUES ($1, $2, $3, $4, $5, $6, 1, NULL, NULL, $7, $8, $8, $9, $10, $11) \
     ON CONFLICT (id) DO UPDATE SET \
     healthy = CASE WHEN backends.url = excluded.url THEN backends.healthy ELSE 1 END, \
     checked_at = CASE WHEN backends.url = excluded.url THEN backends.checked_at ELSE NULL END, \
     last_error = CASE WHEN backends.url = excluded.url THEN backends.last_error ELSE NULL END, \
     resume_owed = CASE WHEN backends.url = excluded.url THEN backends.resume_owed ELSE 0 END, \
     url = excluded.url, kind = excluded.kind, model = excluded.model, \
     tokenizer = excluded.tokenizer, weight = excluded.weight, source = excluded.source, \
     served_model_name = excluded.served_model_name, api_key = excluded.api_key, \
     logprobs_mode = excluded.logprobs_mode, updated_at = excluded.updated_at";

pub(super) const DELETE_BACKEND: &str = "DELETE FROM backends WHERE id = $1";

pub(super) const OWE_RESUME: &str = "UPDATE backends SET resume_owed = $2 WHERE id = $1";

pub(super) const OWED_RESUMES: &str = "SELECT id FROM backends WHERE resume_owed <> 0 ORDER BY id";

pub(super) const BACKEND_HEALTH: &str = "SELECT healthy FROM backends WHERE id = $1";

pub(super) const SET_BACKEND_HEALTH: &str = "UPDATE backends SET healthy = $2, last_error = $3, \
     checked_at = $4 WHERE id = $1";

pub(super) const SELECT_ASSIGNMENT: &str =
    "SELECT backend_id, model FROM backend_assignments WHERE job_id = $1";

/// Records a job's backend, in the same statement that checks the job is still in RUN
/// and has not ended: the trigger that deletes assignments fires only when a job leaves
/// RUN or ends, so one written after that (a job cancelled while its worker was picking
/// a backend) would count against the backend for ever. A job this database does not
/// hold (a benchmark's) is assigned as before and releases its own. Postgres first locks
/// the job's row (see `Dialect::lock_job`), so an end committing meanwhile is either
/// seen here or waits for this commit and then deletes the row. No row: not assigned.
pub(super) const PUT_ASSIGNMENT: &str = "INSERT INTO backend_assignments (job_id, backend_id, \
     group_key, model, assigned_at) SELECT $1, $2, $3, $4, $5 WHERE NOT EXISTS (SELECT 1 \
     FROM jobs WHERE id = $1 AND (stage <> 'run' OR finished_at IS NOT NULL)) \
     ON CONFLICT (job_id) DO UPDATE \
     SET backend_id = excluded.backend_id, group_key = excluded.group_key, \
     model = excluded.model, assigned_at = excluded.assigned_at RETURNING job_id";

/// Assignments whose job has left RUN or ended: leaked by a version that assigned
/// without checking (see [`PUT_ASSIGNMENT`]), deleted by the reconciler.
pub(super) const DELETE_LEAKED_ASSIGNMENTS: &str = "DELETE FROM backend_assignments \
     WHERE job_id IN (SELECT j.id FROM jobs j JOIN backend_assignments a ON a.job_id = j.id \
     WHERE j.stage <> 'run' OR j.finished_at IS NOT NULL)";

pub(super) const PUT_GROUP_HOME: &str = "INSERT INTO backend_group_homes (group_key, \
     backend_id, updated_at) VALUES ($1, $2, $3) ON CONFLICT (group_key) DO UPDATE \
     SET backend_id = excluded.backend_id, updated_at = excluded.updated_at";

pub(super) const PRUNE_GROUP_HOMES: &str = "DELETE FROM backend_group_homes WHERE updated_at < $1";

pub(super) const DELETE_ASSIGNMENT: &str = "DELETE FROM backend_assignments WHERE job_id = $1";

/// SQLite: ends a live job (`$2`/`$3` restrict it to one stage entry, `$9` to one claim
/// of it, `$10` to an entry nobody holds a lease on at that time; NULL means no
/// restriction) by inserting its result; a trigger applies the terminal status and the
/// counters. The result's output gathers what the stages left on the job row, with
/// RUN's partial output `$11` (when given) in place of the row's.
pub(super) const FINISH_SQLITE: &str = concat!(
    "INSERT INTO results (job_id, batch_id, group_id, client_id, \
     status, reward, error, output, created_at, ",
    stats_cols!(),
    ") SELECT jobs.id, jobs.batch_id, jobs.group_id, jobs.client_id, ",
    end_values!("$4", "$7", "$5"),
    ", json_object('init', json(init_output), 'run', json(COALESCE($11, run_output)), 'eval', json($8), \
                 'metadata', json_extract(task, '$.metadata')), $6, ",
    run_stats_sqlite!("COALESCE($11, run_output)"),
    " FROM jobs",
    ended_batch!(),
    " WHERE jobs.id = $1 AND status IN ('queued', 'running') \
     AND ($2 IS NULL OR (stage = $2 AND epoch = $3)) \
     AND ($9 IS NULL OR attempts = $9) \
     AND ($10 IS NULL OR status = 'queued' OR lease_until < $10) \
     ON CONFLICT (job_id) DO NOTHING RETURNING ",
    result_cols!()
);

/// Postgres: [`FINISH_SQLITE`] in Postgres's JSON functions and casts. `FOR UPDATE`
/// makes a concurrent end of the same job wait and then re-check the job's state, so
/// exactly one end applies.
pub(super) const FINISH_POSTGRES: &str = concat!(
    "INSERT INTO results (job_id, batch_id, group_id, client_id, \
     status, reward, error, output, created_at, ",
    stats_cols!(),
    ") SELECT jobs.id, jobs.batch_id, jobs.group_id, jobs.client_id, ",
    end_values!("$4", "$7", "$5"),
    ", json_build_object('init', init_output::json, 'run', COALESCE($11::text, run_output)::json, 'eval', $8::json, \
                       'metadata', task::json -> 'metadata')::text, $6, ",
    run_stats_postgres!("COALESCE($11::text, run_output)"),
    " FROM jobs",
    ended_batch!(),
    " WHERE jobs.id = $1 AND status IN ('queued', 'running') \
     AND ($2::text IS NULL OR (stage = $2 AND epoch = $3)) \
     AND ($9::bigint IS NULL OR attempts = $9) \
     AND ($10::bigint IS NULL OR status = 'queued' OR lease_until < $10) \
     FOR UPDATE OF jobs \
     ON CONFLICT (job_id) DO NOTHING RETURNING ",
    result_cols!()
);

/// [`FINISH_SQLITE`] for many jobs at once, over the rows `$from` yields (columns
/// `e_id`, `e_stage`, `e_epoch`, `e_attempt`, `e_unleased`, `e_status`, `e_error`,
/// `e_reward`, `e_eval`, `e_run`, `e_now`: one row per end, distinct jobs, meaning what
/// `$1`, `$2`, `$3`, `$9`, `$10`, `$4`, `$5`, `$7`, `$8`, `$11` and `$6` mean there).
/// Returns the results written; an end without one did not apply. `$output` builds a
/// result's output as `FINISH` does, `$status` names the status column (see
/// [`claim_many!`]), and `$lock` is Postgres's row lock (see [`FINISH_POSTGRES`]).
macro_rules! finish_many {
    ($output:literal, $stats:expr, $from:literal, $status:literal, $lock:literal) => {
        concat!(
            "INSERT INTO results (job_id, batch_id, group_id, client_id, \
             status, reward, error, output, created_at, ",
            stats_cols!(),
            ") SELECT jobs.id, jobs.batch_id, jobs.group_id, jobs.client_id, ",
            end_values!("e_status", "e_reward", "e_error"),
            ", ",
            $output,
            ", e_now, ",
            $stats,
            " FROM ",
            $from,
            ", jobs",
            ended_batch!(),
            " WHERE jobs.id = e_id AND ",
            $status,
            " IN ('queued', 'running') \
             AND (e_stage IS NULL OR (stage = e_stage AND epoch = e_epoch)) \
             AND (e_attempt IS NULL OR attempts = e_attempt) \
             AND (e_unleased IS NULL OR ",
            $status,
            " = 'queued' OR lease_until < e_unleased)",
            $lock,
            " ON CONFLICT (job_id) DO NOTHING RETURNING ",
            result_cols!()
        )
    };
}

/// SQLite: [`finish_many!`] over the JSON array `$1` of objects whose keys are the
/// column names.
pub(super) const FINISH_MANY_SQLITE: &str = finish_many!(
    "json_object('init', json(init_output), 'run', json(COALESCE(e_run, run_output)), \
     'eval', json(e_eval), 'metadata', json_extract(task, '$.metadata'))",
    run_stats_sqlite!("COALESCE(e_run, run_output)"),
    "(SELECT value ->> 'e_id' AS e_id, value ->> 'e_stage' AS e_stage, \
     value ->> 'e_epoch' AS e_epoch, value ->> 'e_attempt' AS e_attempt, \
     value ->> 'e_unleased' AS e_unleased, value ->> 'e_status' AS e_status, \
     value ->> 'e_error' AS e_error, value ->> 'e_reward' AS e_reward, \
     value ->> 'e_eval' AS e_eval, value ->> 'e_run' AS e_run, value ->> 'e_now' AS e_now \
     FROM json_each($1)) AS e",
    "+status",
    ""
);

/// Postgres: [`finish_many!`] over the JSON array `$1`, as [`FINISH_MANY_SQLITE`]. The
/// rows are usually locked in the array's order (a nested loop over it); if two
/// statements ever wait on each other, Postgres fails one and its ends are tried again
/// one by one.
pub(super) const FINISH_MANY_POSTGRES: &str = finish_many!(
    "json_build_object('init', init_output::json, 'run', COALESCE(e_run, run_output)::json, \
     'eval', e_eval::json, 'metadata', task::json -> 'metadata')::text",
    run_stats_postgres!("COALESCE(e_run, run_output)"),
    "json_to_recordset(CAST($1 AS json)) AS e(e_id text, e_stage text, e_epoch bigint, \
     e_attempt bigint, e_unleased bigint, e_status text, e_error text, \
     e_reward double precision, e_eval text, e_run text, e_now bigint)",
    "status",
    " FOR UPDATE OF jobs"
);

/// The last resort of a job's end the database refused: the job fails with `$4` as its
/// error and an empty output, reading nothing of the job's own data. `$2`/`$3`, `$6`
/// and `$7` restrict it as `$2`/`$3`, `$9` and `$10` do [`FINISH_SQLITE`]. The macro
/// takes the parameter casts Postgres needs and its row lock (see [`FINISH_POSTGRES`]),
/// both empty for SQLite.
macro_rules! finish_bare {
    ($text:literal, $bigint:literal, $lock:literal) => {
        concat!(
            "INSERT INTO results (job_id, batch_id, group_id, client_id, \
             status, reward, error, output, created_at) \
             SELECT jobs.id, jobs.batch_id, jobs.group_id, jobs.client_id, ",
            "CASE WHEN eb.id IS NULL THEN 'failed' ELSE 'cancelled' END, NULL, \
             CASE WHEN eb.id IS NULL THEN $4 ELSE eb.end_reason END",
            ", '{\"init\":null,\"run\":null,\"eval\":null,\"metadata\":null}', $5 \
             FROM jobs",
            ended_batch!(),
            " WHERE jobs.id = $1 AND status IN ('queued', 'running') \
             AND ($2",
            $text,
            " IS NULL OR (stage = $2 AND epoch = $3)) AND ($6",
            $bigint,
            " IS NULL OR attempts = $6) AND ($7",
            $bigint,
            " IS NULL OR status = 'queued' OR lease_until < $7)",
            $lock,
            " ON CONFLICT (job_id) DO NOTHING RETURNING ",
            result_cols!()
        )
    };
}

/// SQLite's [`finish_bare!`].
pub(super) const FINISH_BARE_SQLITE: &str = finish_bare!("", "", "");

/// Postgres's [`finish_bare!`].
pub(super) const FINISH_BARE_POSTGRES: &str =
    finish_bare!("::text", "::bigint", " FOR UPDATE OF jobs");

/// SQLite: marks the results whose `seq` is in the JSON array `$2` as published at `$1`.
pub(super) const MARK_PUBLISHED_SQLITE: &str = "UPDATE results SET published_at = $1 \
     WHERE published_at IS NULL AND seq IN (SELECT value FROM json_each($2))";

/// Postgres: marks the results whose `seq` is in the array `$2` as published at `$1`.
pub(super) const MARK_PUBLISHED_POSTGRES: &str =
    "UPDATE results SET published_at = $1 WHERE seq = ANY($2) AND published_at IS NULL";

/// [`CLAIM`] for many stage entries at once, over the rows `$from` yields (columns
/// `c_id`, `c_stage`, `c_epoch`, `c_node`, `c_lease`, `c_now`; one row per claim, distinct
/// jobs). Returns the claimed rows. `$status` is how the conditions name the `status`
/// column: SQLite's planner, given a status test it can answer from the `jobs_status`
/// index, scans every queued job and the array inside it instead of looking each
/// job up by id; `+status` is SQLite's way to keep an index out of a plan.
macro_rules! claim_many {
    ($from:literal, $status:literal) => {
        concat!(
            "UPDATE jobs SET status = 'running', attempts = attempts + 1, \
             stage_attempts = stage_attempts + 1, node = c_node, lease_until = c_lease, \
             updated_at = c_now, \
             init_started_at = CASE WHEN stage = 'init' THEN c_now ELSE init_started_at END, \
             run_started_at = CASE WHEN stage = 'run' THEN c_now ELSE run_started_at END, \
             eval_started_at = CASE WHEN stage = 'eval' THEN c_now ELSE eval_started_at END ",
            $from,
            " WHERE id = c_id AND stage = c_stage AND epoch = c_epoch AND (",
            $status,
            " = 'queued' OR (",
            $status,
            " = 'running' AND lease_until < c_now))",
            batch_open!(),
            " RETURNING ",
            job_cols!()
        )
    };
}

/// [`ADVANCE`] for many stage entries at once, over the rows `$from` yields (columns
/// `c_id`, `c_stage`, `c_epoch`, `c_next`, `c_now`, `c_route`, `c_output`, `c_attempt`;
/// distinct jobs). Returns each advanced job's id and new epoch. `$status` as for
/// [`claim_many!`].
macro_rules! advance_many {
    ($from:literal, $status:literal) => {
        concat!(
            "UPDATE jobs SET status = 'queued', stage = c_next, \
             epoch = epoch + 1, stage_attempts = 0, \
             lease_until = NULL, updated_at = c_now, route = COALESCE(c_route, route), \
             init_output = CASE WHEN stage = 'init' THEN c_output ELSE init_output END, \
             run_output = CASE WHEN stage = 'run' THEN c_output ELSE run_output END, \
             init_finished_at = CASE WHEN stage = 'init' THEN c_now ELSE init_finished_at END, \
             run_finished_at = CASE WHEN stage = 'run' THEN c_now ELSE run_finished_at END, \
             run_queued_at = CASE WHEN c_next = 'run' THEN c_now ELSE run_queued_at END, \
             eval_queued_at = CASE WHEN c_next = 'eval' THEN c_now ELSE eval_queued_at END ",
            $from,
            " WHERE id = c_id AND stage = c_stage AND epoch = c_epoch AND ",
            $status,
            " = 'running' AND attempts = c_attempt",
            batch_open!(),
            " RETURNING id, epoch"
        )
    };
}

/// Postgres: [`claim_many!`] over one array per column, in `CLAIM`'s parameter order.
pub(super) const CLAIM_MANY_POSTGRES: &str = claim_many!(
    "FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[], $5::bigint[], $6::bigint[]) \
     AS c(c_id, c_stage, c_epoch, c_node, c_lease, c_now)",
    "status"
);

/// SQLite: [`claim_many!`] over the JSON array `$1` of objects with the keys `id`,
/// `stage`, `epoch`, `node`, `lease`, `now`.
pub(super) const CLAIM_MANY_SQLITE: &str = claim_many!(
    "FROM (SELECT value ->> 'id' AS c_id, value ->> 'stage' AS c_stage, \
     value ->> 'epoch' AS c_epoch, value ->> 'node' AS c_node, value ->> 'lease' AS c_lease, \
     value ->> 'now' AS c_now FROM json_each($1)) AS c",
    "+status"
);

/// Postgres: [`advance_many!`] over one array per column, in `ADVANCE`'s parameter order.
pub(super) const ADVANCE_MANY_POSTGRES: &str = advance_many!(
    "FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[], $5::bigint[], $6::text[], \
     $7::text[], $8::bigint[]) \
     AS c(c_id, c_stage, c_epoch, c_next, c_now, c_route, c_output, c_attempt)",
    "status"
);

/// SQLite: [`advance_many!`] over the JSON array `$1` of objects with the keys `id`,
/// `stage`, `epoch`, `next`, `now`, `route`, `output` (the output's JSON as a string),
/// `attempt`.
pub(super) const ADVANCE_MANY_SQLITE: &str = advance_many!(
    "FROM (SELECT value ->> 'id' AS c_id, value ->> 'stage' AS c_stage, \
     value ->> 'epoch' AS c_epoch, value ->> 'next' AS c_next, value ->> 'now' AS c_now, \
     value ->> 'route' AS c_route, value ->> 'output' AS c_output, \
     value ->> 'attempt' AS c_attempt FROM json_each($1)) AS c",
    "+status"
);

/// Takes a session-scoped advisory lock (Postgres), held until unlocked or the
/// connection closes; the key is `$1`.
pub(super) const ADVISORY_LOCK: &str = "SELECT pg_advisory_lock($1)";

/// Takes a transaction-scoped advisory lock (Postgres); the key is `$1`.
pub(super) const ADVISORY_XACT_LOCK: &str = "SELECT pg_advisory_xact_lock($1)";

// Sampling batches (see `sampling`).

macro_rules! sampling_cols {
    () => {
        "id, group_size, target_groups, max_groups_in_flight, max_groups, prompt_count, rule, \
         eps, min_mean, max_mean, policy_version, status, next_prompt, groups_launched, \
         groups_decided, informative, surplus, uniform, incomplete, cancelled_groups, \
         stale_groups, sandbox_ms_used, samples_completed, jobs_saved, sandbox_ms_saved, created_at, \
         ended_at, reason, on_cancel, carry_from, kept_groups, adopted_groups"
    };
}

pub(super) const INSERT_BATCH_NEW: &str = "INSERT INTO batches (id, created_at, submitted) \
     VALUES ($1, $2, 0) ON CONFLICT (id) DO NOTHING RETURNING id";

pub(super) const SAMPLING_EXISTS: &str = "SELECT id FROM sampling_batches WHERE id = $1";

pub(super) const INSERT_SAMPLING: &str = "INSERT INTO sampling_batches (id, group_size, \
     target_groups, max_groups_in_flight, max_groups, prompt_count, rule, eps, min_mean, \
     max_mean, policy_version, created_at, updated_at, on_cancel, carry_from) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $12, $13, $14)";

pub(super) const INSERT_PROMPT: &str =
    "INSERT INTO sampling_prompts (batch_id, idx, task) VALUES ($1, $2, $3)";

pub(super) const SELECT_SAMPLING: &str = concat!(
    "SELECT ",
    sampling_cols!(),
    " FROM sampling_batches WHERE id = $1"
);

/// Postgres: holds the batch row for the rest of the transaction. A launch takes it
/// first, in the order a job's end takes its rows (the batch's counters, then the
/// sampling rows), so the two can never wait on each other in a cycle.
pub(super) const LOCK_BATCH_POSTGRES: &str = "SELECT id FROM batches WHERE id = $1 FOR UPDATE";

/// Postgres: holds a job's row against changes (its end, its hand-off) for the rest of
/// the transaction; see `Dialect::lock_job`.
pub(super) const LOCK_JOB_POSTGRES: &str = "SELECT id FROM jobs WHERE id = $1 FOR SHARE";

/// Claims prompts `$3 .. $3 + $2` for launching: a compare-and-set on `next_prompt`, so
/// two launchers can never both take one prompt.
pub(super) const CLAIM_PROMPTS: &str = "UPDATE sampling_batches SET next_prompt = next_prompt + $2, \
     groups_launched = groups_launched + $2, updated_at = $4 \
     WHERE id = $1 AND next_prompt = $3 AND status = 'running'";

pub(super) const SELECT_PROMPTS: &str = "SELECT idx, task FROM sampling_prompts \
     WHERE batch_id = $1 AND idx >= $2 AND idx < $3 ORDER BY idx";

pub(super) const INSERT_SAMPLING_GROUP: &str = "INSERT INTO sampling_groups \
     (batch_id, idx, group_id, launched_at) VALUES ($1, $2, $3, $4) \
     ON CONFLICT (batch_id, idx) DO NOTHING";

/// What a result of a sampling group needs to know: the group, its batch's rule, and
/// whether this was the group's last sample (the trigger has just counted it).
pub(super) const GROUP_OF_RESULT: &str = "SELECT g.state, b.rule, b.eps, b.min_mean, \
     b.max_mean, b.sandbox_ms_used, b.samples_completed, pg.finished, pg.submitted, g.carried_to \
     FROM sampling_groups g JOIN sampling_batches b ON b.id = g.batch_id \
     JOIN prompt_groups pg ON pg.batch_id = g.batch_id AND pg.id = g.group_id \
     WHERE g.batch_id = $1 AND g.group_id = $2";

pub(super) const JOB_STARTED_AT: &str = "SELECT init_started_at FROM jobs WHERE id = $1";

pub(super) const COUNT_SAMPLE: &str = "UPDATE sampling_batches SET \
     sandbox_ms_used = sandbox_ms_used + $2, samples_completed = samples_completed + $3, \
     jobs_saved = jobs_saved + $4, sandbox_ms_saved = sandbox_ms_saved + $5, updated_at = $6 \
     WHERE id = $1";

pub(super) const GROUP_REWARDS: &str =
    "SELECT status, reward FROM results WHERE batch_id = $1 AND group_id = $2";

/// Decides a group once: only an `in_flight` group takes a verdict.
pub(super) const DECIDE_GROUP: &str = "UPDATE sampling_groups SET state = $3, reward_mean = $4, \
     reward_std = $5, decided_at = $6 WHERE batch_id = $1 AND group_id = $2 AND state = 'in_flight'";

/// Accepts an informative group if the batch still wants one: the rank is the new
/// count, and the K-th acceptance completes the batch in the same statement.
pub(super) const ACCEPT_GROUP: &str = "UPDATE sampling_batches SET informative = informative + 1, \
     groups_decided = groups_decided + 1, \
     status = CASE WHEN informative + 1 >= target_groups THEN 'complete' ELSE status END, \
     ended_at = CASE WHEN informative + 1 >= target_groups THEN $2 ELSE ended_at END, \
     updated_at = $2 \
     WHERE id = $1 AND status = 'running' AND informative < target_groups \
     RETURNING informative";

pub(super) const SET_RANK: &str =
    "UPDATE sampling_groups SET accepted_rank = $3 WHERE batch_id = $1 AND group_id = $2";

/// Counts a verdict that is not an acceptance (`$2` names it; `informative` here is a
/// surplus group, decided after the batch ended).
pub(super) const COUNT_VERDICT: &str = "UPDATE sampling_batches SET \
     groups_decided = groups_decided + 1, \
     surplus = surplus + CASE WHEN $2 = 'informative' THEN 1 ELSE 0 END, \
     uniform = uniform + CASE WHEN $2 = 'uniform' THEN 1 ELSE 0 END, \
     incomplete = incomplete + CASE WHEN $2 = 'incomplete' THEN 1 ELSE 0 END, \
     cancelled_groups = cancelled_groups + CASE WHEN $2 = 'cancelled' THEN 1 ELSE 0 END, \
     stale_groups = stale_groups + CASE WHEN $2 = 'stale' THEN 1 ELSE 0 END, \
     updated_at = $3 WHERE id = $1";

/// Gives up on a batch whose every allowed prompt was tried and decided.
pub(super) const EXHAUST: &str = "UPDATE sampling_batches SET status = 'exhausted', \
     ended_at = $2, updated_at = $2, reason = $3 \
     WHERE id = $1 AND status = 'running' AND groups_launched - adopted_groups >= max_groups \
     AND groups_decided >= groups_launched";

/// The row of an adopted group in the batch that adopted it (`$1`, group id `$2`),
/// with the adopter's rule, for its verdict.
pub(super) const TARGET_GROUP: &str = "SELECT g.state, b.rule, b.eps, b.min_mean, b.max_mean \
     FROM sampling_groups g JOIN sampling_batches b ON b.id = g.batch_id \
     WHERE g.batch_id = $1 AND g.group_id = $2";

/// Marks the groups still in flight of an ended `keep` batch kept (none otherwise).
pub(super) const KEEP_STRAGGLERS: &str = "UPDATE sampling_groups SET state = 'kept' \
     WHERE batch_id = $1 AND state = 'in_flight' AND EXISTS (SELECT 1 FROM sampling_batches b \
     WHERE b.id = $1 AND b.status <> 'running' AND b.on_cancel = 'keep')";

/// Counts `$2` groups kept by batch `$1` among its decided ones.
pub(super) const COUNT_KEPT: &str = "UPDATE sampling_batches SET kept_groups = kept_groups + $2, \
     groups_decided = groups_decided + $2, updated_at = $3 WHERE id = $1";

/// A kept group that ended before any batch adopted it keeps its verdict for the adopter.
pub(super) const KEPT_VERDICT: &str = "UPDATE sampling_groups SET kept_verdict = $3, \
     reward_mean = $4, reward_std = $5, decided_at = $6 \
     WHERE batch_id = $1 AND group_id = $2 AND state = 'kept' AND kept_verdict IS NULL";

/// The kept groups of batch `$1` no batch has adopted: the row's group id, where its
/// jobs are (batch and group), and the verdict it took if it has ended.
pub(super) const ADOPTABLE: &str = "SELECT group_id, COALESCE(source_batch, batch_id), \
     COALESCE(source_group, group_id), kept_verdict, reward_mean, reward_std \
     FROM sampling_groups WHERE batch_id = $1 AND state = 'kept' AND carried_to IS NULL \
     ORDER BY idx";

/// The batches whose jobs the kept groups of batch `$1` are (itself, and those it
/// adopted from), whose rows an adopter locks first, as those jobs' ends take them.
pub(super) const KEPT_ORIGINS: &str = "SELECT DISTINCT COALESCE(source_batch, batch_id) \
     FROM sampling_groups WHERE batch_id = $1 AND state = 'kept' AND carried_to IS NULL";

/// Points a kept group's row (batch `$1`, group `$2`) at its adopter `$3`.
pub(super) const CARRY: &str =
    "UPDATE sampling_groups SET carried_to = $3 WHERE batch_id = $1 AND group_id = $2";

/// An adopted group's row in its adopter.
pub(super) const INSERT_ADOPTED: &str = "INSERT INTO sampling_groups \
     (batch_id, idx, group_id, launched_at, source_batch, source_group) \
     VALUES ($1, $2, $3, $4, $5, $6)";

/// Counts `$2` adopted groups into batch `$1`, among the launched ones.
pub(super) const COUNT_ADOPTED: &str = "UPDATE sampling_batches SET \
     groups_launched = groups_launched + $2, adopted_groups = adopted_groups + $2, \
     updated_at = $3 WHERE id = $1";

pub(super) const SAMPLING_STATUS: &str = "SELECT status FROM sampling_batches WHERE id = $1";

pub(super) const END_SAMPLING: &str = "UPDATE sampling_batches SET status = $2, reason = $3, \
     ended_at = $4, updated_at = $4 WHERE id = $1 AND status = 'running'";

/// Every group of batch `$1` with its verdict, in launch order, the first `$2` (an
/// adopted group under its own id and prompt index, as [`ACCEPTED_GROUPS`] has them).
pub(super) const GROUP_VERDICTS: &str = "SELECT COALESCE(g.source_group, g.group_id) AS group_id, \
     COALESCE(o.idx, g.idx) AS prompt_index, g.state, g.accepted_rank, g.reward_mean, \
     g.reward_std, g.launched_at, g.decided_at, g.source_batch AS carried_from \
     FROM sampling_groups g LEFT JOIN sampling_groups o \
     ON o.batch_id = g.source_batch AND o.group_id = g.source_group \
     WHERE g.batch_id = $1 ORDER BY g.launched_at, g.idx LIMIT CAST($2 AS INTEGER)";

pub(super) const ACCEPTED_GROUPS: &str = "SELECT COALESCE(o.idx, g.idx), \
     COALESCE(g.source_group, g.group_id), g.accepted_rank, g.reward_mean, g.reward_std, \
     g.source_batch FROM sampling_groups g LEFT JOIN sampling_groups o \
     ON o.batch_id = g.source_batch AND o.group_id = g.source_group \
     WHERE g.batch_id = $1 AND g.accepted_rank > $2 \
     ORDER BY g.accepted_rank LIMIT CAST($3 AS INTEGER)";

pub(super) const RESULTS_OF_GROUP: &str = concat!(
    "SELECT ",
    result_cols!(),
    " FROM results WHERE batch_id = $1 AND group_id = $2 ORDER BY seq"
);

pub(super) const LIVE_JOBS: &str = "SELECT id FROM jobs WHERE batch_id = $1 \
     AND status IN ('queued', 'running') \
     UNION SELECT j.id FROM sampling_groups g JOIN jobs j ON j.batch_id = g.source_batch \
     AND j.group_id = g.source_group WHERE g.batch_id = $1 AND g.state = 'in_flight' \
     AND j.status IN ('queued', 'running') ORDER BY 1 LIMIT CAST($2 AS INTEGER)";

/// Batches with work for a driver: running ones (launch), ended ones with groups still
/// out (cancel the rest), and ones with accepted groups not yet published.
pub(super) const SAMPLING_TO_DRIVE: &str = "SELECT id FROM sampling_batches b \
     WHERE status = 'running' OR groups_decided < groups_launched \
     OR EXISTS (SELECT 1 FROM sampling_groups g WHERE g.batch_id = b.id \
     AND g.accepted_rank IS NOT NULL AND g.published_at IS NULL) ORDER BY id";

pub(super) const UNPUBLISHED_GROUPS: &str = "SELECT accepted_rank FROM sampling_groups \
     WHERE batch_id = $1 AND accepted_rank IS NOT NULL AND published_at IS NULL \
     ORDER BY accepted_rank";

/// Takes a batch's group-publisher lease (until `$3`) if it is free or lapsed at `$2`.
pub(super) const CLAIM_GROUP_PUBLISHER: &str = "UPDATE sampling_batches SET publisher_until = $3 \
     WHERE id = $1 AND (publisher_until IS NULL OR publisher_until <= $2)";

/// Gives the lease back, if it is still the one taken until `$2`.
pub(super) const RELEASE_GROUP_PUBLISHER: &str = "UPDATE sampling_batches \
     SET publisher_until = NULL WHERE id = $1 AND publisher_until = $2";

pub(super) const MARK_GROUP_PUBLISHED: &str = "UPDATE sampling_groups SET published_at = $3 \
     WHERE batch_id = $1 AND accepted_rank = $2 AND published_at IS NULL";

// The status page's reads: the dashboard views (0009, and 0012 on Postgres / 0010 on
// SQLite), newest first.

pub(super) const DASHBOARD_BATCHES: &str = "SELECT batch_id, created_at, submitted, finished, \
     in_flight, done, failed, cancelled, timed_out, stale, rewarded, reward_mean, last_result_at \
     FROM batch_progress ORDER BY created_at DESC, batch_id LIMIT CAST($1 AS INTEGER)";

pub(super) const DASHBOARD_QUEUES: &str = "SELECT stage, position, queued, running, \
     oldest_queued_at FROM stage_queue ORDER BY position";

/// Stages that finished at or after `$1`, of jobs that ended then too: the condition on
/// the job's end is what reaches `jobs` through its partial index `jobs_finished`
/// instead of reading every job.
pub(super) const DASHBOARD_TIMINGS: &str = "SELECT stage, wait_ms, work_ms, finished_at FROM stage_timings \
     WHERE finished_at >= $1 AND job_finished_at >= $1 \
     ORDER BY finished_at DESC LIMIT CAST($2 AS INTEGER)";

/// A batch's latest `$2` results' summary columns, through the index on
/// `(batch_id, seq)`.
pub(super) const RESULT_STATS: &str = "SELECT batch_id, status, reward, finish_reason, turns, \
     response_tokens, tool_calls, tool_errors, policy_version, created_at FROM results \
     WHERE batch_id = $1 ORDER BY seq DESC LIMIT CAST($2 AS INTEGER)";

pub(super) const DASHBOARD_THROUGHPUT: &str = "SELECT minute, status, jobs, reward_mean \
     FROM throughput_per_minute WHERE minute >= $1 ORDER BY minute, status";

/// `failures_by_reason`'s rows over the latest `$2` failures that ended at or after `$1`
/// (read newest first through the partial index `results_failures`), the `$3` most
/// recent.
pub(super) const DASHBOARD_FAILURES: &str = "SELECT status, kind, reason, COUNT(*) AS jobs, \
     MAX(ended_at) AS last_at, MAX(job_id) AS example_job_id \
     FROM (SELECT job_id, kind, status, reason, ended_at FROM failed_results \
           WHERE ended_at >= $1 ORDER BY ended_at DESC LIMIT CAST($2 AS INTEGER)) f \
     GROUP BY status, kind, reason ORDER BY last_at DESC, reason LIMIT CAST($3 AS INTEGER)";

pub(super) const DASHBOARD_BACKENDS: &str = "SELECT backend_id, kind, model, url, weight, \
     healthy, checked_at, last_error, source, in_flight FROM backend_load ORDER BY backend_id";

pub(super) const DASHBOARD_SANDBOXES: &str = "SELECT node, backend, sandboxes, \
     oldest_created_at, earliest_lease_until FROM sandbox_counts ORDER BY node, backend";

pub(super) const DASHBOARD_SAMPLING: &str = "SELECT batch_id, status, reason, group_size, \
     target_groups, informative, surplus, uniform, incomplete, cancelled_groups, \
     stale_groups, kept_groups, adopted_groups, groups_launched, groups_decided, \
     samples_completed, jobs_saved, sandbox_ms_used, sandbox_ms_saved, created_at, ended_at \
     FROM sampling_progress \
     ORDER BY created_at DESC, batch_id LIMIT CAST($1 AS INTEGER)";

/// Makes `$1` the current policy version if it is newer than the current one (or none
/// is) and no weight update is in progress; returns the row when it did. The row lock
/// orders concurrent announcers.
pub(super) const ANNOUNCE_POLICY: &str = "UPDATE policy SET version = $1, announced_at = $2, \
     seq = seq + 1 WHERE id = 1 AND (version IS NULL OR version < $1) AND pause_version IS NULL \
     RETURNING version, announced_at";

/// Starts a weight update to `$1` (mode `$2`, since `$3`, lease until `$4`) if `$1` is
/// newer than the current version and no update is in progress.
pub(super) const BEGIN_POLICY_PAUSE: &str = "UPDATE policy SET pause_version = $1, \
     pause_mode = $2, pause_since = $3, pause_until = $4, seq = seq + 1 \
     WHERE id = 1 AND (version IS NULL OR version < $1) AND pause_version IS NULL";

/// Extends the lease of the update to `$1` in mode `$2` (a repeated request) to `$3`.
pub(super) const RENEW_POLICY_PAUSE: &str = "UPDATE policy SET pause_until = $3, seq = seq + 1 \
     WHERE id = 1 AND pause_version = $1 AND pause_mode = $2";

/// Ends the update to `$1`: its version becomes current (announced at `$2`).
pub(super) const END_POLICY_PAUSE: &str = "UPDATE policy SET version = pause_version, \
     announced_at = $2, pause_version = NULL, pause_mode = NULL, pause_since = NULL, \
     pause_until = NULL, seq = seq + 1 WHERE id = 1 AND pause_version = $1";

/// Clears the update to `$1` whose lease ran out before `$2`, without its version.
pub(super) const EXPIRE_POLICY_PAUSE: &str = "UPDATE policy SET pause_version = NULL, \
     pause_mode = NULL, pause_since = NULL, pause_until = NULL, seq = seq + 1 \
     WHERE id = 1 AND pause_version = $1 AND pause_until <= $2";

/// The policy row: the current version and the update in progress.
pub(super) const POLICY_STATE: &str = "SELECT seq, version, announced_at, pause_version, \
     pause_mode, pause_since, pause_until FROM policy WHERE id = 1";

/// Keeps an announced version in the record.
pub(super) const RECORD_POLICY_VERSION: &str = "INSERT INTO policy_versions (version, announced_at) \
     VALUES ($1, $2) ON CONFLICT (version) DO NOTHING";

/// The latest announced versions, newest first.
pub(super) const RECENT_POLICY_VERSIONS: &str = "SELECT version, announced_at FROM policy_versions \
     ORDER BY version DESC LIMIT $1";
