//! `rollout-scripted-llm`: a stand-in inference server for tests, benchmarks and the
//! demo (it plays a script; it is not a model). The command is
//! [`rollout_scripted_llm::cli`]; it is a target of this package so that `cargo install
//! --path .` installs it beside the service.

#![forbid(unsafe_code)]

fn main() -> anyhow::Result<()> {
    rollout_scripted_llm::cli::main()
}
