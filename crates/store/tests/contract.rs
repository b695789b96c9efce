//! The store's contract, checked on both databases: what every worker, gateway and
//! reconciler relies on when it claims, renews, advances, hands back and ends a job.
//! Each check is written once, as a function of the database, and [`on_both_databases`]
//! makes two tests of it, `sqlite::NAME` and `postgres::NAME` (the latter on the server
//! `ROLLOUT_TEST_DATABASE_URL` names; without one it says it skipped, and fails under
//! `CI=true`). Each test gets a fresh database copied from a migrated template
//! (`rollout_test_support::database`). Time is the `now` each call is given, so nothing
//! here waits on a clock.

use std::sync::Arc;

use rollout_core::domain::{EpochMs, Outcome, Stage, Status, Task, WorkMessage};
use rollout_store::{Claim, FinishIf, NewJob, Store};
use rollout_test_support::database::{TestDb, postgres_admin_url_or_skip};
use rollout_test_support::eventually::{eventually, holds};
use serde_json::json;

/// Which database a check runs on.
#[derive(Clone, Copy, Debug)]
enum Database {
    Sqlite,
    Postgres,
}

/// Makes a `sqlite::NAME` and a `postgres::NAME` test of each check `NAME(Database)`,
/// on a current-thread runtime or, for the checks that race tasks, a multi-thread one.
macro_rules! on_both_databases {
    (current: [$($one:ident),* $(,)?], multi: [$($many:ident),* $(,)?] $(,)?) => {
        on_both_databases!(@module sqlite, Database::Sqlite, [$($one),*], [$($many),*]);
        on_both_databases!(@module postgres, Database::Postgres, [$($one),*], [$($many),*]);
    };
    (@module $module:ident, $db:expr, [$($one:ident),*], [$($many:ident),*]) => {
        mod $module {
            use super::Database;
            $(
                #[tokio::test]
                async fn $one() {
                    super::$one($db).await;
                }
            )*
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $many() {
                    super::$many($db).await;
                }
            )*
        }
    };
}

on_both_databases! {
    current: [
        a_stage_entry_is_claimed_once_until_its_lease_lapses,
        only_the_current_claim_renews_advances_releases_or_ends,
        a_hand_back_does_not_count_as_an_attempt_and_a_fault_does,
        restarts_go_back_to_init_until_the_limit,
        a_job_ends_once_with_one_result_and_counts_once,
        totals_by_status_agree_with_the_job_rows,
        giving_up_on_a_message_waits_for_its_lease,
        a_repeated_client_id_returns_the_first_job,
        nothing_of_an_ended_batch_starts_moves_on_or_is_scored,
        policy_versions_only_move_forward_and_racing_announcers_get_one_order,
        a_weight_update_holds_one_version_until_resumed_or_its_lease_runs_out,
    ],
    multi: [
        results_followed_by_cursor_while_two_stores_end_jobs_are_all_seen_once,
        racing_claims_and_hand_offs_of_many_jobs_apply_once_each_to_their_own_job,
        results_marked_published_at_once_by_many_tasks_are_all_marked_and_no_others,
    ],
}

/// A fresh migrated store and the directory (and database) that hold it.
struct Fixture {
    store: Arc<dyn Store>,
    db: TestDb,
    _dir: tempfile::TempDir,
}

/// The fixture on `database`, or `None` (after saying so, or failing under `CI=true`)
/// when it is Postgres and no server is named.
async fn fixture(database: Database) -> Option<Fixture> {
    let dir = tempfile::tempdir().unwrap();
    let db = match database {
        Database::Sqlite => TestDb::sqlite(dir.path()),
        Database::Postgres => {
            let admin = postgres_admin_url_or_skip("a store contract test on Postgres")?;
            TestDb::postgres(&admin).await
        }
    };
    let store = rollout_store::connect(&db.url, 4).await.unwrap();
    Some(Fixture {
        store,
        db,
        _dir: dir,
    })
}

/// A synthetic task: the store never looks inside it.
fn synthetic() -> Task {
    Task::new("synthetic", json!({}))
}

fn new_job(client_id: Option<&str>, group: Option<&str>) -> NewJob {
    NewJob {
        id: uuid::Uuid::now_v7().to_string(),
        kind: "synthetic".into(),
        client_id: client_id.map(str::to_string),
        group_id: group.map(str::to_string),
        task: serde_json::to_value(synthetic()).unwrap(),
    }
}

/// Submits one job (of group "g") and returns its INIT message.
async fn submit_one(store: &dyn Store, batch: &str) -> WorkMessage {
    submit_in(store, batch, Some("g")).await
}

