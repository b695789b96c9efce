//! Dynamic-sampling batches: exactly K informative groups are accepted and never a
//! uniform one, the rest of the batch is cancelled (each job with its result, running
//! stages stopped, EVAL skipped), counters stay right through a worker SIGKILL and a
//! gateway restart, launching never takes one prompt twice however many gateways
//! drive a batch, and a batch that runs out of prompts ends `exhausted`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use rollout::api::batches::BatchView;
use rollout::domain::EpochMs;
use rollout::domain::sampling::{SamplingParams, SamplingStatus};
use rollout::domain::{JobResult, Stage, Status};
use rollout::store::{NewSampling, Store};
use serde_json::{Value, json};

use crate::eventually::{eventually, holds};
use crate::helpers::{TestEnv, json_answer};

/// A prompt pool: `n` synthetic prompts whose pass rates cycle through `rates`.
pub(crate) fn prompts(n: usize, rates: &[f64], spec: &Value) -> Vec<Value> {
    (0..n)
        .map(|i| {
            let mut spec = spec.clone();
            spec["pass_rate"] = json!(rates[i % rates.len()]);
            json!({"kind": "synthetic", "spec": spec, "metadata": {"prompt": i}})
        })
        .collect()
}

/// `POST /v1/batches` with `body`: the status and the answer.
async fn post_batch(base: &str, body: &Value) -> (u16, Value) {
    json_answer(
        reqwest::Client::new()
            .post(format!("{base}/v1/batches"))
            .json(body),
        "create a sampling batch",
    )
    .await
}

async fn create(base: &str, body: &Value) -> BatchView {
    let (status, answer) = post_batch(base, body).await;
    assert_eq!(status, 201, "{answer}");
    serde_json::from_value(answer).unwrap()
}

async fn get(env: &TestEnv, id: &str) -> BatchView {
    env.client.sampling_batch(id).await.unwrap()
}

/// Waits until the batch has ended and every one of its jobs has its result.
pub(crate) async fn wait_settled(
    env: &TestEnv,
    id: &str,
    within: Duration,
) -> (BatchView, Vec<JobResult>) {
    eventually("the sampling batch ended", within, || async move {
        let v = get(env, id).await;
        holds(v.batch.status.is_final(), format!("{:?}", v.batch))
    })
    .await;
    let submitted = env
        .client
        .status(Some(id))
        .await
        .unwrap()
        .batch
        .unwrap()
        .submitted;
    let results = env
        .wait_results(id, usize::try_from(submitted).unwrap(), within)
        .await;
    // Every group out at the end has been decided (as cancelled, mostly).
    let view = eventually("every launched group was decided", within, || async move {
        let v = get(env, id).await;
        let c = &v.batch.counters;
        holds(c.groups_decided == c.groups_launched, format!("{c:?}"))?;
        Ok::<_, String>(v)
    })
    .await;
    (view, results)
}

