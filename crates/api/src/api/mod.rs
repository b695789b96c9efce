//! The HTTP API's wire types: the bodies the gateway takes and returns, which the client
//! sends and reads. They live here, below both, so the client does not depend on the
//! server (it sits beside it: a trainer's process links the client, never the gateway),
//! and the OpenAPI document the gateway serves is derived from these same types.
//!
//! None is a database row: what an answer shows of a store row has its own type here,
//! which the gateway fills from the row, so a column can change without the API.
//!
//! One module per group of routes: [`jobs`], [`batches`], [`results`], [`policy`], [`status`],
//! [`dashboard`] (its rows in [`views`]), [`training`], and [`error`] for the body of every
//! error response. The query parameters stay with the gateway, which checks them.

pub mod batches;
pub mod dashboard;
pub mod error;
pub mod jobs;
pub mod policy;
pub mod results;
pub mod status;
pub mod training;
pub mod views;