/// Submits one job of `group` and returns its INIT message.
async fn submit_in(store: &dyn Store, batch: &str, group: Option<&str>) -> WorkMessage {
    let s = store
        .submit(batch, &[new_job(None, group)], EpochMs(1_000))
        .await
        .unwrap();
    WorkMessage {
        job_id: s[0].id.clone(),
        stage: Stage::Init,
        epoch: 0,
    }
}

/// Submits `n` jobs to batch "b" and returns their INIT messages, in submit order.
async fn submit_many(store: &dyn Store, n: usize) -> Vec<WorkMessage> {
    let jobs: Vec<NewJob> = (0..n).map(|_| new_job(None, None)).collect();
    let submitted = store.submit("b", &jobs, EpochMs(1_000)).await.unwrap();
    submitted
        .into_iter()
        .map(|s| WorkMessage {
            job_id: s.id,
            stage: Stage::Init,
            epoch: 0,
        })
        .collect()
}

/// Claims `msg` at `now` with a lease of 1 s and returns the claim's token.
async fn claim(store: &dyn Store, msg: &WorkMessage, node: &str, now: i64) -> i64 {
    match store
        .claim(msg, node, EpochMs(now + 1_000), EpochMs(now))
        .await
        .unwrap()
    {
        Claim::Started(job) => job.attempts,
        other => panic!("claim of {msg:?} at {now}: {other:?}"),
    }
}

async fn a_stage_entry_is_claimed_once_until_its_lease_lapses(database: Database) {
    let Some(f) = fixture(database).await else {
        return;
    };
    let store = f.store.as_ref();
    let msg = submit_one(store, "b").await;
    let first = claim(store, &msg, "n1", 2_000).await;
    assert_eq!(first, 1);
    let job = store.job(&msg.job_id).await.unwrap().unwrap();
    assert_eq!(
        (job.status, job.node.as_deref(), job.lease_until),
        (Status::Running, Some("n1"), Some(3_000))
    );

    // A second delivery while the lease is live is told how long to wait.
    match store
        .claim(&msg, "n2", EpochMs(3_500), EpochMs(2_500))
        .await
        .unwrap()
    {
        Claim::Busy(until) => assert_eq!(until, EpochMs(3_000)),
        other => panic!("expected Busy, got {other:?}"),
    }
    // A message from another stage entry is stale; an unknown job is missing.
    let old = WorkMessage {
        epoch: 7,
        ..msg.clone()
    };
    assert!(matches!(
        store
            .claim(&old, "n2", EpochMs(3_500), EpochMs(2_500))
            .await
            .unwrap(),
        Claim::Stale(_)
    ));
    let unknown = WorkMessage {
        job_id: "no-such-job".into(),
        ..msg.clone()
    };
    assert!(matches!(
        store
            .claim(&unknown, "n2", EpochMs(3_500), EpochMs(2_500))
            .await
            .unwrap(),
        Claim::Missing
    ));

    // Once the lease lapsed, another node takes the stage over under a new token.
    let second = claim(store, &msg, "n2", 3_001).await;
    assert_eq!(second, 2);
}

async fn only_the_current_claim_renews_advances_releases_or_ends(database: Database) {
    let Some(f) = fixture(database).await else {
        return;
    };
    let store = f.store.as_ref();
    let msg = submit_one(store, "b").await;
    let stale = claim(store, &msg, "n1", 2_000).await;
    assert!(
        store
            .extend_lease(&msg, stale, EpochMs(2_900))
            .await
            .unwrap()
    );
    assert!(
        !store
            .extend_lease(&msg, stale + 1, EpochMs(9_000))
            .await
            .unwrap(),
        "a token never handed out renews nothing"
    );

    // n1 stops renewing; n2 takes over after the lease it last set.
    let current = claim(store, &msg, "n2", 2_901).await;
    assert_ne!(stale, current);

    // Everything n1 still tries with its old token is refused, and changes nothing.
    assert!(
        !store
            .extend_lease(&msg, stale, EpochMs(99_000))
            .await
            .unwrap()
    );
    assert_eq!(
        store
            .advance(&msg, stale, &json!({"by": "n1"}), None, EpochMs(3_000))
            .await
            .unwrap(),
        None
    );
    assert!(
        !store
            .release(&msg, stale, false, EpochMs(3_000))
            .await
            .unwrap()
    );
    assert_eq!(
        store
            .restart(&msg, stale, 5, true, EpochMs(3_000))
            .await
            .unwrap(),
        None
    );
    let claimed_by_n1 = FinishIf::Claimed {
        msg: msg.clone(),
        attempt: stale,
    };
    let end = Outcome::failed("n1 gave up");
    assert!(
        store
            .finish(&claimed_by_n1, &msg.job_id, &end, EpochMs(3_000))
            .await
            .unwrap()
            .is_none()
    );
    let job = store.job(&msg.job_id).await.unwrap().unwrap();
    assert_eq!(
        (job.status, job.stage, job.node.as_deref(), job.lease_until),
        (Status::Running, Stage::Init, Some("n2"), Some(3_901))
    );

    // The current holder's token works.
    assert!(
        store
            .extend_lease(&msg, current, EpochMs(4_500))
            .await
            .unwrap()
    );
    let next = store
        .advance(
            &msg,
            current,
            &json!({"by": "n2"}),
            Some("n2"),
            EpochMs(3_100),
        )
        .await
        .unwrap()
        .expect("the current claim advances");
    assert_eq!((next.stage, next.epoch), (Stage::Run, 1));
    let job = store.job(&msg.job_id).await.unwrap().unwrap();
    assert_eq!(job.init_output, Some(json!({"by": "n2"})));
    assert_eq!(
        (job.status, job.route.as_deref()),
        (Status::Queued, Some("n2"))
    );
    // The INIT entry is now history: its message is stale.
    assert!(matches!(
        store
            .claim(&msg, "n3", EpochMs(9_000), EpochMs(4_000))
            .await
            .unwrap(),
        Claim::Stale(_)
    ));
}

