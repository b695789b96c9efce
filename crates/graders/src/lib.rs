//! Graders: what EVAL uses to turn a finished episode into a reward and the reason for
//! it. A grader never fails a job over a bad answer: a response with no answer, an
//! answer that cannot be read, a wrong one, all give reward 0 with `details` saying why.
//!
//! - [`math`]: a final answer compared with the ground truth as a careful human grader
//!   would (in-process, milliseconds per answer, no sandbox);
//! - [`code`]: comparing a program's output with a test case's, and finding the program
//!   in a model's answer (the program runs in EVAL's sandbox);
//! - [`logs`]: test results read out of a test runner's log (pytest, Django, sympy,
//!   unittest) with SWE-bench's semantics, and whether the log can be trusted, for
//!   code and SWE tasks;
//! - [`swe`]: SWE-bench instances, the files a test patch touches, and the verdict on
//!   their named tests;
//! - [`swe_repos`]: per-repository defaults as SWE-bench has them: the log parser, the
//!   test command and the test patch's files as its arguments.

#![forbid(unsafe_code)]

pub mod code;
pub mod logs;
pub mod math;
pub mod swe;
pub mod swe_repos;
