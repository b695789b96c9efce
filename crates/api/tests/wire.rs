//! The wire types as a program using the crate sees them: their JSON is the API's,
//! whatever the service stores beside it.

use rollout_api::api::jobs::{SubmitResponse, Submitted};
use rollout_core::domain::{Stage, Status};

/// A submit's entry has the fields the API has always had: the stage-entry counter the
/// service queues a job with was never on the wire, and is not a field here at all.
#[test]
fn a_submit_answer_has_the_fields_of_the_api() {
    let answer = SubmitResponse {
        batch_id: "b1".into(),
        jobs: vec![Submitted {
            id: "j1".into(),
            client_id: Some("c1".into()),
            status: Status::Queued,
            stage: Stage::Init,
            duplicate: true,
        }],
    };
    let json = serde_json::json!({
        "batch_id": "b1",
        "jobs": [{
            "id": "j1", "client_id": "c1", "status": "queued", "stage": "init",
            "duplicate": true,
        }],
    });
    assert_eq!(serde_json::to_value(&answer).unwrap(), json);
    let read: SubmitResponse = serde_json::from_value(json).unwrap();
    assert_eq!(read.jobs[0].id, "j1");
}
