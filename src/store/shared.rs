//! The SQL both backends run, and the macro that implements [`Store`](super::Store) for a
//! backend from it.
//!
//! Every statement is written once in the dialect SQLite and Postgres share. The macro
//! expands the same method bodies over each backend's connection type. Reads run on
//! `self.pool`; every write runs inside `self.write(op)` (ops of one writing statement)
//! or `self.write_atomic(op)` (ops of several, which must apply all or nothing), where
//! `op` is a closure over a connection that is already inside a transaction. Each backend decides how: Postgres gives each op a transaction of
//! its own; SQLite queues ops for its single writer, which commits many of them together
//! (group commit; see [`super::sqlite`]). A backend also provides `order_results(conn)`,
//! what makes result sequence numbers visible in commit order.

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

/// Creates the batch row if it is new, without locking an existing one: a submit into a
/// live batch must not hold its row (which every result of the batch updates) while it
/// inserts its jobs.
pub(crate) const INSERT_BATCH: &str = "INSERT INTO batches (id, created_at, submitted) \
     VALUES ($1, $2, 0) ON CONFLICT (id) DO NOTHING";

/// Counts a submit's new jobs into its batch: the last statement of a submit, so the
/// row is held only until the commit right after.
pub(crate) const COUNT_BATCH: &str = "UPDATE batches SET submitted = submitted + $2 WHERE id = $1";

pub(crate) const INSERT_GROUP: &str = "INSERT INTO prompt_groups (batch_id, id, created_at, submitted) \
     VALUES ($1, $2, $3, $4) ON CONFLICT (batch_id, id) DO UPDATE SET submitted = prompt_groups.submitted + excluded.submitted";

pub(crate) const INSERT_JOB: &str = "INSERT INTO jobs (id, batch_id, group_id, client_id, kind, task, \
     status, stage, epoch, attempts, created_at, updated_at, init_queued_at) \
     VALUES ($1, $2, $3, $4, $5, $6, 'queued', 'init', 0, 0, $7, $7, $7) \
     ON CONFLICT (client_id) DO NOTHING RETURNING id";

pub(crate) const SELECT_BY_CLIENT: &str =
    "SELECT id, status, stage, epoch FROM jobs WHERE client_id = $1";

pub(crate) const SELECT_JOB: &str = concat!("SELECT ", job_cols!(), " FROM jobs WHERE id = $1");

pub(crate) const LIST_JOBS: &str = concat!(
    "SELECT ",
    job_cols!(),
    " FROM jobs WHERE ($1 IS NULL OR batch_id = $1) AND ($2 IS NULL OR status = $2) \
     AND id > $3 ORDER BY id LIMIT CAST($4 AS INTEGER)"
);

/// Starts a stage: only from `queued`, or from `running` whose lease has ended (the
/// previous holder died). Sets the stage's start time to this start.
pub(crate) const CLAIM: &str = concat!(
    "UPDATE jobs SET status = 'running', attempts = attempts + 1, \
     stage_attempts = stage_attempts + 1, node = $4, lease_until = $5, \
     updated_at = $6, \
     init_started_at = CASE WHEN stage = 'init' THEN $6 ELSE init_started_at END, \
     run_started_at = CASE WHEN stage = 'run' THEN $6 ELSE run_started_at END, \
     eval_started_at = CASE WHEN stage = 'eval' THEN $6 ELSE eval_started_at END \
     WHERE id = $1 AND stage = $2 AND epoch = $3 \
     AND (status = 'queued' OR (status = 'running' AND lease_until < $6)) RETURNING ",
    job_cols!()
);

// Statements of a claimed stage entry also match `attempts`: the claim's token. A worker
// whose lease lapsed and was taken over cannot renew, release or advance the new claim.

pub(crate) const EXTEND_LEASE: &str = "UPDATE jobs SET lease_until = $4 \
     WHERE id = $1 AND stage = $2 AND epoch = $3 AND status = 'running' AND attempts = $5";

/// Finishes the current stage and queues the next one in a single compare-and-set.
pub(crate) const ADVANCE: &str = "UPDATE jobs SET status = 'queued', stage = $4, epoch = epoch + 1, \
     stage_attempts = 0, \
     lease_until = NULL, updated_at = $5, route = COALESCE($6, route), \
     init_output = CASE WHEN stage = 'init' THEN $7 ELSE init_output END, \
     run_output = CASE WHEN stage = 'run' THEN $7 ELSE run_output END, \
     init_finished_at = CASE WHEN stage = 'init' THEN $5 ELSE init_finished_at END, \
     run_finished_at = CASE WHEN stage = 'run' THEN $5 ELSE run_finished_at END, \
     run_queued_at = CASE WHEN $4 = 'run' THEN $5 ELSE run_queued_at END, \
     eval_queued_at = CASE WHEN $4 = 'eval' THEN $5 ELSE eval_queued_at END \
     WHERE id = $1 AND stage = $2 AND epoch = $3 AND status = 'running' AND attempts = $8 \
     RETURNING epoch";

/// Hands a claimed stage back; `$6` = 1 takes the start back too (a graceful hand-back is
/// not a failed attempt), 0 keeps it (a transient fault is).
pub(crate) const RELEASE: &str = "UPDATE jobs SET status = 'queued', lease_until = NULL, \
     updated_at = $4, stage_attempts = stage_attempts - $6 \
     WHERE id = $1 AND stage = $2 AND epoch = $3 AND status = 'running' AND attempts = $5";

/// Sends a running stage back to INIT (its node-local state is gone) under a new stage
/// entry, unless the job has been sent back `$6` times already; `$7` (0 or 1) says
/// whether this one counts.
pub(crate) const RESTART: &str = "UPDATE jobs SET status = 'queued', stage = 'init', \
     epoch = epoch + 1, stage_attempts = 0, restarts = restarts + $7, lease_until = NULL, \
     route = NULL, init_output = NULL, run_output = NULL, updated_at = $4, init_queued_at = $4 \
     WHERE id = $1 AND stage = $2 AND epoch = $3 AND status = 'running' AND attempts = $5 \
     AND restarts < $6 RETURNING epoch";

