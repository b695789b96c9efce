//! Job ends: every job's last write, coalesced into one statement per group of ends.
//!
//! A job's end inserts its result (a trigger applies the terminal status and the batch
//! and group counters) and, for the last sample of a sampling group, takes the group's
//! verdict. Ends take turns — result sequence numbers must become visible in the order
//! they are handed out (see [`Dialect::write_result`]) — so whatever one end costs the
//! one writer that runs them, all of them wait for: a round trip per end made that
//! writer the ceiling on a Postgres server's throughput (what remains is each row's
//! own cost; BENCHMARKS.md has the measurements). Ends therefore queue up in a
//! [`Coalescer`](super::coalesce::Coalescer), and whatever has queued runs as one
//! write of the job-ends writer: one `INSERT … SELECT` over a JSON array of the ends
//! (`sql::FINISH_SQLITE`'s conditions, per row), then each written result's sampling
//! bookkeeping, in `seq` order.
//!
//! That order keeps the sampling semantics of one end at a time: a group's counters
//! already include every sample of it in the statement when the first of them is
//! looked at, so that one decides the group, over the same rewards the last would have
//! seen; deciding is once only (`sql::DECIDE_GROUP`), so the rest find it decided.

use std::sync::Arc;

use super::coalesce::WriteKind;
use crate::StoreResult;
use crate::dialect::{Dialect, in_request_order};
use crate::query::{Conn, query};
use crate::rows::ResultRow;
use crate::verdict::{Ended, on_result};
use rollout_core::domain::{EpochMs, Status};

/// One job's end: which stage entry (and claim) it is restricted to (`None` fields do
/// not restrict; see `sql::FINISH_SQLITE`) and what it records.
#[derive(Debug, Clone)]
pub(crate) struct JobEnd {
    pub(crate) job_id: String,
    pub(crate) stage: Option<&'static str>,
    pub(crate) epoch: Option<i64>,
    pub(crate) attempt: Option<i64>,
    pub(crate) unleased_at: Option<EpochMs>,
    pub(crate) status: Status,
    /// Shared, not copied, by each run of the write (it may run twice: see
    /// [`Dialect::write_result`]); likewise the outputs.
    pub(crate) error: Option<Arc<str>>,
    pub(crate) reward: Option<f64>,
    /// EVAL's output, as JSON text.
    pub(crate) eval_output: Option<Arc<str>>,
    /// RUN's partial output (JSON text) in place of the row's, when given.
    pub(crate) run_output: Option<Arc<str>>,
    pub(crate) now: EpochMs,
}

/// One end in the JSON array of `sql::FINISH_MANY_SQLITE` and
/// `sql::FINISH_MANY_POSTGRES`; the keys are the statements' column names.
#[derive(serde::Serialize)]
struct EndArg<'a> {
    e_id: &'a str,
    e_stage: Option<&'a str>,
    e_epoch: Option<i64>,
    e_attempt: Option<i64>,
    e_unleased: Option<i64>,
    e_status: &'a str,
    e_error: Option<&'a str>,
    e_reward: Option<f64>,
    e_eval: Option<&'a str>,
    e_run: Option<&'a str>,
    e_now: i64,
}

impl<'a> EndArg<'a> {
    fn of(end: &'a JobEnd) -> Self {
        Self {
            e_id: &end.job_id,
            e_stage: end.stage,
            e_epoch: end.epoch,
            e_attempt: end.attempt,
            e_unleased: end.unleased_at.map(EpochMs::as_millis),
            e_status: end.status.as_str(),
            e_error: end.error.as_deref(),
            e_reward: end.reward,
            e_eval: end.eval_output.as_deref(),
            e_run: end.run_output.as_deref(),
            e_now: end.now.as_millis(),
        }
    }
}

/// Job ends as one write of the dialect's job-ends writer, however many.
pub(crate) struct Ends<D>(pub(crate) Arc<D>);

impl<D: Dialect> WriteKind for Ends<D> {
    type Req = JobEnd;
    type Resp = Option<Ended>;

    type Key = String;

    /// One: ends take turns at the writer anyway, so a second group in flight would only
    /// wait there as a second statement of the next group. With one, whatever queues
    /// while a group runs becomes the next group, as large as the queue: one statement
    /// per group, and the most rows per statement.
    const IN_FLIGHT: usize = 1;

    fn key(req: &JobEnd) -> String {
        req.job_id.clone()
    }

