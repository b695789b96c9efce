//! The write path every job's hot transitions take: claims, hand-offs and ends
//! coalesced into multi-row statements (`coalesce`), SQLite's single writer committing
//! queued writes as one transaction (`group`), and job ends written many to a
//! statement with their results, their counters and their sampling verdicts (`ends`).
//!
//! Apart from the queries (`jobs`, `sampling`, …) because it is machinery they run
//! through, not something they ask: it imports the dialect and the row types below it
//! and nothing that uses it.

pub(crate) mod coalesce;
pub(crate) mod ends;
pub(crate) mod group;
