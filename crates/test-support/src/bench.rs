//! What the benchmarks share (each is a `harness = false` target printing its table):
//! quantile ranks, whether `cargo bench` started the binary, and the short smoke run.

/// The index of the `p` quantile (`p` in 0..=1) of a sorted sample of `len` values: the
/// nearest rank.
// `p` in 0..=1 puts the rounded product in 0..len, which a usize holds exactly.
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
pub fn rank(len: usize, p: f64) -> usize {
    (len.saturating_sub(1) as f64 * p).round() as usize
}

/// Whether this binary was started by `cargo bench` (with `--bench`). `cargo test
/// --all-targets` runs bench binaries too, without it: building the benchmark is then
/// the whole check, and this says how to run `name` for real.
pub fn started_by_cargo_bench(name: &str) -> bool {
    let bench = std::env::args().any(|a| a == "--bench");
    if !bench {
        println!("{name} benchmark: run it with `cargo bench --bench {name}`");
    }
    bench
}

/// `BENCH_QUICK` is set: a short smoke run instead of the full measurement.
pub fn quick() -> bool {
    std::env::var_os("BENCH_QUICK").is_some()
}