async fn a_hand_back_does_not_count_as_an_attempt_and_a_fault_does(database: Database) {
    let Some(f) = fixture(database).await else {
        return;
    };
    let store = f.store.as_ref();
    let msg = submit_one(store, "b").await;
    let t = claim(store, &msg, "n1", 2_000).await;
    assert!(store.release(&msg, t, true, EpochMs(2_100)).await.unwrap());
    let job = store.job(&msg.job_id).await.unwrap().unwrap();
    assert_eq!((job.status, job.stage_attempts), (Status::Queued, 0));
    let t = claim(store, &msg, "n1", 2_200).await;
    assert!(store.release(&msg, t, false, EpochMs(2_300)).await.unwrap());
    let job = store.job(&msg.job_id).await.unwrap().unwrap();
    assert_eq!(
        (job.status, job.stage_attempts, job.attempts),
        (Status::Queued, 1, 2)
    );
}

async fn restarts_go_back_to_init_until_the_limit(database: Database) {
    let Some(f) = fixture(database).await else {
        return;
    };
    let store = f.store.as_ref();
    let init = submit_one(store, "b").await;
    let t = claim(store, &init, "n1", 2_000).await;
    let run = store
        .advance(&init, t, &json!({}), Some("n1"), EpochMs(2_100))
        .await
        .unwrap()
        .unwrap();
    let t = claim(store, &run, "n1", 2_200).await;
    // An uncounted restart (a graceful hand-back) leaves the count alone.
    let back = store
        .restart(&run, t, 1, false, EpochMs(2_300))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((back.stage, back.epoch), (Stage::Init, 2));
    let job = store.job(&init.job_id).await.unwrap().unwrap();
    assert_eq!((job.restarts, job.init_output, job.route), (0, None, None));

    let t = claim(store, &back, "n1", 2_400).await;
    let run = store
        .advance(&back, t, &json!({}), None, EpochMs(2_500))
        .await
        .unwrap()
        .unwrap();
    let t = claim(store, &run, "n1", 2_600).await;
    let back = store
        .restart(&run, t, 1, true, EpochMs(2_700))
        .await
        .unwrap()
        .unwrap();
    let t = claim(store, &back, "n1", 2_800).await;
    let run = store
        .advance(&back, t, &json!({}), None, EpochMs(2_900))
        .await
        .unwrap()
        .unwrap();
    let t = claim(store, &run, "n1", 3_000).await;
    assert_eq!(
        store
            .restart(&run, t, 1, true, EpochMs(3_100))
            .await
            .unwrap(),
        None,
        "a second counted restart is over the limit of one"
    );
}

