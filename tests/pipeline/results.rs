//! Result delivery: long-poll and Server-Sent Events, each result once, in a stable order,
//! across reconnects.

use crate::eventually::{eventually, holds};
use std::time::Duration;

use futures::StreamExt;
use rollout::api::results::ResultPage;

use crate::helpers::{TestEnv, synthetic};

const N: usize = 60;

async fn submit_spread(env: &TestEnv, batch: &str) -> Vec<String> {
    let tasks: Vec<_> = (0..N)
        .map(|i| synthetic(serde_json::json!({"run_ms": (i * 37) % 300, "seed": i})))
        .collect();
    env.submit(&tasks, batch).await
}

/// Long-poll in pages of 7, a new request (as a reconnect would be) each time, started
/// while jobs are still running: every result exactly once, in increasing `seq`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_poll_delivers_every_result_once_in_order() {
    let env = TestEnv::start(|_| {}).await;
    env.workers_in_process(1);
    let ids = submit_spread(&env, "lp").await;
    // Another batch interleaves results that the batch filter must skip.
    submit_spread(&env, "noise").await;
    let http = reqwest::Client::new();
    let mut after = 0i64;
    let mut got = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while got.len() < N {
        assert!(
            tokio::time::Instant::now() < deadline,
            "only {} results",
            got.len()
        );
        let page: ResultPage = http
            .get(format!(
                "{}/v1/results?batch=lp&after={after}&limit=7&wait_ms=2000",
                env.base
            ))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert!(page.results.len() <= 7);
        if let Some(last) = page.results.last() {
            assert_eq!(page.next_cursor, last.seq);
        } else {
            assert_eq!(page.next_cursor, after);
        }
        after = page.next_cursor;
        got.extend(page.results);
    }
    let seqs: Vec<i64> = got.iter().map(|r| r.seq).collect();
    assert!(
        seqs.windows(2).all(|w| w[0] < w[1]),
        "not strictly increasing: {seqs:?}"
    );
    assert!(got.iter().all(|r| r.batch_id == "lp"));
    let mut job_ids: Vec<_> = got.iter().map(|r| r.job_id.clone()).collect();
    job_ids.sort();
    let mut want = ids.clone();
    want.sort();
    assert_eq!(job_ids, want);
    // Nothing more after the end, and an empty wait returns promptly with the same cursor.
    let page = env.client.results(Some("lp"), after, 300).await.unwrap();
    assert!(page.results.is_empty());
    assert_eq!(page.next_cursor, after);
    // Reading again from 0 gives the same order.
    let again: ResultPage = http
        .get(format!("{}/v1/results?batch=lp&limit=1000", env.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        again.results.iter().map(|r| r.seq).collect::<Vec<_>>(),
        seqs
    );
}

/// Reads `count` SSE `result` events, resuming after `last_id`, then drops the connection.
async fn read_sse(
    base: &str,
    last_id: Option<i64>,
    count: usize,
) -> Vec<(i64, rollout::domain::JobResult)> {
    let mut req = reqwest::Client::new().get(format!("{base}/v1/results/stream?batch=sse"));
    if let Some(id) = last_id {
        req = req.header("Last-Event-ID", id.to_string());
    }
    let resp = req.send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    assert!(
        resp.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let mut body = resp.bytes_stream();
    let mut buf = String::new();
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while out.len() < count {
        let chunk = tokio::time::timeout_at(deadline, body.next())
            .await
            .expect("SSE stream stalled")
            .expect("SSE stream ended")
            .unwrap();
        buf.push_str(std::str::from_utf8(&chunk).unwrap());
        while let Some(end) = buf.find("\n\n") {
            let event: String = buf.drain(..end + 2).collect();
            let mut id = None;
            let mut data = String::new();
            let mut kind = None;
            for line in event.lines() {
                if let Some(v) = line.strip_prefix("id:") {
                    id = Some(v.trim().parse::<i64>().unwrap());
                } else if let Some(v) = line.strip_prefix("data:") {
                    data.push_str(v.trim_start());
                } else if let Some(v) = line.strip_prefix("event:") {
                    kind = Some(v.trim().to_string());
                }
            }
            if kind.as_deref() == Some("result") {
                let r: rollout::domain::JobResult = serde_json::from_str(&data).unwrap();
                assert_eq!(Some(r.seq), id, "event id is the result's seq");
                out.push((r.seq, r));
                if out.len() == count {
                    break;
                }
            }
        }
    }
    out
}

/// SSE: read some events, disconnect, reconnect with `Last-Event-ID` — twice — and get
/// every result once, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_stream_resumes_after_reconnect_without_loss_or_repeat() {
    let env = TestEnv::start(|_| {}).await;
    env.workers_in_process(1);
    let ids = submit_spread(&env, "sse").await;
    let mut got = read_sse(&env.base, None, 15).await;
    let more = read_sse(&env.base, Some(got.last().unwrap().0), 20).await;
    got.extend(more);
    let rest = read_sse(&env.base, Some(got.last().unwrap().0), N - 35).await;
    got.extend(rest);
    let seqs: Vec<i64> = got.iter().map(|(s, _)| *s).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    let mut job_ids: Vec<_> = got.iter().map(|(_, r)| r.job_id.clone()).collect();
    job_ids.sort();
    let mut want = ids;
    want.sort();
    assert_eq!(job_ids, want);
}

/// Pages stop at `gateway.max_page_bytes` as well as at `limit` (a page of huge results
/// cannot fill the gateway's memory), always hold at least one result, and chain by
/// cursor to every result exactly once; the stream reads in the same bounded pages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_stop_at_a_byte_budget() {
    let env = TestEnv::start(|s| s.gateway.max_page_bytes = 100_000).await;
    env.workers_in_process(1);
    // Each result carries its task's ~60 KB of metadata: two fit a page, three do not.
    let big = "x".repeat(60_000);
    let tasks: Vec<_> = (0..5)
        .map(|i| {
            let mut t = synthetic(serde_json::json!({"seed": i}));
            t.metadata = serde_json::json!({"blob": big});
            t
        })
        .collect();
    env.submit(&tasks, "big").await;
    // Everything ended before the first page is read.
    eventually("all five jobs ended", Duration::from_secs(30), || async {
        let s = env.client.status(Some("big")).await.unwrap();
        holds(s.batch.as_ref().is_some_and(|b| b.finished == 5), s.batch)
    })
    .await;
    let mut after = 0;
    let mut seen = Vec::new();
    loop {
        let page = env.client.results(Some("big"), after, 0).await.unwrap();
        if page.results.is_empty() {
            break;
        }
        assert!(
            page.results.len() <= 2,
            "{} results in one page",
            page.results.len()
        );
        seen.extend(page.results.iter().map(|r| r.seq));
        after = page.next_cursor;
    }
    assert_eq!(seen.len(), 5, "{seen:?}");
    assert!(seen.windows(2).all(|w| w[0] < w[1]), "{seen:?}");
    // One result over the budget on its own still comes, alone.
    let env = TestEnv::start(|s| s.gateway.max_page_bytes = 1_000).await;
    env.workers_in_process(1);
    let mut t = synthetic(serde_json::json!({}));
    t.metadata = serde_json::json!({"blob": big});
    env.submit(&[t.clone(), t], "one").await;
    let all = env.wait_results("one", 2, Duration::from_secs(60)).await;
    assert_eq!(all.len(), 2);
    let page = env.client.results(Some("one"), 0, 0).await.unwrap();
    assert_eq!(page.results.len(), 1);
}
