//! The dashboard benchmark: the cost of one status-page read as history grows.
//!
//! History is written straight into the tables (a million jobs through the service
//! would take the benchmark most of an hour): finished synthetic jobs with their stage
//! times, ended by inserting their results, so the trigger that ends real jobs sets
//! their ends and counts them into their batches. One job in a hundred fails, with one
//! of seven errors; the rest alternate reward 1 and 0.

use std::time::Instant;

use rollout::gateway::dashboard;

/// Jobs end this far apart: 20 a second, so the 15-minute window holds 18,000.
const SPACING_MS: i64 = 50;
/// The dashboard's default window.
const WINDOW_MS: i64 = 15 * 60_000;
/// Jobs per batch.
const BATCH: i64 = 1_000;

/// One row: the read's median time after the large history, beside after the small.
pub async fn reads(quick: bool, url: &str) -> String {
    let (small, large) = if quick {
        (20_000, 100_000)
    } else {
        (20_000, 1_000_000)
    };
    let store = rollout::store::connect(url, 4).await.unwrap();
    let db = Db::connect(url).await;
    // Job `i` of `large` ends at `now - (large - i) × spacing`: the newest `small` are
    // written first, the older ones after the first measurement.
    let now = rollout::domain::EpochMs::now().as_millis();
    let first = now - large * SPACING_MS;
    db.fill(large - small, large, first).await;
    db.settle().await;
    let at_small = median_read(&*store, now).await;
    breakdown(&*store, now, &format!("{small} jobs")).await;
    for from in (0..large - small).step_by(100_000) {
        let to = (from + 100_000).min(large - small);
        db.fill(from, to, first).await;
        eprintln!("dashboard: {} of {large} jobs of history", to + small);
    }
    db.settle().await;
    let at_large = median_read(&*store, now).await;
    breakdown(&*store, now, &format!("{large} jobs")).await;
    let d = dashboard::read(&*store, now, WINDOW_MS, 20).await.unwrap();
    // The window's whole minutes hold its jobs but for part of one minute.
    let in_window = WINDOW_MS / SPACING_MS;
    assert!(
        (d.throughput.jobs - in_window).abs() <= 60_000 / SPACING_MS,
        "{d:?}"
    );
    let ratio = at_large / at_small;
    format!(
        "| dashboard read, {large} jobs of history ({}) | {at_large:.1} ms | {at_small:.1} ms at {small} | {ratio:.2} | ≤ 2 |",
        db.name()
    )
}

/// Prints how long each of the dashboard's reads takes (stderr), to show which one
/// grows if the total does.
async fn breakdown(store: &dyn rollout::store::Store, now: i64, label: &str) {
    let since = now - WINDOW_MS;
    let mut parts = Vec::new();
    let t = Instant::now();
    store.batch_progress(20).await.unwrap();
    parts.push(("batches", t.elapsed()));
    let t = Instant::now();
    store.stage_queues().await.unwrap();
    parts.push(("queues", t.elapsed()));
    let t = Instant::now();
    store
        .stage_timings(since, dashboard::MAX_TIMINGS)
        .await
        .unwrap();
    parts.push(("timings", t.elapsed()));
    let t = Instant::now();
    store.throughput(since).await.unwrap();
    parts.push(("throughput", t.elapsed()));
    let t = Instant::now();
    store
        .failures(since, dashboard::MAX_FAILURES, 20)
        .await
        .unwrap();
    parts.push(("failures", t.elapsed()));
    let t = Instant::now();
    store.sampling_progress(20).await.unwrap();
    parts.push(("sampling", t.elapsed()));
    let shown: Vec<String> = parts
        .iter()
        .map(|(name, d)| format!("{name} {:.1} ms", d.as_secs_f64() * 1e3))
        .collect();
    eprintln!("dashboard ({label}): {}", shown.join(", "));
}