    async fn run(&self, reqs: &[JobEnd]) -> StoreResult<Vec<Option<Ended>>> {
        let ends: Arc<[JobEnd]> = reqs.into();
        self.0
            .write_result(move |conn: &mut D::Conn| {
                let ends = ends.clone();
                Box::pin(async move { end_many::<D>(conn, &ends).await })
            })
            .await
    }
}

/// Runs `ends` (distinct jobs) on the job-ends writer's open transaction; one answer per
/// end, in order: `None` where the end's condition did not hold.
async fn end_many<D: Dialect>(
    conn: &mut D::Conn,
    ends: &[JobEnd],
) -> StoreResult<Vec<Option<Ended>>> {
    if let [end] = ends {
        return Ok(vec![end_one::<D>(conn, end).await?]);
    }
    // JSON has no NaN or infinity (serde writes them as null): an end whose reward is
    // one of them binds it as a number, alone, so it is stored as the database stores it.
    let (mut together, alone): (Vec<&JobEnd>, Vec<&JobEnd>) = ends
        .iter()
        .partition(|e| e.reward.is_none_or(f64::is_finite));
    // Rows are locked in this order (Postgres): the order claims and hand-offs use.
    together.sort_by(|a, b| a.job_id.cmp(&b.job_id));
    let args: Vec<EndArg> = together.iter().map(|e| EndArg::of(e)).collect();
    let json = serde_json::to_string(&args).expect("job ends serialise");
    let rows: Vec<ResultRow> = query(D::FINISH_MANY)
        .bind(&json)
        .fetch_all(&mut *conn)
        .await?;
    let mut results = rows
        .into_iter()
        .map(ResultRow::into_result)
        .collect::<StoreResult<Vec<_>>>()?;
    results.sort_by_key(|r| r.seq);
    let mut written = Vec::with_capacity(ends.len());
    for result in results {
        // A result is written at its end's `now`.
        let decided = on_result(conn, &result, EpochMs(result.created_at)).await?;
        written.push((result.job_id.clone(), Ended { result, decided }));
    }
    for end in alone {
        if let Some(ended) = end_one::<D>(conn, end).await? {
            written.push((end.job_id.clone(), ended));
        }
    }
    Ok(in_request_order(ends, written, |e| &e.job_id))
}

/// Runs one end as its own statement, [`Dialect::FINISH`].
async fn end_one<D: Dialect>(conn: &mut D::Conn, end: &JobEnd) -> StoreResult<Option<Ended>> {
    let row: Option<ResultRow> = query(D::FINISH)
        .bind(&end.job_id)
        .bind(end.stage)
        .bind(end.epoch)
        .bind(end.status.as_str())
        .bind(end.error.as_deref())
        .bind(end.now)
        .bind(end.reward)
        .bind(end.eval_output.as_deref())
        .bind(end.attempt)
        .bind(end.unleased_at)
        .bind(end.run_output.as_deref())
        .fetch_optional(&mut *conn)
        .await?;
    ended(conn, row, end.now).await
}

/// Ends the job as failed with `end.error`, without its output and reading nothing of
/// the job's own data ([`Dialect::FINISH_BARE`]): the last resort for an end the
/// database refused.
pub(crate) async fn end_bare<D: Dialect>(
    conn: &mut D::Conn,
    end: &JobEnd,
) -> StoreResult<Option<Ended>> {
    let row: Option<ResultRow> = query(D::FINISH_BARE)
        .bind(&end.job_id)
        .bind(end.stage)
        .bind(end.epoch)
        .bind(end.error.as_deref())
        .bind(end.now)
        .bind(end.attempt)
        .bind(end.unleased_at)
        .fetch_optional(&mut *conn)
        .await?;
    ended(conn, row, end.now).await
}

/// The end recorded by `row` (if the statement wrote one), with its sampling group's
/// bookkeeping run in the same transaction.
async fn ended<C: Conn>(
    conn: &mut C,
    row: Option<ResultRow>,
    now: EpochMs,
) -> StoreResult<Option<Ended>> {
    let Some(row) = row else {
        return Ok(None);
    };
    let result = row.into_result()?;
    let decided = on_result(conn, &result, now).await?;
    Ok(Some(Ended { result, decided }))
}