/// RUN jobs still waiting for a sandbox whose node stopped renewing its lease.
pub(crate) const ABANDONED_RUNS: &str = "SELECT j.id, j.epoch, j.restarts, s.node FROM sandboxes s \
     JOIN jobs j ON j.id = s.job_id WHERE s.lease_until < $1 AND j.stage = 'run' \
     AND j.status = 'queued' ORDER BY s.lease_until LIMIT CAST($2 AS INTEGER)";

/// Sends a job queued for RUN back to INIT (its node is gone), like `RESTART` does for a
/// running one.
pub(crate) const RESTART_QUEUED: &str = "UPDATE jobs SET status = 'queued', stage = 'init', \
     epoch = epoch + 1, stage_attempts = 0, restarts = restarts + 1, lease_until = NULL, \
     route = NULL, init_output = NULL, run_output = NULL, updated_at = $3, init_queued_at = $3 \
     WHERE id = $1 AND stage = 'run' AND epoch = $2 AND status = 'queued' AND restarts < $4 \
     RETURNING epoch";

macro_rules! sandbox_cols {
    () => {
        "job_id, node, backend, dir, socket, lease_until, created_at"
    };
}

pub(crate) const PUT_SANDBOX: &str = concat!(
    "INSERT INTO sandboxes (",
    sandbox_cols!(),
    ") VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (job_id) DO UPDATE SET \
     node = excluded.node, backend = excluded.backend, dir = excluded.dir, \
     socket = excluded.socket, lease_until = excluded.lease_until, created_at = excluded.created_at"
);

pub(crate) const SELECT_SANDBOX: &str = concat!(
    "SELECT ",
    sandbox_cols!(),
    " FROM sandboxes WHERE job_id = $1"
);

pub(crate) const DELETE_SANDBOX: &str = "DELETE FROM sandboxes WHERE job_id = $1";

/// A node's sandboxes that must go: their job ended or is unknown.
pub(crate) const SANDBOXES_TO_REAP: &str = "SELECT s.job_id, s.node, s.backend, s.dir, s.socket, \
     s.lease_until, s.created_at FROM sandboxes s LEFT JOIN jobs j ON j.id = s.job_id \
     WHERE s.node = $1 AND (j.id IS NULL OR j.status IN ('done', 'failed', 'cancelled', 'timed_out')) \
     ORDER BY s.job_id";

pub(crate) const SANDBOXES_OF_NODE: &str = concat!(
    "SELECT ",
    sandbox_cols!(),
    " FROM sandboxes WHERE node = $1 ORDER BY job_id"
);

/// Renews the leases of all of a node's sandboxes (the node is alive to say so), never
/// moving one backwards.
pub(crate) const RENEW_SANDBOXES: &str =
    "UPDATE sandboxes SET lease_until = $2 WHERE node = $1 AND lease_until < $2";

/// A page of results after `$1`: at most `$2` rows, ending before the row that would
/// take the page's stored bytes (output and error) over `$3`, but never empty when a
/// row exists. The running total is taken over the `$2` rows only, never over the
/// whole table after the cursor.
macro_rules! results_page {
    ($filter:literal) => {
        concat!(
            "SELECT ",
            result_cols!(),
            " FROM (SELECT ",
            result_cols!(),
            ", SUM(LENGTH(output) + COALESCE(LENGTH(error), 0)) OVER (ORDER BY seq) \
             - LENGTH(output) - COALESCE(LENGTH(error), 0) AS bytes_before \
             FROM (SELECT ",
            result_cols!(),
            " FROM results WHERE seq > $1",
            $filter,
            " ORDER BY seq LIMIT CAST($2 AS INTEGER)) AS first_rows) AS page \
             WHERE bytes_before < $3 ORDER BY seq"
        )
    };
}

pub(crate) const RESULTS_AFTER: &str = results_page!("");

pub(crate) const RESULTS_AFTER_IN_BATCH: &str = results_page!(" AND batch_id = $4");

pub(crate) const RESULT_OF_JOB: &str =
    concat!("SELECT ", result_cols!(), " FROM results WHERE job_id = $1");

pub(crate) const UNPUBLISHED: &str = concat!(
    "SELECT ",
    result_cols!(),
    " FROM results WHERE published_at IS NULL AND created_at < $1 ORDER BY seq LIMIT CAST($2 AS INTEGER)"
);

pub(crate) const SELECT_STALE: &str = "SELECT id, stage, epoch, route, status, attempts FROM jobs \
     WHERE (status = 'queued' AND updated_at < $1) OR (status = 'running' AND lease_until < $1) \
     ORDER BY updated_at LIMIT CAST($2 AS INTEGER)";

/// Queued jobs whose hand-off is between `$2` and `$1` old and untouched since (so each
/// is checked once per hand-off): `updated_at` still equals the stage's queued time.
pub(crate) const SELECT_OVERDUE: &str = "SELECT id, stage, epoch, route, status, attempts FROM jobs \
     WHERE status = 'queued' AND updated_at < $1 AND updated_at >= $2 \
     AND updated_at = CASE stage WHEN 'init' THEN init_queued_at WHEN 'run' THEN run_queued_at \
     ELSE eval_queued_at END \
     ORDER BY updated_at LIMIT CAST($3 AS INTEGER)";

pub(crate) const TOUCH: &str =
    "UPDATE jobs SET updated_at = $3 WHERE id = $1 AND epoch = $2 AND status = 'queued'";

/// A new stage entry for a job whose lease lapsed: new epoch, queued again.
pub(crate) const REQUEUE: &str = "UPDATE jobs SET status = 'queued', epoch = epoch + 1, \
     lease_until = NULL, updated_at = $3, \
     init_queued_at = CASE WHEN stage = 'init' THEN $3 ELSE init_queued_at END, \
     run_queued_at = CASE WHEN stage = 'run' THEN $3 ELSE run_queued_at END, \
     eval_queued_at = CASE WHEN stage = 'eval' THEN $3 ELSE eval_queued_at END \
     WHERE id = $1 AND epoch = $2 AND status = 'running' AND lease_until < $3 RETURNING epoch";

pub(crate) const COUNTS: &str =
    "SELECT status, stage, COUNT(*) AS n FROM jobs GROUP BY status, stage ORDER BY status, stage";

