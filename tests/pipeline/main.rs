//! Integration tests of the service against a real nats-server and a real database
//! (SQLite, or Postgres when `ROLLOUT_TEST_DATABASE_URL` is set), and against a real
//! vLLM (`real_vllm`). One binary with a module per area links once; each test has its
//! own NATS stream prefix on a shared server and its own database copied from a
//! migrated template (the fixtures of `rollout_test_support`, and `helpers` for the
//! service's own).

use rollout_test_support::{eventually, host, leftovers, nats_cluster, prerequisite, rack};

mod abandoned;
mod agent;
mod api;
mod auth;
mod backends;
mod cli;
mod cluster;
mod examples;
mod faults;
mod flow;
mod forgeries;
mod graders;
mod helpers;
mod hostile;
mod nats_submit;
mod nodes;
mod openapi;
mod poison;
mod program;
mod real_vllm;
mod replay;
mod results;
mod sampling;
mod shadows;
mod shell;
mod slurm;
mod swe;
mod training;
mod views;
mod weight_update;

/// Every suite of this binary is placed by the test command: in its Postgres pass
/// (`on_both`) or, running once on SQLite, out of it (`sqlite_only`). A new suite that
/// is in neither list would silently never run on Postgres.
#[test]
fn every_suite_is_placed_in_or_out_of_the_postgres_pass() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let script = std::fs::read_to_string(root.join("scripts/test.sh")).unwrap();
    let list = |name: &str| -> std::collections::BTreeSet<String> {
        let line = script
            .lines()
            .find_map(|l| l.trim().strip_prefix(&format!("{name}=\"")))
            .unwrap_or_else(|| panic!("scripts/test.sh sets no `{name}`"));
        line.trim_end_matches('"')
            .split('|')
            .map(str::to_string)
            .collect()
    };
    let (both, once) = (list("on_both"), list("sqlite_only"));
    let main = std::fs::read_to_string(root.join("tests/pipeline/main.rs")).unwrap();
    let suites: std::collections::BTreeSet<String> = main
        .lines()
        .filter_map(|l| l.strip_prefix("mod ")?.strip_suffix(';'))
        .filter(|m| *m != "helpers")
        .map(str::to_string)
        .collect();
    assert!(both.is_disjoint(&once), "{:?}", both.intersection(&once));
    let placed: std::collections::BTreeSet<String> = both.union(&once).cloned().collect();
    assert_eq!(
        placed, suites,
        "suites placed by scripts/test.sh vs declared here"
    );
}