/// The median of 15 reads (after 3 to warm the caches), in ms.
async fn median_read(store: &dyn rollout::store::Store, now: i64) -> f64 {
    for _ in 0..3 {
        dashboard::read(store, now, WINDOW_MS, 20).await.unwrap();
    }
    let mut times: Vec<f64> = Vec::new();
    for _ in 0..15 {
        let t = Instant::now();
        dashboard::read(store, now, WINDOW_MS, 20).await.unwrap();
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

/// A direct connection to the benchmark's database, for writing history.
enum Db {
    Sqlite(sqlx::SqlitePool),
    Postgres(sqlx::PgPool),
}

impl Db {
    async fn connect(url: &str) -> Db {
        if url.starts_with("postgres") {
            Db::Postgres(sqlx::PgPool::connect(url).await.unwrap())
        } else {
            Db::Sqlite(sqlx::SqlitePool::connect(url).await.unwrap())
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Db::Sqlite(_) => "SQLite",
            Db::Postgres(_) => "Postgres",
        }
    }

    /// Jobs `from..to`, each ended `first + i × spacing`, with their batches.
    async fn fill(&self, from: i64, to: i64, first: i64) {
        // Rows `from..to` as (i, t): SQLite has no generate_series.
        let rows = match self {
            Db::Sqlite(_) => {
                "WITH RECURSIVE s(i) AS (SELECT $1 UNION ALL SELECT i + 1 FROM s WHERE i + 1 < $2) \
                 SELECT i, $3 + i * $4 AS t FROM s"
            }
            Db::Postgres(_) => {
                "SELECT i, $3 + i * $4 AS t FROM generate_series($1::bigint, $2::bigint - 1) i"
            }
        };
        let batches = format!(
            "INSERT INTO batches (id, created_at, submitted) \
             SELECT 'hist-' || (i / {BATCH}), MIN(t), {BATCH} FROM ({rows}) r \
             WHERE true GROUP BY i / {BATCH} ON CONFLICT (id) DO NOTHING"
        );
        let jobs = format!(
            "INSERT INTO jobs (id, batch_id, kind, task, status, stage, created_at, updated_at, \
             init_queued_at, init_started_at, init_finished_at, run_queued_at, run_started_at, \
             run_finished_at, eval_queued_at, eval_started_at) \
             SELECT 'h' || i, 'hist-' || (i / {BATCH}), 'synthetic', '{{}}', 'running', 'eval', \
             t - 9000, t - 10, t - 9000, t - 8990, t - 8900, t - 8900, t - 8890, t - 4000, \
             t - 4000, t - 3990 FROM ({rows}) r"
        );
        let results = format!(
            "INSERT INTO results (job_id, batch_id, status, reward, error, output, created_at) \
             SELECT 'h' || i, 'hist-' || (i / {BATCH}), \
             CASE WHEN i % 100 = 0 THEN 'failed' ELSE 'done' END, \
             CASE WHEN i % 100 = 0 THEN NULL ELSE CAST(i % 2 AS DOUBLE PRECISION) END, \
             CASE WHEN i % 100 = 0 THEN 'error kind ' || (i % 7) END, '{{}}', t FROM ({rows}) r"
        );
        for statement in [batches, jobs, results] {
            let q = sqlx::AssertSqlSafe(statement);
            match self {
                Db::Sqlite(p) => {
                    let q = sqlx::query(q)
                        .bind(from)
                        .bind(to)
                        .bind(first)
                        .bind(SPACING_MS);
                    q.execute(p).await.unwrap();
                }
                Db::Postgres(p) => {
                    let q = sqlx::query(q)
                        .bind(from)
                        .bind(to)
                        .bind(first)
                        .bind(SPACING_MS);
                    q.execute(p).await.unwrap();
                }
            };
        }
    }

    /// The state a long run reaches on its own. Postgres: autovacuum's, with dead row
    /// versions (every result updates its batch's row; every end retires its job from
    /// `jobs_unfinished`) cleaned up and statistics fresh. SQLite: nothing, since the
    /// store never analyzes it and SQLite plans without statistics then; an analysis
    /// taken while the history was small would be kept by connections already open.
    async fn settle(&self) {
        match self {
            Db::Sqlite(_) => Ok(()),
            Db::Postgres(p) => sqlx::query("VACUUM ANALYZE").execute(p).await.map(drop),
        }
        .unwrap();
    }
}
