//! Sandbox tests: the tools through a real sandbox server on the `local` and `bwrap`
//! backends, the `apptainer` command lines against a stand-in executable, the
//! containment and hostile-agent suites on `bwrap`, and the launchers bwrap sandboxes
//! start from.

mod apptainer;
mod containment;
mod helpers;
mod hostile;
mod launchers;
mod lifeline;
use rollout_test_support::prerequisite;
mod tools;