/// What the dialects' unit tests share.
#[cfg(test)]
pub(crate) mod checks {
    use super::*;
    use crate::dialect::StageClaim;
    use crate::sql_store::SqlStore;
    use crate::{JobStore, NewJob, NewSampling, ResultStore, SamplingStore};
    use rollout_core::domain::Stage;
    use rollout_core::domain::sampling::{SamplingParams, Verdict};

    /// An unrestricted end of `job_id` with `status` and nothing else, at 9 s.
    fn end(job_id: &str, status: Status) -> JobEnd {
        JobEnd {
            job_id: job_id.into(),
            stage: None,
            epoch: None,
            attempt: None,
            unleased_at: None,
            status,
            error: None,
            reward: None,
            eval_output: None,
            run_output: None,
            now: EpochMs(9_000),
        }
    }

    /// `end` restricted to INIT's entry `epoch` (and the claim `attempt`, if given).
    fn at_init(end: JobEnd, epoch: i64, attempt: Option<i64>) -> JobEnd {
        JobEnd {
            stage: Some("init"),
            epoch: Some(epoch),
            attempt,
            ..end
        }
    }

    /// Submits six jobs to batch `b` and claims the first two's INIT; their ids, in
    /// submit order.
    async fn six_jobs_two_claimed<D: Dialect>(store: &SqlStore<D>) -> Vec<String> {
        let jobs: Vec<NewJob> = (0..6)
            .map(|_| NewJob {
                id: uuid::Uuid::now_v7().to_string(),
                kind: "synthetic".into(),
                client_id: None,
                group_id: None,
                task: serde_json::json!({"kind": "synthetic", "spec": {}, "metadata": {"m": 1}}),
            })
            .collect();
        store.submit("b", &jobs, EpochMs(1_000)).await.unwrap();
        for job in &jobs[..2] {
            let id = job.id.as_str();
            let claim = StageClaim {
                job_id: id.into(),
                stage: Stage::Init,
                epoch: 0,
                node: "n".into(),
                lease_until: EpochMs(99_000),
                now: EpochMs(2_000),
            };
            assert!(store.db.claim(claim).await.unwrap().is_some());
        }
        jobs.into_iter().map(|j| j.id).collect()
    }

