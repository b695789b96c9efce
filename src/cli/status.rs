//! `rollout status`: job counts by status and stage.

use rollout::client::Client;

use super::table::{Align, Table};

/// `rollout status`: job counts by status and stage, and the batch's totals when one is
/// named.
pub async fn status(client: &Client, batch: Option<&str>) -> anyhow::Result<()> {
    let view = client.status(batch).await?;
    let mut t = Table::new(&[
        ("STATUS", Align::Left),
        ("STAGE", Align::Left),
        ("JOBS", Align::Right),
    ]);
    for c in &view.counts {
        t.row(vec![
            c.status.to_string(),
            c.stage.to_string(),
            c.count.to_string(),
        ]);
    }
    println!("{}", t.render());
    if let Some(b) = view.batch {
        println!(
            "batch {}: {} submitted, {} finished ({} done, {} failed, {} timed out, {} cancelled, {} stale)",
            b.id, b.submitted, b.finished, b.done, b.failed, b.timed_out, b.cancelled, b.stale
        );
    }
    Ok(())
}
