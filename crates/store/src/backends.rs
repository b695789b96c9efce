//! Inference backends: the registry, their health, and which job uses which.
//!
//! An assignment is decided inside one transaction: the store reads every backend's
//! load under [`Dialect::lock_pool`], lets [`placement::choose`] (a pure function of
//! the domain) pick, and records the choice, so RUN workers on many nodes never both
//! see the same counts.

use async_trait::async_trait;

use super::dialect::Dialect;
use super::query::query;
use super::rows::BackendRow;
use super::sql_store::SqlStore;
use super::{StoreResult, sql};
use rollout_core::domain::EpochMs;
use rollout_core::domain::backend::{BackendSpec, BackendState};
use rollout_core::domain::placement::{self, AssignRequest, Assignment, Candidate, Reason};

/// The backend registry and assignments.
#[async_trait]
pub trait BackendStore: Send + Sync {
    /// Registers `spec` (from `source`: `config` or `api`), or replaces the backend of
    /// that id; a backend whose URL is unchanged keeps its health.
    async fn upsert_backend(
        &self,
        spec: &BackendSpec,
        source: &str,
        now: EpochMs,
    ) -> StoreResult<()>;
    /// Unregisters a backend; false when unknown. Jobs assigned to it keep their rows
    /// until they end or move: their next failed request moves them elsewhere.
    async fn delete_backend(&self, id: &str) -> StoreResult<bool>;
    /// Every backend with its active count, by id.
    async fn backends(&self) -> StoreResult<Vec<BackendState>>;
    /// One backend.
    async fn backend(&self, id: &str) -> StoreResult<Option<BackendState>>;
    /// Records a health verdict; returns the previous one (`None`: unknown backend), so
    /// callers can log changes.
    async fn set_backend_health(
        &self,
        id: &str,
        healthy: bool,
        error: Option<&str>,
        now: EpochMs,
    ) -> StoreResult<Option<bool>>;
    /// Gives the job a backend in one transaction: the one it has when that is healthy,
    /// not excluded and of the wanted model (sticky), else one chosen by
    /// [`placement::choose`] from the healthy ones, recorded as its assignment. `None`
    /// (and no assignment) when no backend qualifies, or when the job is no longer in
    /// RUN or has ended (a cancel that came first). Assignments are deleted by the
    /// database when the job leaves RUN or ends.
    async fn assign_backend(
        &self,
        req: &AssignRequest,
        now: EpochMs,
    ) -> StoreResult<Option<Assignment>>;
    /// Forgets where prompt groups last ran for groups not placed since `before`; returns
    /// how many were forgotten.
    async fn forget_group_homes(&self, before: EpochMs) -> StoreResult<u64>;
    /// Deletes a job's assignment (jobs that are not rows of this database, such as a
    /// benchmark's, release their own).
    async fn release_backend(&self, job_id: &str) -> StoreResult<()>;
    /// Deletes the assignments of jobs that have left RUN or ended, which an older
    /// version could leave behind (it assigned without checking the job was still in
    /// RUN), so that `active` counts and least-loaded routing are right again; returns
    /// how many went. Run by the reconciler.
    async fn release_leaked_assignments(&self) -> StoreResult<u64>;
    /// Records whether backend `id` is owed a resume: the service paused it for a
    /// weight update and could not resume it (it was down, or did not answer). The
    /// reconciler asks it again until it answers ([`Self::owed_resumes`]). Unknown ids
    /// are ignored.
    async fn owe_resume(&self, id: &str, owed: bool) -> StoreResult<()>;
    /// The ids of the backends owed a resume.
    async fn owed_resumes(&self) -> StoreResult<Vec<String>>;
}

/// A backend that may serve an assignment, with its load.
struct Usable {
    spec: BackendSpec,
    active: i64,
    group_members: i64,
    group_home: bool,
}

#[async_trait]
impl<D: Dialect> BackendStore for SqlStore<D> {
    async fn upsert_backend(
        &self,
        spec: &BackendSpec,
        source: &str,
        now: EpochMs,
    ) -> StoreResult<()> {
        let b = spec.clone();
        let source = source.to_string();
        self.write(move |conn: &mut D::Conn| {
            Box::pin(async move {
                query(sql::UPSERT_BACKEND)
                    .bind(&b.id)
                    .bind(&b.url)
                    .bind(b.kind.as_str())
                    .bind(&b.model)
                    .bind(&b.tokenizer)
                    .bind(b.weight)
                    .bind(&source)
                    .bind(now)
                    .bind(&b.served_model_name)
                    .bind(b.api_key.as_ref().map(|k| k.0.as_str()))
                    .bind(b.logprobs_mode.map(|m| m.as_str()))
                    .execute(conn)
                    .await?;
                Ok(())
            })
        })
        .await
    }

    async fn delete_backend(&self, id: &str) -> StoreResult<bool> {
        let id = id.to_string();
        self.write(move |conn: &mut D::Conn| {
            Box::pin(
                async move { Ok(query(sql::DELETE_BACKEND).bind(&id).execute(conn).await? == 1) },
            )
        })
        .await
    }

    async fn backends(&self) -> StoreResult<Vec<BackendState>> {
        let mut conn = self.reader().await?;
        let rows: Vec<BackendRow> = query(sql::SELECT_BACKENDS)
            .bind("")
            .bind(None::<&str>)
            .fetch_all(&mut *conn)
            .await?;
        rows.into_iter().map(BackendRow::into_state).collect()
    }

