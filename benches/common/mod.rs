//! Helpers shared by the benchmarks; each bench target includes this module with
//! `mod common;` (a directory, so Cargo does not take it for a bench target).

#[allow(unused_imports)] // not every benchmark takes quantiles
pub use rollout_test_support::bench::{quick, rank, started_by_cargo_bench};

/// Runs `compare` (given whether the run is quick) on a multi-threaded runtime and
/// prints its rows under the benchmarks' table header: the `main` of a benchmark that
/// reports one table, when `cargo bench --bench name` started it.
#[allow(dead_code)] // not every benchmark reports a single table
pub fn run_table<F, Fut>(name: &str, compare: F)
where
    F: FnOnce(bool) -> Fut,
    Fut: std::future::Future<Output = Vec<String>>,
{
    if !started_by_cargo_bench(name) {
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let rows = rt.block_on(compare(quick()));
    println!("| benchmark | result | baseline (same run) | ratio | goal |");
    println!("|---|---|---|---|---|");
    for row in rows {
        println!("{row}");
    }
}
