//! Rebuilds the crate when a migration is added, changed or removed: `sqlx::migrate!`
//! embeds the workspace's SQL files at compile time (and `include_str!` the views
//! file), and cargo does not otherwise know the directory is an input.
fn main() {
    println!("cargo:rerun-if-changed=../../migrations");
}
