//! `rollout-sandbox`: the server that runs inside every sandbox, and a small client to
//! talk to one by hand. The command is [`rollout_sandbox::cli`]. It is the sandbox
//! crate's binary, so it links this crate alone, not the service; the workspace's
//! default members take it, so `cargo build --bins` at the top puts it beside the
//! service's binaries, where the service looks for it (`cargo install --path
//! crates/sandbox` installs it).

#![forbid(unsafe_code)]

fn main() -> anyhow::Result<()> {
    rollout_sandbox::cli::main()
}