async fn a_job_ends_once_with_one_result_and_counts_once(database: Database) {
    let Some(f) = fixture(database).await else {
        return;
    };
    let store = f.store.as_ref();
    let msg = submit_one(store, "b").await;
    let t = claim(store, &msg, "n1", 2_000).await;
    let cond = FinishIf::Claimed {
        msg: msg.clone(),
        attempt: t,
    };
    let done = Outcome::done(0.5, json!({"why": "tests passed"}));
    let result = store
        .finish(&cond, &msg.job_id, &done, EpochMs(2_500))
        .await
        .unwrap()
        .expect("the holder ends the job");
    assert_eq!(
        (result.result.status, result.result.reward),
        (Status::Done, Some(0.5))
    );
    assert_eq!(result.result.output["eval"], json!({"why": "tests passed"}));
    assert!(result.result.seq > 0);

    // No second end applies, whoever tries and however.
    for cond in [cond, FinishIf::Live, FinishIf::Unleased(msg.clone())] {
        let again = store
            .finish(
                &cond,
                &msg.job_id,
                &Outcome::cancelled("late"),
                EpochMs(2_600),
            )
            .await
            .unwrap();
        assert!(again.is_none(), "{cond:?} ended the job a second time");
    }
    let batch = store.batch("b").await.unwrap().unwrap();
    assert_eq!(
        (batch.submitted, batch.finished, batch.done, batch.cancelled),
        (1, 1, 1, 0)
    );
    let group = store.group("b", "g").await.unwrap().unwrap();
    assert_eq!(
        (group.finished, group.rewarded, group.reward_sum),
        (1, 1, 0.5)
    );
    let stored = store.result(&msg.job_id).await.unwrap().unwrap();
    assert_eq!(
        (stored.seq, stored.status),
        (result.result.seq, Status::Done)
    );
    let page = store
        .results_after(Some("b"), 0, 10, 1 << 20)
        .await
        .unwrap();
    assert_eq!(
        page.iter().map(|r| r.seq).collect::<Vec<_>>(),
        vec![result.result.seq]
    );
    let job = store.job(&msg.job_id).await.unwrap().unwrap();
    assert_eq!((job.status, job.finished_at), (Status::Done, Some(2_500)));
}

/// `totals` (what the metrics scrape reads) agrees with the job rows counted by
/// `counts`, over several batches and every status, though it takes the finished jobs
/// from their batches' counters.
async fn totals_by_status_agree_with_the_job_rows(database: Database) {
    let Some(f) = fixture(database).await else {
        return;
    };
    let store = f.store.as_ref();
    let submit_to = |batch| submit_in(store, batch, None);
    for (batch, status) in [
        ("a", Status::Done),
        ("a", Status::Failed),
        ("b", Status::Cancelled),
        ("b", Status::TimedOut),
        ("b", Status::Done),
    ] {
        let msg = submit_to(batch).await;
        let attempt = claim(store, &msg, "n1", 2_000).await;
        let outcome = match status {
            Status::Done => Outcome::done(1.0, json!({})),
            s => Outcome::ended(s, "ended by the test"),
        };
        let cond = FinishIf::Claimed {
            msg: msg.clone(),
            attempt,
        };
        store
            .finish(&cond, &msg.job_id, &outcome, EpochMs(2_500))
            .await
            .unwrap()
            .expect("the holder ends the job");
    }
    let running = submit_to("b").await;
    claim(store, &running, "n1", 2_000).await;
    submit_to("c").await;
    submit_to("c").await;

    let totals = store.totals().await.unwrap();
    let counts = store.counts(None).await.unwrap();
    for (status, n) in &totals {
        let rows: i64 = counts
            .iter()
            .filter(|c| c.status == *status)
            .map(|c| c.count)
            .sum();
        assert_eq!(*n, rows, "{status:?}: totals {totals:?}, counts {counts:?}");
    }
    let expected = [
        (Status::Queued, 2),
        (Status::Running, 1),
        (Status::Done, 2),
        (Status::Failed, 1),
        (Status::Cancelled, 1),
        (Status::TimedOut, 1),
    ];
    for (status, n) in expected {
        assert!(totals.contains(&(status, n)), "{status:?}: {totals:?}");
    }
    assert_eq!(totals.len(), Status::ALL.len(), "{totals:?}");
}

async fn giving_up_on_a_message_waits_for_its_lease(database: Database) {
    let Some(f) = fixture(database).await else {
        return;
    };
    let store = f.store.as_ref();
    let msg = submit_one(store, "b").await;
    claim(store, &msg, "n1", 2_000).await;
    let cond = FinishIf::Unleased(msg.clone());
    let end = Outcome::failed("out of deliveries");
    assert!(
        store
            .finish(&cond, &msg.job_id, &end, EpochMs(2_999))
            .await
            .unwrap()
            .is_none(),
        "a live lease protects the stage"
    );
    let result = store
        .finish(&cond, &msg.job_id, &end, EpochMs(3_001))
        .await
        .unwrap();
    assert_eq!(result.map(|r| r.result.status), Some(Status::Failed));
}

async fn a_repeated_client_id_returns_the_first_job(database: Database) {
    let Some(f) = fixture(database).await else {
        return;
    };
    let store = f.store.as_ref();
    let first = store
        .submit(
            "b",
            &[new_job(Some("k1"), None), new_job(Some("k2"), None)],
            EpochMs(1_000),
        )
        .await
        .unwrap();
    assert!(first.iter().all(|s| !s.duplicate));
    let again = store
        .submit(
            "b",
            &[new_job(Some("k3"), None), new_job(Some("k1"), None)],
            EpochMs(1_100),
        )
        .await
        .unwrap();
    assert_eq!((again[0].duplicate, again[1].duplicate), (false, true));
    assert_eq!(
        again[1].id, first[0].id,
        "the answer keeps the request's order"
    );
    let batch = store.batch("b").await.unwrap().unwrap();
    assert_eq!(batch.submitted, 3);
}

