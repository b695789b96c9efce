//! Sandbox tests: the tools through a real sandbox server on the `local` and `bwrap`
//! backends, the `apptainer` command lines against a stand-in executable, and the
//! containment and hostile-agent suites on `bwrap`.

mod apptainer;
mod containment;
mod helpers;
mod hostile;
mod lifeline;
mod tools;
