//! Rebuilds the crate when a migration is added, changed or removed: `sqlx::migrate!`
//! embeds the workspace's SQL files at compile time, and cargo does not otherwise know
//! the directory is an input.
fn main() {
    println!("cargo:rerun-if-changed=../../migrations");
}