/// Two processes' stores (each with its own group-commit writer) end 300 jobs of one
/// batch at once while a trainer follows the results with a `seq` cursor: it sees every
/// result exactly once. A result committed after a higher `seq` became visible would be
/// behind the cursor and never seen (on Postgres, identity values are handed out at
/// insert, not at commit; the result-ordering lock is what prevents that).
async fn results_followed_by_cursor_while_two_stores_end_jobs_are_all_seen_once(
    database: Database,
) {
    const N: usize = 300;
    let Some(f) = fixture(database).await else {
        return;
    };
    let other = rollout_store::connect(&f.db.url, 4).await.unwrap();
    let stores = [f.store.clone(), other];
    let msgs = submit_many(stores[0].as_ref(), N).await;
    let mut claims = Vec::new();
    for msg in &msgs {
        let t = claim(stores[0].as_ref(), msg, "n1", 2_000).await;
        claims.push((msg.clone(), t));
    }

    let ending = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let reader = {
        let store = stores[1].clone();
        let ending = ending.clone();
        tokio::spawn(async move {
            let mut cursor = 0;
            let mut seen = Vec::new();
            loop {
                let still_ending = ending.load(std::sync::atomic::Ordering::SeqCst);
                let page = store
                    .results_after(Some("b"), cursor, 40, 1 << 20)
                    .await
                    .unwrap();
                if page.is_empty() && !still_ending {
                    return seen;
                }
                for r in page {
                    assert!(r.seq > cursor, "seq {} after cursor {cursor}", r.seq);
                    cursor = r.seq;
                    seen.push(r.job_id);
                }
                tokio::task::yield_now().await;
            }
        })
    };
    let ends: Vec<_> = claims
        .into_iter()
        .enumerate()
        .map(|(i, (msg, t))| {
            let store = stores[i % 2].clone();
            tokio::spawn(async move {
                let cond = FinishIf::Claimed {
                    msg: msg.clone(),
                    attempt: t,
                };
                store
                    .finish(
                        &cond,
                        &msg.job_id,
                        &Outcome::done(1.0, json!({})),
                        EpochMs(3_000),
                    )
                    .await
                    .unwrap()
                    .expect("the holder ends the job")
            })
        })
        .collect();
    for e in ends {
        e.await.unwrap();
    }
    ending.store(false, std::sync::atomic::Ordering::SeqCst);
    let mut seen = reader.await.unwrap();
    assert_eq!(seen.len(), N, "the cursor missed or repeated results");
    seen.sort();
    let mut want: Vec<String> = msgs.into_iter().map(|m| m.job_id).collect();
    want.sort();
    assert_eq!(seen, want);
    let batch = stores[0].batch("b").await.unwrap().unwrap();
    let n = i64::try_from(N).unwrap();
    assert_eq!((batch.finished, batch.done), (n, n));
}

/// Many tasks on two stores claim and hand off at once, as a busy node does (on Postgres
/// their statements are coalesced, many jobs to a statement): every job's entry is
/// claimed by exactly one of two racing deliveries, only the holder's token hands it
/// off, and each job carries its own output into the next stage.
async fn racing_claims_and_hand_offs_of_many_jobs_apply_once_each_to_their_own_job(
    database: Database,
) {
    const N: usize = 200;
    let Some(f) = fixture(database).await else {
        return;
    };
    let other = rollout_store::connect(&f.db.url, 4).await.unwrap();
    let stores = [f.store.clone(), other];
    let msgs = submit_many(stores[0].as_ref(), N).await;

    // Two deliveries of every INIT message, one per store, all at once.
    let mut racing = Vec::new();
    for (i, msg) in msgs.iter().enumerate() {
        for (n, store) in stores.iter().enumerate() {
            let (store, msg) = (store.clone(), msg.clone());
            racing.push(tokio::spawn(async move {
                let c = store
                    .claim(&msg, &format!("n{n}"), EpochMs(9_000), EpochMs(2_000))
                    .await
                    .unwrap();
                (i, n, c)
            }));
        }
    }
    let mut holder = vec![None; N];
    for r in racing {
        let (i, n, c) = r.await.unwrap();
        match c {
            Claim::Started(job) => {
                assert_eq!(job.id, msgs[i].job_id);
                assert_eq!(job.node.as_deref(), Some(format!("n{n}").as_str()));
                assert!(holder[i].is_none(), "job {i} claimed twice");
                holder[i] = Some((n, job.attempts));
            }
            Claim::Busy(until) => assert_eq!(until, EpochMs(9_000)),
            other => panic!("job {i}: {other:?}"),
        }
    }

    // The holder and an impostor with a wrong token hand off at once.
    let mut handing = Vec::new();
    for (i, msg) in msgs.iter().enumerate() {
        let (n, token) = holder[i].expect("one delivery claimed each job");
        for (store, t) in [(&stores[n], token), (&stores[1 - n], token + 1)] {
            let (store, msg) = (store.clone(), msg.clone());
            handing.push(tokio::spawn(async move {
                let out = json!({ "job": i, "token": t });
                let next = store
                    .advance(&msg, t, &out, Some(&format!("r{i}")), EpochMs(3_000))
                    .await
                    .unwrap();
                (i, t == token, next)
            }));
        }
    }
    for h in handing {
        let (i, rightful, next) = h.await.unwrap();
        if rightful {
            let next = next.expect("the holder's hand-off applies");
            assert_eq!((next.stage, next.epoch), (Stage::Run, 1));
            assert_eq!(next.job_id, msgs[i].job_id);
        } else {
            assert!(next.is_none(), "job {i}: a wrong token handed off");
        }
    }
    for (i, msg) in msgs.iter().enumerate() {
        let job = stores[i % 2].job(&msg.job_id).await.unwrap().unwrap();
        let (_, token) = holder[i].unwrap();
        assert_eq!(
            (job.status, job.stage, job.epoch),
            (Status::Queued, Stage::Run, 1)
        );
        assert_eq!(job.route.as_deref(), Some(format!("r{i}").as_str()));
        assert_eq!(job.init_output, Some(json!({ "job": i, "token": token })));
    }
}