    async fn backend(&self, id: &str) -> StoreResult<Option<BackendState>> {
        let mut conn = self.reader().await?;
        let row: Option<BackendRow> = query(sql::SELECT_BACKEND)
            .bind(id)
            .fetch_optional(&mut *conn)
            .await?;
        row.map(BackendRow::into_state).transpose()
    }

    async fn set_backend_health(
        &self,
        id: &str,
        healthy: bool,
        error: Option<&str>,
        now: EpochMs,
    ) -> StoreResult<Option<bool>> {
        let id = id.to_string();
        let error = error.map(str::to_string);
        self.write_atomic(move |conn: &mut D::Conn| {
            Box::pin(async move {
                let before: Option<(i64,)> = query(sql::BACKEND_HEALTH)
                    .bind(&id)
                    .fetch_optional(conn)
                    .await?;
                if before.is_some() {
                    query(sql::SET_BACKEND_HEALTH)
                        .bind(&id)
                        .bind(i64::from(healthy))
                        .bind(&error)
                        .bind(now)
                        .execute(conn)
                        .await?;
                }
                Ok(before.map(|(h,)| h != 0))
            })
        })
        .await
    }

    async fn assign_backend(
        &self,
        req: &AssignRequest,
        now: EpochMs,
    ) -> StoreResult<Option<Assignment>> {
        let req = req.clone();
        self.write_atomic(move |conn: &mut D::Conn| {
            Box::pin(async move {
                D::lock_pool(conn).await?;
                let previous: Option<(String, String)> = query(sql::SELECT_ASSIGNMENT)
                    .bind(&req.job_id)
                    .fetch_optional(conn)
                    .await?;
                let rows: Vec<BackendRow> = query(sql::SELECT_BACKENDS)
                    .bind(&req.job_id)
                    .bind(&req.group_key)
                    .fetch_all(conn)
                    .await?;
                let model = req
                    .model
                    .clone()
                    .or_else(|| previous.as_ref().map(|p| p.1.clone()));
                let mut usable = Vec::new();
                for r in rows {
                    let (active, group_members, home) = (r.active, r.group_members, r.group_home);
                    let b = r.into_state()?;
                    if b.healthy
                        && !req.exclude.contains(&b.spec.id)
                        && model.as_ref().is_none_or(|m| *m == b.spec.model)
                    {
                        usable.push(Usable {
                            spec: b.spec,
                            active,
                            group_members,
                            group_home: home > 0,
                        });
                    }
                }
                let prev_id = previous.map(|p| p.0);
                if let Some(p) = &prev_id
                    && let Some(u) = usable.iter().find(|u| &u.spec.id == p)
                {
                    return Ok(Some(Assignment {
                        backend: u.spec.clone(),
                        reason: Reason::Sticky,
                        previous: None,
                    }));
                }
                let candidates: Vec<Candidate> = usable
                    .iter()
                    .map(|u| Candidate {
                        id: u.spec.id.clone(),
                        weight: u.spec.weight,
                        active: u.active,
                        group_members: u.group_members,
                        group_home: u.group_home,
                    })
                    .collect();
                let Some((i, reason)) = placement::choose(&candidates, &req.policy) else {
                    query(sql::DELETE_ASSIGNMENT)
                        .bind(&req.job_id)
                        .execute(conn)
                        .await?;
                    return Ok(None);
                };
                let spec = usable.swap_remove(i).spec;
                D::lock_job(conn, &req.job_id).await?;
                let put: Option<(String,)> = query(sql::PUT_ASSIGNMENT)
                    .bind(&req.job_id)
                    .bind(&spec.id)
                    .bind(&req.group_key)
                    .bind(&spec.model)
                    .bind(now)
                    .fetch_optional(conn)
                    .await?;
                if put.is_none() {
                    // The job left RUN or ended (cancelled) meanwhile: nothing to serve.
                    return Ok(None);
                }
                if let Some(g) = &req.group_key {
                    query(sql::PUT_GROUP_HOME)
                        .bind(g)
                        .bind(&spec.id)
                        .bind(now)
                        .execute(conn)
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

    async fn forget_group_homes(&self, before: EpochMs) -> StoreResult<u64> {
        self.write(move |conn: &mut D::Conn| {
            Box::pin(async move {
                Ok(query(sql::PRUNE_GROUP_HOMES)
                    .bind(before)
                    .execute(conn)
                    .await?)
            })
        })
        .await
    }

    async fn release_leaked_assignments(&self) -> StoreResult<u64> {
        self.write(move |conn: &mut D::Conn| {
            Box::pin(async move { Ok(query(sql::DELETE_LEAKED_ASSIGNMENTS).execute(conn).await?) })
        })
        .await
    }

    async fn owe_resume(&self, id: &str, owed: bool) -> StoreResult<()> {
        let id = id.to_string();
        self.write(move |conn: &mut D::Conn| {
            Box::pin(async move {
                query(sql::OWE_RESUME)
                    .bind(&id)
                    .bind(i64::from(owed))
                    .execute(conn)
                    .await?;
                Ok(())
            })
        })
        .await
    }

    async fn owed_resumes(&self) -> StoreResult<Vec<String>> {
        let mut conn = self.reader().await?;
        let ids: Vec<(String,)> = query(sql::OWED_RESUMES).fetch_all(&mut *conn).await?;
        Ok(ids.into_iter().map(|(id,)| id).collect())
    }

    async fn release_backend(&self, job_id: &str) -> StoreResult<()> {
        let job_id = job_id.to_string();
        self.write(move |conn: &mut D::Conn| {
            Box::pin(async move {
                query(sql::DELETE_ASSIGNMENT)
                    .bind(&job_id)
                    .execute(conn)
                    .await?;
                Ok(())
            })
        })
        .await
    }
}