    /// The check both dialects' job ends pass (their unit tests call it): several ends
    /// in one statement each apply to their own job only, under the one-row
    /// statement's conditions, and are answered in request order.
    pub(crate) async fn several_ends_in_one_statement_apply_each_to_its_own_job<D: Dialect>(
        store: &SqlStore<D>,
    ) {
        let jobs = six_jobs_two_claimed(store).await;
        let [a, b, c, d, e, f] = [0, 1, 2, 3, 4, 5].map(|i| jobs[i].as_str());
        let awkward = "naïve \"quoted\"\n\ttext \\ ✓";
        // Ids are time-ordered: asking in reverse makes request order differ from the
        // statement's job-id order.
        let ends = [
            // NaN cannot travel in JSON: this one runs as its own statement.
            JobEnd {
                reward: Some(f64::NAN),
                ..end(f, Status::Done)
            },
            JobEnd {
                error: Some(awkward.into()),
                ..end(e, Status::Failed)
            },
            // Another stage entry.
            at_init(end(d, Status::Done), 3, None),
            // Queued, so nobody holds a lease on it.
            JobEnd {
                unleased_at: Some(EpochMs(9_000)),
                error: Some("no".into()),
                ..at_init(end(c, Status::Cancelled), 0, None)
            },
            // Another claim's token.
            at_init(end(b, Status::Done), 0, Some(2)),
            JobEnd {
                reward: Some(0.5),
                eval_output: Some(r#"{"score":1}"#.into()),
                run_output: Some(r#"{"partial":true}"#.into()),
                ..at_init(end(a, Status::Done), 0, Some(1))
            },
        ];
        let got = Ends(store.db.clone()).run(&ends).await.unwrap();
        let got: Vec<Option<(String, Status)>> = got
            .into_iter()
            .map(|e| e.map(|e| (e.result.job_id, e.result.status)))
            .collect();
        assert_eq!(
            got,
            vec![
                Some((f.into(), Status::Done)),
                Some((e.into(), Status::Failed)),
                None,
                Some((c.into(), Status::Cancelled)),
                None,
                Some((a.into(), Status::Done)),
            ]
        );
        // Ending them again applies to none.
        let again = Ends(store.db.clone()).run(&ends).await.unwrap();
        assert!(again.iter().all(Option::is_none));

        what_the_ends_recorded(store, [a, b, d, e], awkward).await;
    }

    /// What [`several_ends_in_one_statement_apply_each_to_its_own_job`] checks its
    /// ends recorded, on the jobs, their results, their batch and their history.
    async fn what_the_ends_recorded<D: Dialect>(
        store: &SqlStore<D>,
        [a, b, d, e]: [&str; 4],
        awkward: &str,
    ) {
        let ra = store.result(a).await.unwrap().unwrap();
        assert_eq!((ra.reward, ra.created_at), (Some(0.5), 9_000));
        assert_eq!(
            ra.output,
            serde_json::json!({"init": null, "run": {"partial": true}, "eval": {"score": 1}, "metadata": {"m": 1}})
        );
        let re = store.result(e).await.unwrap().unwrap();
        assert_eq!(re.error.as_deref(), Some(awkward));
        assert_eq!(re.reward, None);
        for (id, status) in [(b, Status::Running), (d, Status::Queued)] {
            assert_eq!(store.job(id).await.unwrap().unwrap().status, status);
        }
        let ja = store.job(a).await.unwrap().unwrap();
        assert_eq!((ja.status, ja.finished_at), (Status::Done, Some(9_000)));
        let counters = store.batch("b").await.unwrap().unwrap();
        assert_eq!(
            (
                counters.finished,
                counters.done,
                counters.failed,
                counters.cancelled
            ),
            (4, 2, 1, 1)
        );
        let events = store.events(a).await.unwrap();
        assert_eq!(events.last().map(|e| e.event.as_str()), Some("done"));
    }

    /// The check both dialects' job ends pass for sampling groups: the ends of whole
    /// groups in one statement decide each group once, with the verdicts, ranks and
    /// counters that ending them one at a time gives.
    pub(crate) async fn ends_of_whole_groups_in_one_statement_decide_each_once<D: Dialect>(
        store: &SqlStore<D>,
    ) {
        let mut outcomes = Vec::new();
        for (id, together) in [("one-by-one", false), ("together", true)] {
            let new = NewSampling {
                id: id.into(),
                params: SamplingParams {
                    group_size: 2,
                    target_groups: 1,
                    max_groups_in_flight: 2,
                    max_groups: 2,
                    informative: Default::default(),
                    policy_version: None,
                    on_cancel: Default::default(),
                    carry_from: None,
                },
                prompts: (0..2)
                    .map(|i| serde_json::json!({"kind": "synthetic", "spec": {"seed": i}}))
                    .collect(),
            };
            store.create_sampling(&new, EpochMs(1_000)).await.unwrap();
            let launched = store.launch_groups(id, EpochMs(1_000)).await.unwrap();
            assert_eq!(launched.len(), 4);
            let mut ends = Vec::new();
            let mut p0_rewards = [0.0, 1.0].into_iter();
            for s in &launched {
                let job = store.job(&s.id).await.unwrap().unwrap();
                // p0 disagrees with itself (informative), p1 does not (uniform).
                let reward = match job.group_id.as_deref() {
                    Some("p0") => p0_rewards.next().unwrap(),
                    _ => 1.0,
                };
                ends.push(JobEnd {
                    reward: Some(reward),
                    ..end(&s.id, Status::Done)
                });
            }
            ends.sort_by(|x, y| x.job_id.cmp(&y.job_id));
            let ended: Vec<Ended> = if together {
                Ends(store.db.clone()).run(&ends).await.unwrap()
            } else {
                let mut all = Vec::new();
                for e in &ends {
                    all.extend(
                        Ends(store.db.clone())
                            .run(std::slice::from_ref(e))
                            .await
                            .unwrap(),
                    );
                }
                all
            }
            .into_iter()
            .map(Option::unwrap)
            .collect();
            let decided: Vec<(String, Verdict, Option<i64>)> = ended
                .into_iter()
                .filter_map(|e| e.decided)
                .map(|d| (d.group_id, d.verdict, d.accepted_rank))
                .collect();
            let batch = store.sampling_batch(id).await.unwrap().unwrap();
            outcomes.push((decided, batch.status, batch.counters));
        }
        assert_eq!(outcomes[0], outcomes[1]);
        let (decided, _, counters) = &outcomes[1];
        assert_eq!(decided.len(), 2, "each group decided once: {decided:?}");
        assert!(decided.contains(&("p0".into(), Verdict::Informative, Some(1))));
        assert_eq!((counters.groups_decided, counters.informative), (2, 1));
    }
}