/// Many tasks mark results published at once (every job's end marks its own; on Postgres
/// the marks are coalesced into shared statements): exactly the marked ones stop being
/// unpublished, whichever statement carried them.
async fn results_marked_published_at_once_by_many_tasks_are_all_marked_and_no_others(
    database: Database,
) {
    const N: usize = 120;
    let Some(f) = fixture(database).await else {
        return;
    };
    let store = f.store.clone();
    let mut seqs = Vec::new();
    for msg in submit_many(store.as_ref(), N).await {
        let ended = store
            .finish(
                &FinishIf::Live,
                &msg.job_id,
                &Outcome::done(1.0, json!({})),
                EpochMs(2_000),
            )
            .await
            .unwrap()
            .expect("a queued job ends");
        seqs.push(ended.result.seq);
    }
    // Every third result stays unmarked.
    let (kept, marked): (Vec<i64>, Vec<i64>) = seqs.iter().partition(|&&s| s % 3 == 0);
    let marking: Vec<_> = marked
        .into_iter()
        .map(|seq| {
            let store = store.clone();
            tokio::spawn(async move { store.mark_published(&[seq], EpochMs(3_000)).await })
        })
        .collect();
    for m in marking {
        m.await.unwrap().unwrap();
    }
    // SQLite applies marks shortly after `mark_published` returns.
    let mut want = kept;
    want.sort_unstable();
    eventually(
        "exactly the unmarked results are left unpublished",
        std::time::Duration::from_secs(10),
        || async {
            let mut left: Vec<i64> = store
                .unpublished_results(EpochMs::MAX, 1_000)
                .await
                .unwrap()
                .into_iter()
                .map(|r| r.seq)
                .collect();
            left.sort_unstable();
            holds(left == want, left)
        },
    )
    .await;
}