/// What every settled batch must satisfy, whatever the draws: the accepted groups are
/// informative, ranked 1..=n, each with its G done results; the counters add up to
/// what the results say.
fn check_settled(view: &BatchView, results: &[JobResult]) {
    let b = &view.batch;
    let g = usize::try_from(b.params.group_size).unwrap();
    let ranks: Vec<i64> = view.groups.iter().map(|x| x.rank).collect();
    assert_eq!(
        ranks,
        (1..=i64::try_from(view.groups.len()).unwrap()).collect::<Vec<_>>()
    );
    assert_eq!(
        b.counters.informative,
        i64::try_from(view.groups.len()).unwrap()
    );
    for group in &view.groups {
        assert_eq!(group.results.len(), g, "group {} has G results", group.rank);
        let rewards: Vec<f64> = group
            .results
            .iter()
            .map(|r| {
                assert_eq!(r.status, Status::Done, "{r:?}");
                assert_eq!(r.group_id.as_deref(), Some(group.group_id.as_str()));
                r.reward.expect("a done sample has a reward")
            })
            .collect();
        assert!(
            rewards.iter().any(|r| *r != rewards[0]),
            "an accepted group is never uniform: {rewards:?}"
        );
    }
    // Results by group: each launched group has exactly G results, one per sample.
    let mut by_group: BTreeMap<&str, Vec<&JobResult>> = BTreeMap::new();
    for r in results {
        by_group
            .entry(r.group_id.as_deref().expect("sampling jobs have a group"))
            .or_default()
            .push(r);
    }
    assert_eq!(
        i64::try_from(by_group.len()).unwrap(),
        b.counters.groups_launched
    );
    let (mut uniform, mut informative, mut cancelled) = (0, 0, 0);
    for (group, rs) in &by_group {
        assert_eq!(rs.len(), g, "group {group}: one result per sample");
        let samples: BTreeSet<_> = rs.iter().map(|r| r.client_id.clone().unwrap()).collect();
        assert_eq!(samples.len(), g, "group {group}: no sample twice");
        if rs.iter().any(|r| r.status == Status::Cancelled) {
            cancelled += 1;
        } else if rs.iter().all(|r| r.reward == rs[0].reward) {
            uniform += 1;
        } else {
            informative += 1;
        }
    }
    let c = &b.counters;
    assert_eq!(c.uniform, uniform, "{c:?}");
    assert_eq!(c.informative + c.surplus, informative, "{c:?}");
    assert_eq!(c.cancelled_groups, cancelled, "{c:?}");
    assert_eq!(
        c.jobs_saved,
        i64::try_from(
            results
                .iter()
                .filter(|r| r.status == Status::Cancelled)
                .count()
        )
        .unwrap(),
        "{c:?}"
    );
    // Stamped on every job.
    for r in results {
        assert_eq!(
            r.output["metadata"]["policy_version"],
            json!(b.params.policy_version)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_k_informative_groups_are_accepted_and_the_rest_is_cancelled() {
    let env = TestEnv::start(|_| {}).await;
    env.workers_in_process(8);
    // Easy, hard and even prompts: easy and hard groups are mostly uniform. Long-tailed
    // RUN times leave stragglers out when the K-th group is accepted.
    let spec = json!({"run_ms": 100, "run_sigma": 1.0});
    let body = json!({
        "batch_id": "dapo",
        "prompts": prompts(60, &[0.5, 1.0, 0.0, 0.5], &spec),
        "group_size": 4,
        "target_groups": 4,
        "max_groups_in_flight": 6,
        "policy_version": 17,
    });
    let created = create(&env.base, &body).await;
    assert_eq!(created.batch.status, SamplingStatus::Running);
    assert_eq!(
        created.batch.counters.groups_launched, 6,
        "launched up to the in-flight limit"
    );
    // Repeating the request creates nothing.
    let again = create(&env.base, &body).await;
    assert!(again.duplicate);
    let (view, results) = wait_settled(&env, "dapo", Duration::from_secs(120)).await;
    assert_eq!(
        view.batch.status,
        SamplingStatus::Complete,
        "{:?}",
        view.batch
    );
    assert_eq!(view.groups.len(), 4, "exactly K groups");
    check_settled(&view, &results);
    // The rest of the batch was cancelled: nothing of it is left running, and no
    // cancelled job reached EVAL.
    let jobs = env
        .deps
        .store
        .list_jobs(&rollout::store::JobQuery {
            batch: Some("dapo".into()),
            status: None,
            cursor: None,
            limit: 10_000,
            max_bytes: i64::MAX,
        })
        .await
        .unwrap()
        .jobs;
    assert!(jobs.iter().all(|j| j.status.is_terminal()));
    // Sandbox time used is what the samples that ran to their end spent, INIT start to
    // result; the cancelled ones are counted as saved.
    let by_job: BTreeMap<&str, &JobResult> =
        results.iter().map(|r| (r.job_id.as_str(), r)).collect();
    let used: i64 = jobs
        .iter()
        .filter(|j| j.status == Status::Done)
        .map(|j| by_job[j.id.as_str()].created_at - j.timings.init.started_at.unwrap())
        .sum();
    let c = &view.batch.counters;
    assert_eq!(c.sandbox_ms_used, used, "{c:?}");
    assert!(used > 0, "{c:?}");
    assert_eq!(
        c.samples_completed,
        i64::try_from(jobs.iter().filter(|j| j.status == Status::Done).count()).unwrap()
    );
    // A cancelled sample saves what the mean finished sample took beyond what it had
    // already spent, never less than 0: stragglers older than the mean save nothing (on
    // a loaded machine that can be all of them), and no sample saves more than the
    // longest finished one took.
    let longest = jobs
        .iter()
        .filter(|j| j.status == Status::Done)
        .map(|j| by_job[j.id.as_str()].created_at - j.timings.init.started_at.unwrap())
        .max()
        .unwrap_or(0);
    assert!(c.sandbox_ms_saved >= 0, "{c:?}");
    assert!(c.sandbox_ms_saved <= c.jobs_saved * longest, "{c:?}");
    // A cancelled job went no further: no stage after the one it was cancelled in
    // started (EVAL is skipped for one cancelled in RUN), and the stages before it
    // started before the cancel. (The stage it was cancelled in may carry a start time a
    // few ms past the cancel's: each writer reads its clock before its statement reaches
    // the database, so a claim that committed first can hold the later time; the claim's
    // status check is what keeps a stage from starting after the cancel.)
    for j in jobs.iter().filter(|j| j.status == Status::Cancelled) {
        let t = &j.timings;
        for (stage, times) in [
            (Stage::Init, &t.init),
            (Stage::Run, &t.run),
            (Stage::Eval, &t.eval),
        ] {
            let order = |s: Stage| Stage::ALL.iter().position(|x| *x == s);
            if order(stage) > order(j.stage) {
                assert!(
                    times.started_at.is_none(),
                    "{stage} after the cancel: {j:?}"
                );
            }
            if order(stage) < order(j.stage) {
                assert!(
                    times.started_at <= j.finished_at,
                    "{stage} started after the cancel: {j:?}"
                );
            }
        }
    }
    // A replenished batch launches more than the first wave.
    assert!(view.batch.counters.groups_launched >= 6);
}

/// Accepted groups keep to the byte budget result pages have (`gateway.max_page_bytes`):
/// a page of `/groups` and the batch's own view stop at the group that reaches it (each
/// holds at least one group), the view says where the rest starts, and paging from
/// there returns every group once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_pages_and_the_batch_view_keep_to_the_page_byte_budget() {
    const MB: usize = 1 << 20;
    let budget = 3 * MB;
    let env = TestEnv::start(|s| s.gateway.max_page_bytes = budget as u64).await;
    env.workers_in_process(4);
    let body = json!({
        "batch_id": "heavy",
        "prompts": prompts(60, &[0.5], &json!({"run_ms": 5})),
        "group_size": 2,
        "target_groups": 4,
    });
    create(&env.base, &body).await;
    let (view, _) = wait_settled(&env, "heavy", Duration::from_secs(120)).await;
    assert_eq!(
        view.batch.status,
        SamplingStatus::Complete,
        "{:?}",
        view.batch
    );
    assert_eq!(view.groups.len(), 4);
    assert_eq!(view.more_groups_after, None);
    // Every result of the batch now records 1 MB: a group is 2 MB, two are over the
    // budget.
    let zeros = if env.deps.settings.database.url.starts_with("postgres") {
        format!("repeat('0', {MB})")
    } else {
        format!("hex(zeroblob({}))", MB / 2)
    };
    crate::helpers::sql(
        &env,
        &format!("UPDATE results SET output = '\"' || {zeros} || '\"' WHERE batch_id = 'heavy'"),
    )
    .await;
    let group_bytes = |g: &rollout::domain::sampling::AcceptedGroup| -> usize {
        g.results
            .iter()
            .map(|r| r.output.as_str().map_or(0, str::len))
            .sum()
    };
    let view = get(&env, "heavy").await;
    assert_eq!(
        view.groups.len(),
        2,
        "the view stops at the group that reaches the budget"
    );
    assert!(group_bytes(&view.groups[0]) < budget);
    assert_eq!(view.more_groups_after, Some(2));
    let mut ranks = Vec::new();
    let mut after = 0;
    let mut pages = 0;
    loop {
        let (status, page) = json_answer(
            reqwest::Client::new().get(format!(
                "{}/v1/batches/heavy/groups?after={after}&limit=256",
                env.base
            )),
            "a page of groups",
        )
        .await;
        assert_eq!(status, 200, "{page}");
        let page: rollout::api::batches::GroupPage = serde_json::from_value(page).unwrap();
        pages += 1;
        if page.groups.is_empty() {
            break;
        }
        let before_last: usize = page.groups[..page.groups.len() - 1]
            .iter()
            .map(group_bytes)
            .sum();
        assert!(before_last < budget, "page {pages}");
        ranks.extend(page.groups.iter().map(|g| g.rank));
        after = page.next_cursor;
        assert!(pages < 10, "the cursor does not advance");
    }
    assert_eq!(ranks, vec![1, 2, 3, 4]);
    assert_eq!(pages, 3, "two groups a page, then the empty one");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_that_runs_out_of_prompts_ends_exhausted() {
    let env = TestEnv::start(|_| {}).await;
    env.workers_in_process(4);
    // Every prompt always passes: every group is uniform.
    let body = json!({
        "batch_id": "too-easy",
        "prompts": prompts(10, &[1.0], &json!({"run_ms": 5})),
        "group_size": 3,
        "target_groups": 2,
        "max_groups": 5,
        "max_groups_in_flight": 2,
    });
    create(&env.base, &body).await;
    let (view, results) = wait_settled(&env, "too-easy", Duration::from_secs(60)).await;
    assert_eq!(
        view.batch.status,
        SamplingStatus::Exhausted,
        "{:?}",
        view.batch
    );
    assert!(view.batch.reason.as_deref().unwrap().contains("max_groups"));
    assert_eq!(
        view.batch.counters.groups_launched, 5,
        "max_groups prompts tried, no more"
    );
    assert_eq!(view.batch.counters.uniform, 5);
    assert!(view.groups.is_empty());
    assert_eq!(results.len(), 15);
    check_settled(&view, &results);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trainer_cancel_stops_queued_and_running_samples_each_with_its_result() {
    let env = TestEnv::start(|_| {}).await;
    // One RUN worker slot: most samples wait in RUN's queue, one runs (for a minute).
    env.stage_workers_in_process(Stage::Init, 4);
    env.stage_workers_in_process(Stage::Eval, 1);
    env.stage_workers_with(Stage::Run, 1, env.shutdown.clone());
    let body = json!({
        "batch_id": "stopped",
        "prompts": prompts(4, &[0.5], &json!({"run_ms": 60_000})),
        "group_size": 2,
        "target_groups": 2,
        "max_groups_in_flight": 4,
    });
    create(&env.base, &body).await;
    // Wait for a sample to be running in RUN.
    eventually("a sample is in RUN", Duration::from_secs(30), || async {
        let counts = env.client.status(Some("stopped")).await.unwrap();
        let running = counts
            .counts
            .iter()
            .any(|c| c.stage == Stage::Run && c.status == Status::Running);
        holds(running, format!("{:?}", counts.counts))
    })
    .await;
    let (status, answer) = json_answer(
        reqwest::Client::new().post(format!("{}/v1/batches/stopped/cancel", env.base)),
        "cancel the batch",
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    let (view, results) = wait_settled(&env, "stopped", Duration::from_secs(30)).await;
    assert_eq!(view.batch.status, SamplingStatus::Cancelled);
    assert_eq!(results.len(), 8);
    assert!(
        results.iter().all(|r| r.status == Status::Cancelled),
        "{results:?}"
    );
    assert_eq!(view.batch.counters.jobs_saved, 8);
    assert_eq!(view.batch.counters.cancelled_groups, 4);
    // A second cancel is refused: the batch already ended.
    let (status, _) = json_answer(
        reqwest::Client::new().post(format!("{}/v1/batches/stopped/cancel", env.base)),
        "cancel again",
    )
    .await;
    assert_eq!(status, 409);
    // The running sample's worker stopped: the work stream drains and no job is live.
    env.wait_work_drained().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_stay_right_through_a_worker_sigkill_and_a_gateway_restart() {
    let mut env = TestEnv::start(|_| {}).await;
    env.stage_workers_in_process(Stage::Init, 4);
    env.stage_workers_in_process(Stage::Eval, 4);
    let killed = env.spawn_worker_process(Stage::Run);
    let spec = json!({"run_ms": 300, "run_sigma": 0.5});
    let body = json!({
        "batch_id": "survivor",
        "prompts": prompts(40, &[0.5, 1.0], &spec),
        "group_size": 4,
        "target_groups": 5,
        "max_groups_in_flight": 4,
    });
    create(&env.base, &body).await;
    // Mid-batch: some groups decided, none complete yet.
    eventually("a group was decided", Duration::from_secs(60), || async {
        let v = get(&env, "survivor").await;
        holds(
            v.batch.counters.groups_decided >= 1,
            format!("{:?}", v.batch.counters),
        )
    })
    .await;
    env.signal_worker(killed, nix::sys::signal::Signal::SIGKILL);
    env.restart_gateway().await;
    // Another RUN worker takes over the killed one's samples once their leases lapse.
    env.spawn_worker_process(Stage::Run);
    let (view, results) = wait_settled(&env, "survivor", Duration::from_secs(180)).await;
    assert_eq!(
        view.batch.status,
        SamplingStatus::Complete,
        "{:?}",
        view.batch
    );
    assert_eq!(view.groups.len(), 5);
    check_settled(&view, &results);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_never_launch_one_prompt_twice() {
    let env = TestEnv::start(|_| {}).await;
    let second = env.extra_gateway().await;
    env.workers_in_process(4);
    let body = json!({
        "batch_id": "shared",
        "prompts": prompts(30, &[0.5, 0.0], &json!({"run_ms": 20})),
        "group_size": 3,
        "target_groups": 6,
        "max_groups_in_flight": 5,
    });
    // Both gateways get the request (a trainer retrying against another one): one
    // batch, and both drivers and reconcilers act on it from then on.
    let (a, b) = tokio::join!(create(&env.base, &body), create(&second, &body));
    assert_ne!(
        a.duplicate, b.duplicate,
        "exactly one request created the batch"
    );
    let (view, results) = wait_settled(&env, "shared", Duration::from_secs(120)).await;
    check_settled(&view, &results);
    // Launching many times at once from two stores (as two gateways' drivers would)
    // never takes a prompt twice.
    let other = rollout::store::connect(&env.deps.settings.database.url, 4)
        .await
        .unwrap();
    let new = NewSampling {
        id: "race".into(),
        params: SamplingParams {
            group_size: 2,
            target_groups: 3,
            max_groups_in_flight: 50,
            max_groups: 50,
            informative: Default::default(),
            policy_version: None,
            on_cancel: Default::default(),
            carry_from: None,
        },
        prompts: (0..50)
            .map(|i| json!({"kind": "synthetic", "spec": {"seed": i}}))
            .collect(),
    };
    env.deps
        .store
        .create_sampling(&new, EpochMs::now())
        .await
        .unwrap();
    // Both connections race, each launching many times at once.
    let mut launches = Vec::new();
    for i in 0..16 {
        let store = if i % 2 == 0 {
            env.deps.store.clone()
        } else {
            other.clone()
        };
        launches.push(tokio::spawn(async move {
            store.launch_groups("race", EpochMs::now()).await.unwrap()
        }));
    }
    let mut ids = BTreeSet::new();
    let mut client_ids = BTreeSet::new();
    for l in launches {
        for s in l.await.unwrap() {
            assert!(!s.duplicate);
            assert!(ids.insert(s.id));
            assert!(client_ids.insert(s.client_id.unwrap()));
        }
    }
    assert_eq!(ids.len(), 100, "all 50 prompts launched, each once, G = 2");
    let race = env
        .deps
        .store
        .sampling_batch("race")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(race.counters.groups_launched, 50);
    let counts = env.deps.store.batch("race").await.unwrap().unwrap();
    assert_eq!(counts.submitted, 100);
    publisher_lease_is_held_by_one_driver(env.deps.store.as_ref(), other.as_ref(), "race").await;
}

/// One group publisher per batch across gateways (stores `a` and `b`): a second driver
/// is refused while the lease holds, takes over once it has lapsed, and the first one's
/// late release does not free the lease its successor holds.
async fn publisher_lease_is_held_by_one_driver(a: &dyn Store, b: &dyn Store, id: &str) {
    let t = 1_000_000;
    assert!(
        a.claim_group_publisher(id, EpochMs(t), EpochMs(t + 30_000))
            .await
            .unwrap()
    );
    assert!(
        !b.claim_group_publisher(id, EpochMs(t + 1), EpochMs(t + 30_001))
            .await
            .unwrap()
    );
    assert!(
        b.claim_group_publisher(id, EpochMs(t + 30_000), EpochMs(t + 60_000))
            .await
            .unwrap()
    );
    a.release_group_publisher(id, EpochMs(t + 30_000))
        .await
        .unwrap();
    assert!(
        !a.claim_group_publisher(id, EpochMs(t + 30_001), EpochMs(t + 60_001))
            .await
            .unwrap()
    );
    b.release_group_publisher(id, EpochMs(t + 60_000))
        .await
        .unwrap();
    assert!(
        a.claim_group_publisher(id, EpochMs(t + 30_002), EpochMs(t + 60_002))
            .await
            .unwrap()
    );
}

/// A patch whose pool is three prompts, the first one `bad`.
fn with_first(bad: Value) -> Value {
    let mut pool = prompts(3, &[0.5], &json!({}));
    pool[0] = bad;
    json!({"prompts": pool})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_batch_requests_name_their_field() {
    let env = TestEnv::start(|_| {}).await;
    let ok = json!({
        "prompts": prompts(3, &[0.5], &json!({})),
        "group_size": 2,
        "target_groups": 2,
    });
    let cases = [
        (json!({"group_size": 1}), "group_size"),
        (json!({"target_groups": 4}), "target_groups"),
        (json!({"max_groups": 1}), "target_groups"),
        (json!({"max_groups_in_flight": 0}), "max_groups_in_flight"),
        (
            json!({"informative": {"rule": "reward_std", "eps": -1}}),
            "informative.eps",
        ),
        (
            json!({"informative": {"min_mean": 0.9, "max_mean": 0.1}}),
            "informative.min_mean",
        ),
        (
            json!({"informative": {"rule": "vibes"}}),
            "informative.rule",
        ),
        (
            with_first(json!({"kind": "synthetic", "client_id": "x"})),
            "prompts[0].client_id",
        ),
        (with_first(json!({"kind": "nope"})), "prompts[0].kind"),
        (
            with_first(json!({"kind": "synthetic", "spec": {"pass_rate": 3}})),
            "prompts[0].spec.pass_rate",
        ),
        (json!({"prompts": []}), "prompts"),
        (json!({"batch_id": "a b"}), "batch_id"),
        (json!({"unknown": 1}), "."),
    ];
    for (patch, field) in cases {
        let mut body = ok.clone();
        for (k, v) in patch.as_object().unwrap() {
            body[k] = v.clone();
        }
        let (status, answer) = post_batch(&env.base, &body).await;
        assert_eq!(status, 400, "{patch}: {answer}");
        if field != "." {
            assert_eq!(answer["field"], json!(field), "{patch}: {answer}");
        }
    }
    // Nothing was written: no sampling batch to drive.
    assert!(env.deps.store.sampling_to_drive().await.unwrap().is_empty());
    // A plain batch's id cannot become a sampling batch's.
    env.submit(&[crate::helpers::synthetic(json!({}))], "plain")
        .await;
    let mut body = ok.clone();
    body["batch_id"] = json!("plain");
    let (status, answer) = post_batch(&env.base, &body).await;
    assert_eq!(status, 409, "{answer}");
}

/// The verdicts as the store takes them, with rewards chosen by the test: groups that
/// finish after the K-th acceptance are surplus, never accepted; a failed sample makes
/// its group incomplete; a verdict is taken once, by the group's last result; the K-th
/// acceptance completes the batch in its own transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verdicts_are_taken_once_by_the_last_result_and_never_past_k() {
    use rollout::domain::Outcome;
    use rollout::domain::sampling::Verdict;
    use rollout::store::FinishIf;
    let env = TestEnv::start(|s| s.reconciler.enabled = false).await;
    let store = env.deps.store.clone();
    let new = NewSampling {
        id: "verdicts".into(),
        params: SamplingParams {
            group_size: 2,
            target_groups: 2,
            max_groups_in_flight: 6,
            max_groups: 6,
            informative: Default::default(),
            policy_version: Some(3),
            on_cancel: Default::default(),
            carry_from: None,
        },
        prompts: (0..6)
            .map(|i| json!({"kind": "synthetic", "spec": {"seed": i}}))
            .collect(),
    };
    store.create_sampling(&new, EpochMs::now()).await.unwrap();
    let jobs = store
        .launch_groups("verdicts", EpochMs::now())
        .await
        .unwrap();
    assert_eq!(jobs.len(), 12);
    // A second launch finds no room: six groups are in flight.
    assert!(
        store
            .launch_groups("verdicts", EpochMs::now())
            .await
            .unwrap()
            .is_empty()
    );
    let id = |p: usize, s: usize| jobs[p * 2 + s].id.clone();
    let end = |job: String, outcome: Outcome| {
        let store = store.clone();
        async move {
            store
                .finish(&FinishIf::Live, &job, &outcome, EpochMs::now())
                .await
                .unwrap()
                .expect("the job was live")
        }
    };
    let done = |r: f64| Outcome::done(r, json!({}));
    // p0: uniform. Its first sample decides nothing; its last does.
    assert!(end(id(0, 0), done(1.0)).await.decided.is_none());
    let d = end(id(0, 1), done(1.0)).await.decided.unwrap();
    assert_eq!((d.verdict, d.accepted_rank), (Verdict::Uniform, None));
    // p1: a failed sample: incomplete, even though the other has a reward.
    end(id(1, 0), done(1.0)).await;
    let d = end(id(1, 1), Outcome::failed("boom"))
        .await
        .decided
        .unwrap();
    assert_eq!(d.verdict, Verdict::Incomplete);
    // p2, p3: informative, accepted as ranks 1 and 2; the second completes the batch.
    end(id(2, 0), done(0.0)).await;
    let d = end(id(2, 1), done(1.0)).await.decided.unwrap();
    assert_eq!(
        (d.verdict, d.accepted_rank, d.batch_status),
        (Verdict::Informative, Some(1), SamplingStatus::Running)
    );
    end(id(3, 0), done(1.0)).await;
    let d = end(id(3, 1), done(0.0)).await.decided.unwrap();
    assert_eq!(
        (d.accepted_rank, d.batch_status),
        (Some(2), SamplingStatus::Complete)
    );
    // p4: informative too, but decided after the batch had its K: surplus.
    end(id(4, 0), done(0.0)).await;
    let d = end(id(4, 1), done(0.5)).await.decided.unwrap();
    assert_eq!((d.verdict, d.accepted_rank), (Verdict::Informative, None));
    // p5: cancelled (what early cancel does).
    end(id(5, 0), Outcome::cancelled("not needed")).await;
    let d = end(id(5, 1), Outcome::cancelled("not needed"))
        .await
        .decided
        .unwrap();
    assert_eq!(d.verdict, Verdict::Cancelled);
    check_verdict_counters(store.as_ref()).await;
}

/// What `verdicts_are_taken_once_by_the_last_result_and_never_past_k` left: a complete
/// batch, its counters, and the two accepted groups in rank order.
async fn check_verdict_counters(store: &dyn rollout::store::Store) {
    // Nothing more is launched for an ended batch.
    assert!(
        store
            .launch_groups("verdicts", EpochMs::now())
            .await
            .unwrap()
            .is_empty()
    );
    let b = store.sampling_batch("verdicts").await.unwrap().unwrap();
    let c = &b.counters;
    assert_eq!(b.status, SamplingStatus::Complete);
    assert_eq!(
        (
            c.groups_launched,
            c.groups_decided,
            c.informative,
            c.surplus,
            c.uniform,
            c.incomplete,
            c.cancelled_groups,
            c.jobs_saved
        ),
        (6, 6, 2, 1, 1, 1, 1, 2)
    );
    let accepted = store
        .accepted_groups("verdicts", 0, 10, i64::MAX)
        .await
        .unwrap();
    let names: Vec<_> = accepted
        .iter()
        .map(|g| (g.rank, g.group_id.as_str()))
        .collect();
    assert_eq!(names, [(1, "p2"), (2, "p3")]);
    assert_eq!(accepted[0].reward_mean, Some(0.5));
    assert_eq!(accepted[0].results.len(), 2);
    assert_eq!(
        accepted[0].results[0].output["metadata"]["policy_version"],
        json!(3)
    );
}

/// Asserts that nothing of batch `id` was scored after its cancel: in result order
/// (`seq`, the order the ends committed), no `done` result follows a `cancelled` one,
/// and every job that had not ended by then ended `cancelled`. Returns how many were
/// done and how many cancelled.
fn nothing_scored_after_the_cancel(id: &str, results: &[JobResult]) -> (usize, usize) {
    let mut sorted: Vec<&JobResult> = results.iter().collect();
    sorted.sort_by_key(|r| r.seq);
    let first_cancel = sorted
        .iter()
        .position(|r| r.status == Status::Cancelled)
        .unwrap_or(sorted.len());
    let late: Vec<String> = sorted[first_cancel..]
        .iter()
        .filter(|r| r.status != Status::Cancelled)
        .map(|r| format!("{} {:?} seq {}", r.job_id, r.status, r.seq))
        .collect();
    assert!(
        late.is_empty(),
        "{id}: {} jobs ended otherwise after the cancel's first: {late:?}",
        late.len()
    );
    (first_cancel, sorted.len() - first_cancel)
}

/// A cancel under load (64 samples in flight, each finishing RUN and EVAL within a few
/// hundred ms, so ends race the cancel) answers at once with how many jobs it is
/// cancelling, and nothing of the batch is scored after it: the batch's end is a fence
/// in the database, however long the cancelling of its jobs takes. The same for a plain
/// batch, which then takes no more jobs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_under_load_lets_nothing_of_the_batch_be_scored_after_it() {
    let env = TestEnv::start(|_| {}).await;
    env.workers_in_process(64);
    let spec = json!({"run_ms": 150, "run_sigma": 0.6, "eval_ms": 50});
    // One prompt's samples (and one plain job) never finish RUN: whatever the load,
    // the cancel finds work of each batch still running, and cancels it; the rest race
    // the cancel.
    let mut busy = prompts(400, &[0.5], &spec);
    busy[0]["spec"]["hang_in"] = json!("run");
    let body = json!({
        "batch_id": "busy",
        "prompts": busy,
        "group_size": 4,
        "target_groups": 400,
        "max_groups_in_flight": 16,
    });
    create(&env.base, &body).await;
    let mut tasks: Vec<_> = (0..64)
        .map(|_| crate::helpers::synthetic(spec.clone()))
        .collect();
    tasks[0].spec["hang_in"] = json!("run");
    env.submit(&tasks, "plain").await;
    // Let both batches get going: results arriving, more in flight.
    eventually(
        "both batches have results",
        Duration::from_secs(60),
        || async {
            let s = env
                .client
                .status(Some("busy"))
                .await
                .unwrap()
                .batch
                .unwrap();
            let p = env
                .client
                .status(Some("plain"))
                .await
                .unwrap()
                .batch
                .unwrap();
            holds(s.finished >= 16 && p.finished >= 4, format!("{s:?} {p:?}"))
        },
    )
    .await;

    let (status, answer) = json_answer(
        reqwest::Client::new().post(format!("{}/v1/batches/busy/cancel", env.base)),
        "cancel the sampling batch",
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["batch"]["status"], "cancelled", "{answer}");
    assert!(answer["cancelling"].as_i64().unwrap() > 0, "{answer}");
    let asked_at = EpochMs::now().0;
    let (status, answer) = json_answer(
        reqwest::Client::new().post(format!("{}/v1/batches/plain/cancel", env.base)),
        "cancel the plain batch",
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        answer["batch"]["end_reason"], "the batch was cancelled",
        "{answer}"
    );
    let cancelling = answer["cancelling"].as_i64().unwrap();
    let (status, _) = json_answer(
        reqwest::Client::new().post(format!("{}/v1/batches/plain/cancel", env.base)),
        "cancel it again",
    )
    .await;
    assert_eq!(status, 409);
    // The plain batch takes no more jobs.
    let (status, answer) = json_answer(
        reqwest::Client::new()
            .post(format!("{}/v1/jobs", env.base))
            .json(&json!({"batch_id": "plain", "tasks": [crate::helpers::synthetic(json!({}))]})),
        "submit to the cancelled batch",
    )
    .await;
    assert_eq!(
        (status, answer["field"].as_str()),
        (409, Some("batch_id")),
        "{answer}"
    );

    let (view, results) = wait_settled(&env, "busy", Duration::from_secs(120)).await;
    assert_eq!(view.batch.status, SamplingStatus::Cancelled);
    let (done, cancelled) = nothing_scored_after_the_cancel("busy", &results);
    assert!(
        done > 0 && cancelled > 0,
        "{done} done, {cancelled} cancelled"
    );
    let plain = env
        .wait_results("plain", 64, Duration::from_secs(120))
        .await;
    let (done, cancelled) = nothing_scored_after_the_cancel("plain", &plain);
    assert!(done > 0, "{done} done");
    // Every job live at the answer ended cancelled, but for those whose end was being
    // written as the cancel came (their `done` decided before the batch's end
    // committed, and stamped before it): they may be counted live by the answer's
    // read of the counters. Those ends are stamped around the request.
    let raced = plain
        .iter()
        .filter(|r| r.status == Status::Done && r.created_at >= asked_at - 2_000)
        .count();
    assert!(
        i64::try_from(cancelled + raced).unwrap() >= cancelling,
        "{cancelled} cancelled and {raced} ended around the cancel, {cancelling} live at the cancel"
    );
    // No cancelled job reached EVAL after the cancel, and nothing is left running.
    env.wait_work_drained().await;
}

/// A sampling batch of `prompts` synthetic prompts, G = 2, K = `target`, all groups in
/// flight at once, created and launched through the store: its jobs by group and
/// sample (`jobs[p * 2 + s]`).
async fn launched(
    store: &dyn Store,
    id: &str,
    prompts: i64,
    target: i64,
    on_cancel: rollout::domain::sampling::OnCancel,
) -> Vec<String> {
    let new = NewSampling {
        id: id.into(),
        params: SamplingParams {
            group_size: 2,
            target_groups: target,
            max_groups_in_flight: prompts,
            max_groups: prompts,
            informative: Default::default(),
            policy_version: None,
            on_cancel,
            carry_from: None,
        },
        prompts: (0..prompts)
            .map(|i| json!({"kind": "synthetic", "spec": {"seed": i}}))
            .collect(),
    };
    store.create_sampling(&new, EpochMs::now()).await.unwrap();
    let jobs = store.launch_groups(id, EpochMs::now()).await.unwrap();
    assert_eq!(jobs.len(), usize::try_from(prompts * 2).unwrap());
    jobs.into_iter().map(|s| s.id).collect()
}

/// Ends job `id` with `outcome` through the store; what its end decided.
async fn end_job(
    store: &dyn Store,
    id: &str,
    outcome: rollout::domain::Outcome,
) -> Option<rollout::store::Decided> {
    store
        .finish(
            &rollout::store::FinishIf::Live,
            id,
            &outcome,
            EpochMs::now(),
        )
        .await
        .unwrap()
        .expect("the job was live")
        .decided
}

/// Partial rollouts across batches: a `keep` batch that reaches its K keeps the groups
/// still running (none cancelled; counted as kept), and the next batch, created with
/// `carry_from`, adopts them. One that ended before the adoption is decided there at
/// once, one that ends after is decided there by its last sample; both count toward
/// the adopter's K and come with its groups (`carried_from`), their jobs and results
/// staying in the batch that launched them. A kept group is adopted once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kept_groups_are_adopted_and_decided_by_the_next_batch() {
    use rollout::domain::Outcome;
    use rollout::domain::sampling::{OnCancel, Verdict};
    let env = TestEnv::start(|s| s.reconciler.enabled = false).await;
    let store = env.deps.store.clone();
    let done = |r: f64| Outcome::done(r, json!({}));
    let a = launched(store.as_ref(), "keep-a", 3, 1, OnCancel::Keep).await;
    // p0 is informative: the batch has its K, and p1 and p2 are still running.
    end_job(store.as_ref(), &a[0], done(0.0)).await;
    let d = end_job(store.as_ref(), &a[1], done(1.0)).await.unwrap();
    assert_eq!(d.batch_status, SamplingStatus::Complete);
    let kept = get(&env, "keep-a").await.batch;
    assert_eq!(kept.params.on_cancel, OnCancel::Keep);
    let c = &kept.counters;
    assert_eq!(
        (
            c.groups_launched,
            c.groups_decided,
            c.kept_groups,
            c.jobs_saved
        ),
        (3, 3, 2, 0),
        "{c:?}"
    );
    // Nothing of the kept groups is cancelled, by the driver or anyone.
    assert_eq!(store.live_jobs("keep-a", 100).await.unwrap().len(), 4);
    // p1 ends before any batch adopts it: its verdict waits.
    end_job(store.as_ref(), &a[2], done(1.0)).await;
    assert!(end_job(store.as_ref(), &a[3], done(0.0)).await.is_none());
    let b = create(
        &env.base,
        &json!({
            "batch_id": "keep-b", "group_size": 2, "target_groups": 2,
            "max_groups_in_flight": 3, "carry_from": "keep-a",
            "prompts": [{"kind": "synthetic", "spec": {"seed": 7}},
                        {"kind": "synthetic", "spec": {"seed": 8}}],
        }),
    )
    .await;
    let c = &b.batch.counters;
    assert_eq!(b.batch.params.carry_from.as_deref(), Some("keep-a"));
    // p1 was decided at the adoption (accepted, rank 1); p2 runs on in the adopter,
    // beside its own groups (room for 3 in flight: 2 of its own).
    assert_eq!(
        (
            c.adopted_groups,
            c.informative,
            c.groups_launched,
            c.groups_decided
        ),
        (2, 1, 4, 1),
        "{c:?}"
    );
    assert_eq!(b.groups.len(), 1);
    let g = &b.groups[0];
    assert_eq!(
        (
            g.rank,
            g.carried_from.as_deref(),
            g.group_id.as_str(),
            g.prompt_index
        ),
        (1, Some("keep-a"), "p1", 1)
    );
    assert_eq!(g.results.len(), 2);
    assert!(g.results.iter().all(|r| r.batch_id == "keep-a"));
    // p2's last sample decides it in the adopter: its K-th group.
    end_job(store.as_ref(), &a[4], done(0.0)).await;
    let d = end_job(store.as_ref(), &a[5], done(1.0)).await.unwrap();
    assert_eq!(
        (
            d.batch_id.as_str(),
            d.verdict,
            d.accepted_rank,
            d.batch_status
        ),
        (
            "keep-b",
            Verdict::Informative,
            Some(2),
            SamplingStatus::Complete
        )
    );
    // The adopter discards its own groups still running, as any batch does, once woken
    // (a worker recording the end would wake it).
    env.deps.queue.publish_wake(&d.batch_id).await.unwrap();
    let (view, _) = wait_settled(&env, "keep-b", Duration::from_secs(30)).await;
    let names: Vec<_> = view
        .groups
        .iter()
        .map(|g| (g.rank, g.carried_from.clone(), g.group_id.clone()))
        .collect();
    assert_eq!(
        names,
        [
            (1, Some("keep-a".to_string()), "p1".to_string()),
            (2, Some("keep-a".to_string()), "p2".to_string())
        ]
    );
    // The launching batch's own counters and results are untouched by the adoption.
    let kept = get(&env, "keep-a").await.batch;
    assert_eq!(kept.counters.kept_groups, 2);
    assert!(store.live_jobs("keep-a", 100).await.unwrap().is_empty());
    adopted_once_and_carry_from_checked(&env).await;
}

/// What `kept_groups_are_adopted_and_decided_by_the_next_batch` checks last: batch
/// `keep-a`'s kept groups, adopted already, are not adopted again, and `carry_from`
/// must name another sampling batch.
async fn adopted_once_and_carry_from_checked(env: &TestEnv) {
    let again = create(
        &env.base,
        &json!({
            "batch_id": "keep-c", "group_size": 2, "target_groups": 1,
            "carry_from": "keep-a", "prompts": [{"kind": "synthetic", "spec": {"seed": 9}}],
        }),
    )
    .await;
    assert_eq!(again.batch.counters.adopted_groups, 0);
    // carry_from must name another sampling batch.
    for (from, why) in [("nope", "no sampling batch"), ("keep-d", "itself")] {
        let (status, answer) = post_batch(
            &env.base,
            &json!({
                "batch_id": "keep-d", "group_size": 2, "target_groups": 1,
                "carry_from": from, "prompts": [{"kind": "synthetic", "spec": {}}],
            }),
        )
        .await;
        assert_eq!(status, 400, "{answer}");
        assert_eq!(answer["field"], "carry_from", "{answer}");
        assert!(answer["error"].as_str().unwrap().contains(why), "{answer}");
    }
}

/// A trainer's cancel of a `keep` batch cancels nothing: its groups run on, unfenced
/// (a sample that ends after the cancel is scored), for a later batch to adopt; a
/// cancel of that adopter cancels the adopted samples still running, each with its
/// result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_keep_batch_keeps_its_groups_and_its_adopters_cancel_ends_them() {
    use rollout::domain::Outcome;
    use rollout::domain::sampling::OnCancel;
    let env = TestEnv::start(|s| s.reconciler.enabled = false).await;
    let store = env.deps.store.clone();
    let x = launched(store.as_ref(), "kc-x", 2, 2, OnCancel::Keep).await;
    let cancelled = env.client.cancel_batch("kc-x").await.unwrap();
    let cancelled = serde_json::to_value(&cancelled).unwrap();
    assert_eq!(cancelled["cancelling"], 0, "{cancelled}");
    let view = get(&env, "kc-x").await.batch;
    assert_eq!(view.status, SamplingStatus::Cancelled);
    assert_eq!(view.counters.kept_groups, 2);
    // No fence: a sample ending now is scored.
    end_job(store.as_ref(), &x[0], Outcome::done(1.0, json!({}))).await;
    let r = store.result(&x[0]).await.unwrap().unwrap();
    assert_eq!((r.status, r.reward), (Status::Done, Some(1.0)));
    let y = create(
        &env.base,
        &json!({
            "batch_id": "kc-y", "group_size": 2, "target_groups": 1,
            "max_groups_in_flight": 2, "carry_from": "kc-x",
            "prompts": [{"kind": "synthetic", "spec": {"seed": 1}}],
        }),
    )
    .await;
    assert_eq!(y.batch.counters.adopted_groups, 2);
    env.client.cancel_batch("kc-y").await.unwrap();
    // The adopted samples still running end cancelled, each with its result.
    eventually(
        "the adopted samples to be cancelled",
        Duration::from_secs(30),
        || {
            let store = store.clone();
            let x = x.clone();
            async move {
                let mut statuses = Vec::new();
                for id in &x[1..] {
                    statuses.push(store.result(id).await.unwrap().map(|r| r.status));
                }
                holds(
                    statuses.iter().all(|s| *s == Some(Status::Cancelled)),
                    format!("{statuses:?}"),
                )
            }
        },
    )
    .await;
    let y = get(&env, "kc-y").await.batch;
    assert_eq!(
        y.counters.groups_decided, y.counters.groups_launched,
        "{y:?}"
    );
}
