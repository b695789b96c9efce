//! `rollout-sandbox`: the server that runs inside every sandbox, and a small client to
//! talk to one by hand. The command is [`rollout_sandbox::cli`]; it is a target of this
//! package so that `cargo install --path .` installs it beside the service, which looks
//! for it next to its own executable.

#![forbid(unsafe_code)]

fn main() -> anyhow::Result<()> {
    rollout_sandbox::cli::main()
}