/// A batch's end is a fence in the database: from its commit, none of the batch's jobs
/// starts a stage, renews its lease, moves on, or is scored (a worker's end written
/// after it is recorded `cancelled` with the batch's reason, whatever it asked for), so
/// however long the cancelling takes, nothing of a cancelled batch is scored after the
/// cancel. Jobs of other batches are untouched; the ended batch with jobs left is found
/// for the reconciler until they have ended.
async fn nothing_of_an_ended_batch_starts_moves_on_or_is_scored(database: Database) {
    let Some(f) = fixture(database).await else {
        return;
    };
    let store = f.store.as_ref();
    let running = submit_one(store, "b").await;
    let in_run = submit_one(store, "b").await;
    let queued = submit_one(store, "b").await;
    let other = submit_one(store, "other").await;
    let held = claim(store, &running, "n1", 2_000).await;
    let a = claim(store, &in_run, "n1", 2_000).await;
    let run = store
        .advance(&in_run, a, &json!({}), Some("n1"), EpochMs(2_100))
        .await
        .unwrap()
        .expect("advances before the end");
    let in_run_claim = claim(store, &run, "n1", 2_200).await;

    assert_eq!(
        store
            .end_batch("b", "the batch was cancelled", EpochMs(2_500))
            .await
            .unwrap(),
        Some(true)
    );
    assert_eq!(
        store.end_batch("b", "again", EpochMs(2_600)).await.unwrap(),
        Some(false),
        "a batch ends once"
    );
    assert_eq!(
        store.end_batch("nope", "x", EpochMs(2_600)).await.unwrap(),
        None
    );
    let b = store.batch("b").await.unwrap().unwrap();
    assert_eq!(
        (b.ended_at, b.end_reason.as_deref()),
        (Some(2_500), Some("the batch was cancelled"))
    );

    // A queued job does not start; its message is to be dropped.
    assert!(matches!(
        store
            .claim(&queued, "n2", EpochMs(9_000), EpochMs(2_700))
            .await
            .unwrap(),
        Claim::BatchEnded
    ));
    // A running stage cannot renew its lease or move on to the next stage.
    assert!(
        !store
            .extend_lease(&running, held, EpochMs(3_500))
            .await
            .unwrap()
    );
    assert_eq!(
        store
            .advance(&running, held, &json!({}), None, EpochMs(2_800))
            .await
            .unwrap(),
        None
    );
    // A worker's end after the batch's end is a cancel, not a score.
    let claimed = FinishIf::Claimed {
        msg: run.clone(),
        attempt: in_run_claim,
    };
    let ended = store
        .finish(
            &claimed,
            &run.job_id,
            &Outcome::done(1.0, json!({"passed": true})),
            EpochMs(2_900),
        )
        .await
        .unwrap()
        .expect("the end applies, as a cancel");
    assert_eq!(
        (
            ended.result.status,
            ended.result.reward,
            ended.result.error.as_deref()
        ),
        (Status::Cancelled, None, Some("the batch was cancelled"))
    );
    cancel_the_rest(store, &[&running, &queued]).await;

    // Another batch's job is untouched.
    let c = claim(store, &other, "n1", 3_000).await;
    let next = store
        .advance(&other, c, &json!({}), Some("n1"), EpochMs(3_100))
        .await
        .unwrap();
    assert!(next.is_some());
}

/// What a canceller does with the jobs of ended batch "b" that are left (`left`): the
/// batch is listed for the reconciler until they have ended.
async fn cancel_the_rest(store: &dyn Store, left: &[&WorkMessage]) {
    assert_eq!(
        store.ended_batches_with_live_jobs().await.unwrap(),
        ["b"],
        "jobs of the ended batch are left"
    );
    for msg in left {
        store
            .finish(
                &FinishIf::Live,
                &msg.job_id,
                &Outcome::cancelled("x"),
                EpochMs(3_000),
            )
            .await
            .unwrap()
            .unwrap();
    }
    assert!(
        store
            .ended_batches_with_live_jobs()
            .await
            .unwrap()
            .is_empty()
    );
    let b = store.batch("b").await.unwrap().unwrap();
    assert_eq!((b.finished, b.cancelled, b.done), (3, 3, 0));
}

async fn policy_versions_only_move_forward_and_racing_announcers_get_one_order(database: Database) {
    use rollout_store::Announced;
    let Some(f) = fixture(database).await else {
        return;
    };
    let store = f.store.as_ref();
    assert_eq!(store.current_policy().await.unwrap(), None);
    let Announced::New(v3) = store.announce_policy(3, EpochMs(1_000)).await.unwrap() else {
        panic!("the first announcement is new");
    };
    assert_eq!((v3.version, v3.announced_at), (3, 1_000));
    // Repeated: the same version, its first announcement's time.
    assert_eq!(
        store.announce_policy(3, EpochMs(2_000)).await.unwrap(),
        Announced::Repeated(v3)
    );
    // Older than current: refused, naming the current one.
    assert_eq!(
        store.announce_policy(2, EpochMs(3_000)).await.unwrap(),
        Announced::Outdated(v3)
    );
    assert_eq!(store.current_policy().await.unwrap(), Some(v3));

    // Many announcers at once, versions 10..40 in a scrambled order: the current one is
    // the newest, and every announcement that was told `New` was newer than every one
    // that came before it in the database's order (each replaced the one before).
    let mut versions: Vec<i64> = (10..40).collect();
    versions.reverse();
    versions.swap(3, 17);
    let answers = futures::future::join_all(versions.iter().map(|v| {
        let store = f.store.clone();
        let v = *v;
        async move {
            (
                v,
                store.announce_policy(v, EpochMs(5_000 + v)).await.unwrap(),
            )
        }
    }))
    .await;
    assert_eq!(store.current_policy().await.unwrap().unwrap().version, 39);
    for (v, answer) in &answers {
        match answer {
            Announced::New(p) => assert_eq!(p.version, *v),
            Announced::Outdated(p) => assert!(p.version > *v, "{v}: {answer:?}"),
            Announced::Repeated(_) | Announced::Busy(_) => {
                panic!("{v} was announced once, with no update in progress: {answer:?}")
            }
        }
    }
    assert!(
        answers
            .iter()
            .any(|(v, a)| *v == 39 && matches!(a, Announced::New(_)))
    );
    // Every version made current is on record, newest first.
    let recent: Vec<i64> = store
        .recent_policies(100)
        .await
        .unwrap()
        .iter()
        .map(|p| p.version)
        .collect();
    let mut made_current: Vec<i64> = answers
        .iter()
        .filter(|(_, a)| matches!(a, Announced::New(_)))
        .map(|(v, _)| *v)
        .chain([3])
        .collect();
    made_current.sort_unstable_by(|a, b| b.cmp(a));
    assert_eq!(recent, made_current);
    assert_eq!(store.recent_policies(2).await.unwrap().len(), 2);
}