pub(crate) const COUNTS_IN_BATCH: &str = "SELECT status, stage, COUNT(*) AS n FROM jobs \
     WHERE batch_id = $1 GROUP BY status, stage ORDER BY status, stage";

pub(crate) const SELECT_BATCH: &str =
    "SELECT id, submitted, finished, done, failed, cancelled, timed_out FROM batches WHERE id = $1";

pub(crate) const SELECT_GROUP: &str = "SELECT id, batch_id, submitted, finished, rewarded, reward_sum, \
     reward_min, reward_max FROM prompt_groups WHERE batch_id = $1 AND id = $2";

pub(crate) const SELECT_EVENTS: &str = "SELECT at, event, stage, epoch, attempt, node, detail \
     FROM job_events WHERE job_id = $1 ORDER BY id";

pub(crate) const INSERT_EVENT: &str = "INSERT INTO job_events (job_id, at, event, stage, node, detail) \
     VALUES ($1, $2, $3, $4, $5, $6)";

macro_rules! backend_cols {
    () => {
        "b.id, b.url, b.kind, b.model, b.tokenizer, b.weight, b.healthy, b.checked_at, \
         b.last_error, b.source, b.served_model_name, b.api_key, b.logprobs_mode"
    };
}

/// Every backend with its active count (`$1` = a job not to count, `$2` = a group whose
/// members to count separately).
pub(crate) const SELECT_BACKENDS: &str = concat!(
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

pub(crate) const SELECT_BACKEND: &str = concat!(
    "SELECT ",
    backend_cols!(),
    ", (SELECT COUNT(*) FROM backend_assignments a WHERE a.backend_id = b.id) AS active, \
     CAST(0 AS BIGINT) AS group_members, CAST(0 AS BIGINT) AS group_home \
     FROM backends b WHERE b.id = $1"
);

/// Registers or replaces a backend; a changed URL resets its health to unknown (up).
pub(crate) const UPSERT_BACKEND: &str = "INSERT INTO backends (id, url, kind, model, tokenizer, \
     weight, healthy, checked_at, last_error, source, created_at, updated_at, \
     served_model_name, api_key, logprobs_mode) \
     VALUES ($1, $2, $3, $4, $5, $6, 1, NULL, NULL, $7, $8, $8, $9, $10, $11) \
     ON CONFLICT (id) DO UPDATE SET \
     healthy = CASE WHEN backends.url = excluded.url THEN backends.healthy ELSE 1 END, \
     checked_at = CASE WHEN backends.url = excluded.url THEN backends.checked_at ELSE NULL END, \
     last_error = CASE WHEN backends.url = excluded.url THEN backends.last_error ELSE NULL END, \
     url = excluded.url, kind = excluded.kind, model = excluded.model, \
     tokenizer = excluded.tokenizer, weight = excluded.weight, source = excluded.source, \
     served_model_name = excluded.served_model_name, api_key = excluded.api_key, \
     logprobs_mode = excluded.logprobs_mode, updated_at = excluded.updated_at";

pub(crate) const DELETE_BACKEND: &str = "DELETE FROM backends WHERE id = $1";

pub(crate) const BACKEND_HEALTH: &str = "SELECT healthy FROM backends WHERE id = $1";

pub(crate) const SET_BACKEND_HEALTH: &str = "UPDATE backends SET healthy = $2, last_error = $3, \
     checked_at = $4 WHERE id = $1";

pub(crate) const SELECT_ASSIGNMENT: &str =
    "SELECT backend_id, model FROM backend_assignments WHERE job_id = $1";

pub(crate) const PUT_ASSIGNMENT: &str = "INSERT INTO backend_assignments (job_id, backend_id, \
     group_key, model, assigned_at) VALUES ($1, $2, $3, $4, $5) ON CONFLICT (job_id) DO UPDATE \
     SET backend_id = excluded.backend_id, group_key = excluded.group_key, \
     model = excluded.model, assigned_at = excluded.assigned_at";

pub(crate) const PUT_GROUP_HOME: &str = "INSERT INTO backend_group_homes (group_key, \
     backend_id, updated_at) VALUES ($1, $2, $3) ON CONFLICT (group_key) DO UPDATE \
     SET backend_id = excluded.backend_id, updated_at = excluded.updated_at";

pub(crate) const PRUNE_GROUP_HOMES: &str = "DELETE FROM backend_group_homes WHERE updated_at < $1";

pub(crate) const DELETE_ASSIGNMENT: &str = "DELETE FROM backend_assignments WHERE job_id = $1";

/// Implements [`Store`](super::Store) for `$store` over connections of type `$conn`.
macro_rules! impl_store {
    ($store:ty, $conn:ty) => {
        impl $store {
            /// Runs `sql`, an update of the claimed stage entry named by `msg` and the
            /// claim's `attempt` (`$1`-`$3` = job, stage, epoch, `$5` = attempt) with one
            /// more value (`$4`) and optionally another (`$6`); true if it applied.
            async fn update_stage_entry(
                &self,
                sql: &'static str,
                msg: &$crate::domain::WorkMessage,
                attempt: i64,
                value: i64,
                extra: Option<i64>,
            ) -> $crate::store::StoreResult<bool> {
                let msg = msg.clone();
                self.write(move |conn: &mut $conn| {
                    Box::pin(async move {
                        let mut q = sqlx::query(sql)
                            .bind(&msg.job_id)
                            .bind(msg.stage.as_str())
                            .bind(msg.epoch)
                            .bind(value)
                            .bind(attempt);
                        if let Some(extra) = extra {
                            q = q.bind(extra);
                        }
                        let r = q.execute(&mut *conn).await?;
                        Ok(r.rows_affected() == 1)
                    })
                })
                .await
            }
        }

        #[async_trait::async_trait]
        impl $crate::store::Store for $store {
            async fn migrate(&self) -> $crate::store::StoreResult<()> {
                self.run_migrations().await
            }

            async fn ping(&self) -> $crate::store::StoreResult<()> {
                sqlx::query("SELECT 1").execute(&self.pool).await?;
                Ok(())
            }

            async fn submit(
                &self,
                batch_id: &str,
                jobs: &[$crate::store::NewJob],
                now: i64,
            ) -> $crate::store::StoreResult<Vec<$crate::store::Submitted>> {
                let batch_id = batch_id.to_string();
                let jobs = jobs.to_vec();
                self.write_atomic(move |conn: &mut $conn| {
                    Box::pin(async move {
                        use $crate::store::shared as q;
                        sqlx::query(q::INSERT_BATCH)
                            .bind(&batch_id)
                            .bind(now)
                            .execute(&mut *conn)
                            .await?;
                        // Rows are taken in one order whatever the request's (jobs by
                        // client id, then groups by id, then the batch), so submits
                        // that overlap never wait on each other in a cycle (a deadlock
                        // on Postgres); answers keep the request's order.
                        let mut order: Vec<usize> = (0..jobs.len()).collect();
                        order.sort_by(|&a, &b| jobs[a].client_id.cmp(&jobs[b].client_id));
                        let mut out: Vec<Option<$crate::store::Submitted>> =
                            vec![None; jobs.len()];
                        let mut inserted_count = 0i64;
                        let mut groups = std::collections::BTreeMap::<&str, i64>::new();
                        for i in order {
                            let job = &jobs[i];
                            let task = job.task.to_string();
                            let inserted: Option<(String,)> = sqlx::query_as(q::INSERT_JOB)
                                .bind(&job.id)
                                .bind(&batch_id)
                                .bind(&job.group_id)
                                .bind(&job.client_id)
                                .bind(&job.kind)
                                .bind(&task)
                                .bind(now)
                                .fetch_optional(&mut *conn)
                                .await?;
                            out[i] = Some(if inserted.is_some() {
                                inserted_count += 1;
                                if let Some(group) = &job.group_id {
                                    *groups.entry(group.as_str()).or_default() += 1;
                                }
                                $crate::store::Submitted {
                                    id: job.id.clone(),
                                    client_id: job.client_id.clone(),
                                    status: $crate::domain::Status::Queued,
                                    stage: $crate::domain::Stage::Init,
                                    epoch: 0,
                                    duplicate: false,
                                }
                            } else {
                                let (id, status, stage, epoch): (String, String, String, i64) =
                                    sqlx::query_as(q::SELECT_BY_CLIENT)
                                        .bind(&job.client_id)
                                        .fetch_one(&mut *conn)
                                        .await?;
                                $crate::store::Submitted {
                                    id,
                                    client_id: job.client_id.clone(),
                                    status: $crate::store::rows::parse_status(&status)?,
                                    stage: $crate::store::rows::parse_stage(&stage)?,
                                    epoch,
                                    duplicate: true,
                                }
                            });
                        }
                        for (group, n) in groups {
                            sqlx::query(q::INSERT_GROUP)
                                .bind(&batch_id)
                                .bind(group)
                                .bind(now)
                                .bind(n)
                                .execute(&mut *conn)
                                .await?;
                        }
                        if inserted_count > 0 {
                            sqlx::query(q::COUNT_BATCH)
                                .bind(&batch_id)
                                .bind(inserted_count)
                                .execute(&mut *conn)
                                .await?;
                        }
                        let out: Vec<$crate::store::Submitted> = out.into_iter().flatten().collect();
                        Ok(out)
                    })
                })
                .await
            }

            async fn job(
                &self,
                id: &str,
            ) -> $crate::store::StoreResult<Option<$crate::domain::Job>> {
                let row: Option<$crate::store::rows::JobRow> =
                    sqlx::query_as($crate::store::shared::SELECT_JOB)
                        .bind(id)
                        .fetch_optional(&self.pool)
                        .await?;
                row.map(|r| r.into_job()).transpose()
            }

            async fn list_jobs(
                &self,
                query: &$crate::store::JobQuery,
            ) -> $crate::store::StoreResult<Vec<$crate::domain::Job>> {
                let rows: Vec<$crate::store::rows::JobRow> =
                    sqlx::query_as($crate::store::shared::LIST_JOBS)
                        .bind(&query.batch)
                        .bind(query.status.map(|s| s.as_str()))
                        .bind(query.cursor.as_deref().unwrap_or(""))
                        .bind(query.limit)
                        .fetch_all(&self.pool)
                        .await?;
                rows.into_iter().map(|r| r.into_job()).collect()
            }

            async fn claim(
                &self,
                msg: &$crate::domain::WorkMessage,
                node: &str,
                lease_until: i64,
                now: i64,
            ) -> $crate::store::StoreResult<$crate::store::Claim> {
                let msg = msg.clone();
                let node = node.to_string();
                self.write(move |conn: &mut $conn| {
                    Box::pin(async move {
                        use $crate::store::Claim;
                        use $crate::store::shared as q;
                        let row: Option<$crate::store::rows::JobRow> = sqlx::query_as(q::CLAIM)
                            .bind(&msg.job_id)
                            .bind(msg.stage.as_str())
                            .bind(msg.epoch)
                            .bind(&node)
                            .bind(lease_until)
                            .bind(now)
                            .fetch_optional(&mut *conn)
                            .await?;
                        if let Some(row) = row {
                            return Ok(Claim::Started(Box::new(row.into_job()?)));
                        }
                        let row: Option<$crate::store::rows::JobRow> =
                            sqlx::query_as(q::SELECT_JOB)
                                .bind(&msg.job_id)
                                .fetch_optional(&mut *conn)
                                .await?;
                        let Some(row) = row else {
                            return Ok(Claim::Missing);
                        };
                        let job = row.into_job()?;
                        let lease = job.lease_until;
                        if job.status == $crate::domain::Status::Running
                            && job.stage == msg.stage
                            && job.epoch == msg.epoch
                        {
                            // Someone holds a live lease; this claim lost the race.
                            return Ok(Claim::Busy(lease.unwrap_or(now).max(now)));
                        }
                        Ok(Claim::Stale(Box::new(job)))
                    })
                })
                .await
            }

            async fn extend_lease(
                &self,
                msg: &$crate::domain::WorkMessage,
                attempt: i64,
                lease_until: i64,
            ) -> $crate::store::StoreResult<bool> {
                self.update_stage_entry(
                    $crate::store::shared::EXTEND_LEASE,
                    msg,
                    attempt,
                    lease_until,
                    None,
                )
                .await
            }

            async fn advance(
                &self,
                msg: &$crate::domain::WorkMessage,
                attempt: i64,
                output: &serde_json::Value,
                route: Option<&str>,
                now: i64,
            ) -> $crate::store::StoreResult<Option<$crate::domain::WorkMessage>> {
                let Some(next) = msg.stage.next() else {
                    return Ok(None);
                };
                let msg = msg.clone();
                let output = $crate::nul::scrub_json(output.to_string());
                let route = route.map(str::to_string);
                self.write(move |conn: &mut $conn| {
                    Box::pin(async move {
                        let row: Option<(i64,)> = sqlx::query_as($crate::store::shared::ADVANCE)
                            .bind(&msg.job_id)
                            .bind(msg.stage.as_str())
                            .bind(msg.epoch)
                            .bind(next.as_str())
                            .bind(now)
                            .bind(&route)
                            .bind(&output)
                            .bind(attempt)
                            .fetch_optional(&mut *conn)
                            .await?;
                        Ok(row.map(|(epoch,)| $crate::domain::WorkMessage {
                            job_id: msg.job_id.clone(),
                            stage: next,
                            epoch,
                        }))
                    })
                })
                .await
            }

            async fn release(
                &self,
                msg: &$crate::domain::WorkMessage,
                attempt: i64,
                hand_back: bool,
                now: i64,
            ) -> $crate::store::StoreResult<bool> {
                self.update_stage_entry(
                    $crate::store::shared::RELEASE,
                    msg,
                    attempt,
                    now,
                    Some(i64::from(hand_back)),
                )
                .await
            }

            async fn finish(
                &self,
                cond: &$crate::store::FinishIf,
                job_id: &str,
                outcome: &$crate::domain::Outcome,
                now: i64,
            ) -> $crate::store::StoreResult<Option<$crate::domain::JobResult>> {
                use $crate::store::FinishIf;
                let (stage, epoch, attempt, unleased_at) = match cond {
                    FinishIf::Claimed { msg, attempt } => (
                        Some(msg.stage.as_str()),
                        Some(msg.epoch),
                        Some(*attempt),
                        None,
                    ),
                    FinishIf::Unleased(msg) => {
                        (Some(msg.stage.as_str()), Some(msg.epoch), None, Some(now))
                    }
                    FinishIf::Live => (None, None, None, None),
                };
                let job_id = job_id.to_string();
                let (outcome_status, original_error) = (outcome.status, outcome.error.clone());
                let mut outcome = outcome.clone();
                if let Some(e) = &mut outcome.error {
                    *e = $crate::nul::scrub(e).into_owned();
                }
                let reward = if outcome.status == $crate::domain::Status::Done {
                    outcome.reward
                } else {
                    None
                };
                let eval_output = outcome
                    .eval_output
                    .as_ref()
                    .map(|v| $crate::nul::scrub_json(v.to_string()));
                let run_output = outcome
                    .run_output
                    .as_ref()
                    .map(|v| $crate::nul::scrub_json(v.to_string()));
                let stage = stage.map(str::to_string);
                let (bare_id, bare_stage) = (job_id.clone(), stage.clone());
                let first = self
                    .write(move |conn: &mut $conn| {
                        Box::pin(async move {
                            Self::order_results(&mut *conn).await?;
                            let row: Option<$crate::store::rows::ResultRow> =
                                sqlx::query_as(Self::FINISH)
                                    .bind(&job_id)
                                    .bind(&stage)
                                    .bind(epoch)
                                    .bind(outcome.status.as_str())
                                    .bind(&outcome.error)
                                    .bind(now)
                                    .bind(reward)
                                    .bind(&eval_output)
                                    .bind(attempt)
                                    .bind(unleased_at)
                                    .bind(&run_output)
                                    .fetch_optional(&mut *conn)
                                    .await?;
                            row.map(|r| r.into_result()).transpose()
                        })
                    })
                    .await;
                let rejected = match first {
                    Err(e) if e.is_rejected() => e,
                    other => return other,
                };
                // The database refuses this end (what the job's row or output holds), and
                // would on every retry: end the job anyway, failed, with the reason and
                // without the output, rather than leave it to be retried for ever.
                tracing::error!(job_id = %bare_id, error = %rejected, "cannot record the job's end with its output; recording the failure alone");
                let error = format!(
                    "{}the job's end ({outcome_status}) could not be recorded with its output, which was dropped: {rejected}",
                    original_error.map(|e| format!("{e}; ")).unwrap_or_default()
                );
                self.write(move |conn: &mut $conn| {
                    Box::pin(async move {
                        Self::order_results(&mut *conn).await?;
                        let row: Option<$crate::store::rows::ResultRow> =
                            sqlx::query_as(Self::FINISH_BARE)
                                .bind(&bare_id)
                                .bind(&bare_stage)
                                .bind(epoch)
                                .bind(&error)
                                .bind(now)
                                .bind(attempt)
                                .bind(unleased_at)
                                .fetch_optional(&mut *conn)
                                .await?;
                        row.map(|r| r.into_result()).transpose()
                    })
                })
                .await
            }

            async fn results_after(
                &self,
                batch: Option<&str>,
                after: i64,
                limit: i64,
                max_bytes: i64,
            ) -> $crate::store::StoreResult<Vec<$crate::domain::JobResult>> {
                use $crate::store::shared as q;
                let rows: Vec<$crate::store::rows::ResultRow> = match batch {
                    Some(b) => {
                        sqlx::query_as(q::RESULTS_AFTER_IN_BATCH)
                            .bind(after)
                            .bind(limit)
                            .bind(max_bytes)
                            .bind(b)
                            .fetch_all(&self.pool)
                            .await?
                    }
                    None => {
                        sqlx::query_as(q::RESULTS_AFTER)
                            .bind(after)
                            .bind(limit)
                            .bind(max_bytes)
                            .fetch_all(&self.pool)
                            .await?
                    }
                };
                rows.into_iter().map(|r| r.into_result()).collect()
            }

            async fn result(
                &self,
                job_id: &str,
            ) -> $crate::store::StoreResult<Option<$crate::domain::JobResult>> {
                let row: Option<$crate::store::rows::ResultRow> =
                    sqlx::query_as($crate::store::shared::RESULT_OF_JOB)
                        .bind(job_id)
                        .fetch_optional(&self.pool)
                        .await?;
                row.map(|r| r.into_result()).transpose()
            }

            async fn mark_published(
                &self,
                seqs: &[i64],
                now: i64,
            ) -> $crate::store::StoreResult<()> {
                if seqs.is_empty() {
                    return Ok(());
                }
                self.mark_published_seqs(seqs, now).await
            }

            async fn unpublished_results(
                &self,
                before: i64,
                limit: i64,
            ) -> $crate::store::StoreResult<Vec<$crate::domain::JobResult>> {
                let rows: Vec<$crate::store::rows::ResultRow> =
                    sqlx::query_as($crate::store::shared::UNPUBLISHED)
                        .bind(before)
                        .bind(limit)
                        .fetch_all(&self.pool)
                        .await?;
                rows.into_iter().map(|r| r.into_result()).collect()
            }

            async fn stale_jobs(
                &self,
                before: i64,
                limit: i64,
            ) -> $crate::store::StoreResult<Vec<$crate::store::StaleJob>> {
                let rows: Vec<$crate::store::rows::StaleRow> =
                    sqlx::query_as($crate::store::shared::SELECT_STALE)
                        .bind(before)
                        .bind(limit)
                        .fetch_all(&self.pool)
                        .await?;
                rows.into_iter().map(|r| r.into_stale()).collect()
            }

            async fn overdue_handoffs(
                &self,
                before: i64,
                since: i64,
                limit: i64,
            ) -> $crate::store::StoreResult<Vec<$crate::store::StaleJob>> {
                let rows: Vec<$crate::store::rows::StaleRow> =
                    sqlx::query_as($crate::store::shared::SELECT_OVERDUE)
                        .bind(before)
                        .bind(since)
                        .bind(limit)
                        .fetch_all(&self.pool)
                        .await?;
                rows.into_iter().map(|r| r.into_stale()).collect()
            }

            async fn touch(
                &self,
                msg: &$crate::domain::WorkMessage,
                now: i64,
            ) -> $crate::store::StoreResult<bool> {
                let msg = msg.clone();
                self.write(move |conn: &mut $conn| {
                    Box::pin(async move {
                        let r = sqlx::query($crate::store::shared::TOUCH)
                            .bind(&msg.job_id)
                            .bind(msg.epoch)
                            .bind(now)
                            .execute(&mut *conn)
                            .await?;
                        Ok(r.rows_affected() == 1)
                    })
                })
                .await
            }

            async fn requeue(
                &self,
                msg: &$crate::domain::WorkMessage,
                now: i64,
            ) -> $crate::store::StoreResult<Option<$crate::domain::WorkMessage>> {
                let msg = msg.clone();
                self.write(move |conn: &mut $conn| {
                    Box::pin(async move {
                        let row: Option<(i64,)> = sqlx::query_as($crate::store::shared::REQUEUE)
                            .bind(&msg.job_id)
                            .bind(msg.epoch)
                            .bind(now)
                            .fetch_optional(&mut *conn)
                            .await?;
                        Ok(row.map(|(epoch,)| $crate::domain::WorkMessage {
                            job_id: msg.job_id.clone(),
                            stage: msg.stage,
                            epoch,
                        }))
                    })
                })
                .await
            }

            async fn counts(
                &self,
                batch: Option<&str>,
            ) -> $crate::store::StoreResult<Vec<$crate::store::StatusCount>> {
                use $crate::store::shared as q;
                let rows: Vec<$crate::store::rows::CountRow> = match batch {
                    Some(b) => {
                        sqlx::query_as(q::COUNTS_IN_BATCH)
                            .bind(b)
                            .fetch_all(&self.pool)
                            .await?
                    }
                    None => sqlx::query_as(q::COUNTS).fetch_all(&self.pool).await?,
                };
                rows.into_iter()
                    .map(|r| {
                        Ok($crate::store::StatusCount {
                            status: $crate::store::rows::parse_status(&r.status)?,
                            stage: $crate::store::rows::parse_stage(&r.stage)?,
                            count: r.n,
                        })
                    })
                    .collect()
            }

            async fn batch(
                &self,
                id: &str,
            ) -> $crate::store::StoreResult<Option<$crate::domain::BatchCounters>> {
                let row: Option<$crate::store::rows::BatchRow> =
                    sqlx::query_as($crate::store::shared::SELECT_BATCH)
                        .bind(id)
                        .fetch_optional(&self.pool)
                        .await?;
                Ok(row.map(Into::into))
            }

            async fn group(
                &self,
                batch_id: &str,
                id: &str,
            ) -> $crate::store::StoreResult<Option<$crate::domain::GroupCounters>> {
                let row: Option<$crate::store::rows::GroupRow> =
                    sqlx::query_as($crate::store::shared::SELECT_GROUP)
                        .bind(batch_id)
                        .bind(id)
                        .fetch_optional(&self.pool)
                        .await?;
                Ok(row.map(Into::into))
            }

            async fn restart(
                &self,
                msg: &$crate::domain::WorkMessage,
                attempt: i64,
                max_restarts: i64,
                counted: bool,
                now: i64,
            ) -> $crate::store::StoreResult<Option<$crate::domain::WorkMessage>> {
                let msg = msg.clone();
                self.write(move |conn: &mut $conn| {
                    Box::pin(async move {
                        let row: Option<(i64,)> = sqlx::query_as($crate::store::shared::RESTART)
                            .bind(&msg.job_id)
                            .bind(msg.stage.as_str())
                            .bind(msg.epoch)
                            .bind(now)
                            .bind(attempt)
                            .bind(max_restarts)
                            .bind(i64::from(counted))
                            .fetch_optional(&mut *conn)
                            .await?;
                        Ok(row.map(|(epoch,)| $crate::domain::WorkMessage {
                            job_id: msg.job_id.clone(),
                            stage: $crate::domain::Stage::Init,
                            epoch,
                        }))
                    })
                })
                .await
            }

            async fn abandoned_runs(
                &self,
                before: i64,
                limit: i64,
            ) -> $crate::store::StoreResult<Vec<$crate::store::AbandonedRun>> {
                let rows: Vec<(String, i64, i64, String)> =
                    sqlx::query_as($crate::store::shared::ABANDONED_RUNS)
                        .bind(before)
                        .bind(limit)
                        .fetch_all(&self.pool)
                        .await?;
                Ok(rows
                    .into_iter()
                    .map(
                        |(job_id, epoch, restarts, node)| $crate::store::AbandonedRun {
                            msg: $crate::domain::WorkMessage {
                                job_id,
                                stage: $crate::domain::Stage::Run,
                                epoch,
                            },
                            restarts,
                            node,
                        },
                    )
                    .collect())
            }

            async fn restart_queued(
                &self,
                msg: &$crate::domain::WorkMessage,
                max_restarts: i64,
                now: i64,
            ) -> $crate::store::StoreResult<Option<$crate::domain::WorkMessage>> {
                let msg = msg.clone();
                self.write(move |conn: &mut $conn| {
                    Box::pin(async move {
                        let row: Option<(i64,)> =
                            sqlx::query_as($crate::store::shared::RESTART_QUEUED)
                                .bind(&msg.job_id)
                                .bind(msg.epoch)
                                .bind(now)
                                .bind(max_restarts)
                                .fetch_optional(&mut *conn)
                                .await?;
                        Ok(row.map(|(epoch,)| $crate::domain::WorkMessage {
                            job_id: msg.job_id.clone(),
                            stage: $crate::domain::Stage::Init,
                            epoch,
                        }))
                    })
                })
                .await
            }

            async fn put_sandbox(
                &self,
                sandbox: &$crate::store::SandboxRecord,
            ) -> $crate::store::StoreResult<()> {
                let s = sandbox.clone();
                self.write(move |conn: &mut $conn| {
                    Box::pin(async move {
                        sqlx::query($crate::store::shared::PUT_SANDBOX)
                            .bind(&s.job_id)
                            .bind(&s.node)
                            .bind(&s.backend)
                            .bind(&s.dir)
                            .bind(&s.socket)
                            .bind(s.lease_until)
                            .bind(s.created_at)
                            .execute(&mut *conn)
                            .await?;
                        Ok(())
                    })
                })
                .await
            }

            async fn sandbox(
                &self,
                job_id: &str,
            ) -> $crate::store::StoreResult<Option<$crate::store::SandboxRecord>> {
                Ok(sqlx::query_as($crate::store::shared::SELECT_SANDBOX)
                    .bind(job_id)
                    .fetch_optional(&self.pool)
                    .await?)
            }

            async fn delete_sandbox(&self, job_id: &str) -> $crate::store::StoreResult<()> {
                let job_id = job_id.to_string();
                self.write(move |conn: &mut $conn| {
                    Box::pin(async move {
                        sqlx::query($crate::store::shared::DELETE_SANDBOX)
                            .bind(&job_id)
                            .execute(&mut *conn)
                            .await?;
                        Ok(())
                    })
                })
                .await
            }

            async fn sandboxes_to_reap(
                &self,
                node: &str,
            ) -> $crate::store::StoreResult<Vec<$crate::store::SandboxRecord>> {
                Ok(sqlx::query_as($crate::store::shared::SANDBOXES_TO_REAP)
                    .bind(node)
                    .fetch_all(&self.pool)
                    .await?)
            }

            async fn sandboxes_of_node(
                &self,
                node: &str,
            ) -> $crate::store::StoreResult<Vec<$crate::store::SandboxRecord>> {
                Ok(sqlx::query_as($crate::store::shared::SANDBOXES_OF_NODE)
                    .bind(node)
                    .fetch_all(&self.pool)
                    .await?)
            }

            async fn renew_sandboxes(
                &self,
                node: &str,
                lease_until: i64,
                _now: i64,
            ) -> $crate::store::StoreResult<u64> {
                let node = node.to_string();
                self.write(move |conn: &mut $conn| {
                    Box::pin(async move {
                        let r = sqlx::query($crate::store::shared::RENEW_SANDBOXES)
                            .bind(&node)
                            .bind(lease_until)
                            .execute(&mut *conn)
                            .await?;
                        Ok(r.rows_affected())
                    })
                })
                .await
            }

            async fn upsert_backend(
                &self,
                spec: &$crate::domain::backend::BackendSpec,
                source: &str,
                now: i64,
            ) -> $crate::store::StoreResult<()> {
                let b = spec.clone();
                let source = source.to_string();
                self.write(move |conn: &mut $conn| {
                    Box::pin(async move {
                        sqlx::query($crate::store::shared::UPSERT_BACKEND)
                            .bind(&b.id)
                            .bind(&b.url)
                            .bind(b.kind.as_str())
                            .bind(&b.model)
                            .bind(&b.tokenizer)
                            .bind(b.weight)
                            .bind(&source)
                            .bind(now)
                            .bind(&b.served_model_name)
                            .bind(b.api_key.as_ref().map(|k| k.0.clone()))
                            .bind(b.logprobs_mode.map(|m| m.as_str()))
                            .execute(&mut *conn)
                            .await?;
                        Ok(())
                    })
                })
                .await
            }

            async fn delete_backend(&self, id: &str) -> $crate::store::StoreResult<bool> {
                let id = id.to_string();
                self.write(move |conn: &mut $conn| {
                    Box::pin(async move {
                        let r = sqlx::query($crate::store::shared::DELETE_BACKEND)
                            .bind(&id)
                            .execute(&mut *conn)
                            .await?;
                        Ok(r.rows_affected() == 1)
                    })
                })
                .await
            }

            async fn backends(
                &self,
            ) -> $crate::store::StoreResult<Vec<$crate::domain::backend::BackendState>> {
                let rows: Vec<$crate::store::rows::BackendRow> =
                    sqlx::query_as($crate::store::shared::SELECT_BACKENDS)
                        .bind("")
                        .bind(None::<String>)
                        .fetch_all(&self.pool)
                        .await?;
                rows.into_iter().map(|r| r.into_state()).collect()
            }

            async fn backend(
                &self,
                id: &str,
            ) -> $crate::store::StoreResult<Option<$crate::domain::backend::BackendState>> {
                let row: Option<$crate::store::rows::BackendRow> =
                    sqlx::query_as($crate::store::shared::SELECT_BACKEND)
                        .bind(id)
                        .fetch_optional(&self.pool)
                        .await?;
                row.map(|r| r.into_state()).transpose()
            }

            async fn set_backend_health(
                &self,
                id: &str,
                healthy: bool,
                error: Option<&str>,
                now: i64,
            ) -> $crate::store::StoreResult<Option<bool>> {
                let id = id.to_string();
                let error = error.map(str::to_string);
                self.write_atomic(move |conn: &mut $conn| {
                    Box::pin(async move {
                        let before: Option<(i64,)> =
                            sqlx::query_as($crate::store::shared::BACKEND_HEALTH)
                                .bind(&id)
                                .fetch_optional(&mut *conn)
                                .await?;
                        if before.is_some() {
                            sqlx::query($crate::store::shared::SET_BACKEND_HEALTH)
                                .bind(&id)
                                .bind(i64::from(healthy))
                                .bind(&error)
                                .bind(now)
                                .execute(&mut *conn)
                                .await?;
                        }
                        Ok(before.map(|(h,)| h != 0))
                    })
                })
                .await
            }

            async fn assign_backend(
                &self,
                req: &$crate::domain::placement::AssignRequest,
                now: i64,
            ) -> $crate::store::StoreResult<Option<$crate::domain::placement::Assignment>> {
                let req = req.clone();
                self.write_atomic(move |conn: &mut $conn| {
                    Box::pin(async move {
                        use $crate::domain::placement::{self as pool, Assignment, Candidate, Reason};
                        Self::lock_pool(&mut *conn).await?;
                        let previous: Option<(String, String)> =
                            sqlx::query_as($crate::store::shared::SELECT_ASSIGNMENT)
                                .bind(&req.job_id)
                                .fetch_optional(&mut *conn)
                                .await?;
                        let rows: Vec<$crate::store::rows::BackendRow> =
                            sqlx::query_as($crate::store::shared::SELECT_BACKENDS)
                                .bind(&req.job_id)
                                .bind(&req.group_key)
                                .fetch_all(&mut *conn)
                                .await?;
                        let model = req
                            .model
                            .clone()
                            .or_else(|| previous.as_ref().map(|p| p.1.clone()));
                        let mut usable = Vec::new();
                        for r in rows {
                            let (active, group, home) = (r.active, r.group_members, r.group_home);
                            let b = r.into_state()?;
                            if b.healthy
                                && !req.exclude.contains(&b.spec.id)
                                && model.as_ref().is_none_or(|m| *m == b.spec.model)
                            {
                                usable.push((b.spec, active, group, home > 0));
                            }
                        }
                        let prev_id = previous.map(|p| p.0);
                        if let Some(p) = &prev_id
                            && let Some((spec, ..)) = usable.iter().find(|u| &u.0.id == p)
                        {
                            return Ok(Some(Assignment {
                                backend: spec.clone(),
                                reason: Reason::Sticky,
                                previous: None,
                            }));
                        }
                        let candidates: Vec<Candidate> = usable
                            .iter()
                            .map(|(spec, active, group, home)| Candidate {
                                id: spec.id.clone(),
                                weight: spec.weight,
                                active: *active,
                                group_members: *group,
                                group_home: *home,
                            })
                            .collect();
                        let Some((i, reason)) = pool::choose(&candidates, &req.policy) else {
                            sqlx::query($crate::store::shared::DELETE_ASSIGNMENT)
                                .bind(&req.job_id)
                                .execute(&mut *conn)
                                .await?;
                            return Ok(None);
                        };
                        let spec = usable.swap_remove(i).0;
                        sqlx::query($crate::store::shared::PUT_ASSIGNMENT)
                            .bind(&req.job_id)
                            .bind(&spec.id)
                            .bind(&req.group_key)
                            .bind(&spec.model)
                            .bind(now)
                            .execute(&mut *conn)
                            .await?;
                        if let Some(g) = &req.group_key {
                            sqlx::query($crate::store::shared::PUT_GROUP_HOME)
                                .bind(g)
                                .bind(&spec.id)
                                .bind(now)
                                .execute(&mut *conn)
                                .await?;
                        }
                        Ok(Some(Assignment {
                            backend: spec,
                            reason,
                            previous: prev_id,
                        }))
                    })
                })
                .await
            }

            async fn forget_group_homes(&self, before: i64) -> $crate::store::StoreResult<u64> {
                self.write(move |conn: &mut $conn| {
                    Box::pin(async move {
                        let r = sqlx::query($crate::store::shared::PRUNE_GROUP_HOMES)
                            .bind(before)
                            .execute(&mut *conn)
                            .await?;
                        Ok(r.rows_affected())
                    })
                })
                .await
            }

            async fn release_backend(&self, job_id: &str) -> $crate::store::StoreResult<()> {
                let job_id = job_id.to_string();
                self.write(move |conn: &mut $conn| {
                    Box::pin(async move {
                        sqlx::query($crate::store::shared::DELETE_ASSIGNMENT)
                            .bind(&job_id)
                            .execute(&mut *conn)
                            .await?;
                        Ok(())
                    })
                })
                .await
            }

            async fn events(
                &self,
                job_id: &str,
            ) -> $crate::store::StoreResult<Vec<$crate::store::JobEvent>> {
                let rows: Vec<$crate::store::rows::EventRow> =
                    sqlx::query_as($crate::store::shared::SELECT_EVENTS)
                        .bind(job_id)
                        .fetch_all(&self.pool)
                        .await?;
                Ok(rows.into_iter().map(Into::into).collect())
            }

            async fn record_event(
                &self,
                job_id: &str,
                event: &str,
                stage: Option<$crate::domain::Stage>,
                node: Option<&str>,
                detail: Option<&str>,
                now: i64,
            ) -> $crate::store::StoreResult<()> {
                let job_id = job_id.to_string();
                let event = event.to_string();
                let node = node.map(str::to_string);
                let detail = detail.map(|d| $crate::nul::scrub(d).into_owned());
                self.write(move |conn: &mut $conn| {
                    Box::pin(async move {
                        sqlx::query($crate::store::shared::INSERT_EVENT)
                            .bind(&job_id)
                            .bind(now)
                            .bind(&event)
                            .bind(stage.map(|s| s.as_str()))
                            .bind(&node)
                            .bind(&detail)
                            .execute(&mut *conn)
                            .await?;
                        Ok(())
                    })
                })
                .await
            }
        }
    };
}

pub(crate) use impl_store;