async fn a_weight_update_holds_one_version_until_resumed_or_its_lease_runs_out(database: Database) {
    use rollout_core::domain::policy::UpdateMode;
    use rollout_store::{Announced, Pausing, Resumed};
    let Some(f) = fixture(database).await else {
        return;
    };
    let store = f.store.as_ref();
    store.announce_policy(1, EpochMs(1_000)).await.unwrap();
    let seq0 = store.policy_state().await.unwrap().seq;
    // An update to 2: the version is not current yet, and its pause is on record.
    let Pausing::Started(s) = store
        .begin_pause(2, UpdateMode::Abort, EpochMs(2_000), EpochMs(9_000))
        .await
        .unwrap()
    else {
        panic!("the update starts");
    };
    assert_eq!(s.version(), Some(1));
    let p = s.pause.expect("paused");
    assert_eq!(
        (p.version, p.mode, p.since, p.until),
        (2, UpdateMode::Abort, 2_000, 9_000)
    );
    assert!(s.seq > seq0, "every change counts");
    // Repeated: the lease is renewed. Another update, or an announcement, is refused
    // while it runs; an older version is outdated as ever.
    let Pausing::Repeated(r) = store
        .begin_pause(2, UpdateMode::Abort, EpochMs(3_000), EpochMs(12_000))
        .await
        .unwrap()
    else {
        panic!("a repeat renews");
    };
    assert_eq!(r.pause.unwrap().until, 12_000);
    assert!(r.seq > s.seq);
    assert!(matches!(
        store
            .begin_pause(3, UpdateMode::Wait, EpochMs(3_000), EpochMs(9_000))
            .await
            .unwrap(),
        Pausing::Busy(b) if b.version == 2
    ));
    assert!(matches!(
        store.announce_policy(3, EpochMs(3_000)).await.unwrap(),
        Announced::Busy(b) if b.version == 2
    ));
    assert!(matches!(
        store.end_pause(3, EpochMs(3_000)).await.unwrap(),
        Resumed::NotPaused(_)
    ));
    // Not yet expired.
    assert_eq!(store.expire_pause(EpochMs(11_999)).await.unwrap(), None);
    // Resumed: 2 is current, on record, and resuming again is a repeat.
    let Resumed::Done(d) = store.end_pause(2, EpochMs(4_000)).await.unwrap() else {
        panic!("resumed");
    };
    assert_eq!(
        d.current.map(|c| (c.version, c.announced_at)),
        Some((2, 4_000))
    );
    assert_eq!(d.pause, None);
    assert!(matches!(
        store.end_pause(2, EpochMs(5_000)).await.unwrap(),
        Resumed::Repeated(_)
    ));
    assert_eq!(store.recent_policies(1).await.unwrap()[0].version, 2);
    assert!(matches!(
        store
            .begin_pause(2, UpdateMode::Pause, EpochMs(5_000), EpochMs(9_000))
            .await
            .unwrap(),
        Pausing::Outdated(c) if c.version == 2
    ));
    // An update whose lease runs out is cleared without its version.
    store
        .begin_pause(3, UpdateMode::Pause, EpochMs(6_000), EpochMs(7_000))
        .await
        .unwrap();
    let expired = store
        .expire_pause(EpochMs(7_000))
        .await
        .unwrap()
        .expect("expired");
    assert_eq!((expired.version, expired.mode), (3, UpdateMode::Pause));
    let after = store.policy_state().await.unwrap();
    assert_eq!((after.version(), after.pause), (Some(2), None));
    assert_eq!(store.expire_pause(EpochMs(8_000)).await.unwrap(), None);
    // Concurrent updates to the same next version: exactly one starts it.
    let tries = futures::future::join_all((0..8).map(|_| {
        let store = f.store.clone();
        async move {
            store
                .begin_pause(4, UpdateMode::Wait, EpochMs(9_000), EpochMs(20_000))
                .await
                .unwrap()
        }
    }))
    .await;
    assert_eq!(
        tries
            .iter()
            .filter(|t| matches!(t, Pausing::Started(_)))
            .count(),
        1,
        "{tries:?}"
    );
}
