//! The container files, checked as far as this machine allows: `docker-compose.yml` is
//! valid to Compose itself (`docker compose config`, or Debian's `docker-compose`,
//! installed by `scripts/test.sh`), every command its services run from the image is a
//! command the `rollout` binary accepts, the Dockerfile and the Apptainer definition put
//! every binary a node needs in the image (the sandbox server beside the workers), and
//! the image is built when a Docker engine answers.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use serde_json::Value;

#[path = "common/host.rs"]
#[allow(dead_code)] // this crate needs only `which`
mod host;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The compose file as Compose resolves it, as JSON.
fn compose_config() -> Value {
    let plugin = Command::new("docker")
        .args(["compose", "version"])
        .output()
        .is_ok_and(|o| o.status.success());
    let mut cmd = if plugin {
        let mut c = Command::new("docker");
        c.arg("compose");
        c
    } else {
        let program = host::which("docker-compose").unwrap_or_else(|| {
            panic!("neither `docker compose` nor `docker-compose` is installed: run scripts/test.sh (it installs Debian's docker-compose)")
        });
        Command::new(program)
    };
    let out = cmd
        .current_dir(root())
        .args(["-f", "docker-compose.yml", "config"])
        .env("ROLLOUT_GATEWAY_TOKEN", "0123456789abcdef0123456789abcdef")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "compose refuses docker-compose.yml: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The resolved file is YAML; Python's yaml (a dependency of docker-compose) reads it.
    let mut py = Command::new("python3")
        .args([
            "-c",
            "import sys, json, yaml; json.dump(yaml.safe_load(sys.stdin), sys.stdout)",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut py.stdin.take().unwrap(), &out.stdout).unwrap();
    let json = py.wait_with_output().unwrap();
    assert!(
        json.status.success(),
        "python3 with yaml could not read the config"
    );
    serde_json::from_slice(&json.stdout).unwrap()
}

/// The package's binaries, by name.
fn binaries() -> BTreeSet<String> {
    let manifest = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    let manifest: toml::Table = manifest.parse().unwrap();
    manifest["bin"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["name"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn the_compose_file_is_valid_and_runs_commands_rollout_has() {
    let config = compose_config();
    let services = config["services"].as_object().unwrap();
    for name in ["nats", "postgres", "gateway", "node", "eval"] {
        assert!(services.contains_key(name), "no `{name}` service: {config}");
    }
    let rollout = env!("CARGO_BIN_EXE_rollout");
    let mut checked = 0;
    for (name, service) in services {
        if service["image"] != "rollout:latest" {
            continue;
        }
        // The image's entrypoint is `rollout`: its command is a rollout command line.
        let args: Vec<&str> = service["command"]
            .as_array()
            .unwrap_or_else(|| panic!("`{name}` has no command"))
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        let out = Command::new(rollout)
            .args(&args)
            .arg("--help")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "`{name}` runs `rollout {}`, which rollout refuses: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        checked += 1;
    }
    assert_eq!(checked, 3, "gateway, node and eval run the image");
    for name in ["node", "eval"] {
        let opts = &services[name]["security_opt"];
        assert!(
            opts.as_array()
                .is_some_and(|o| o.iter().any(|v| v == "seccomp=unconfined")),
            "`{name}` runs sandboxes: it needs user namespaces ({opts})"
        );
    }
}

#[test]
fn the_images_hold_every_binary_a_node_needs() {
    let bins = binaries();
    for needed in ["rollout", "rollout-sandbox"] {
        assert!(bins.contains(needed), "{bins:?}");
    }
    let dockerfile = std::fs::read_to_string(root().join("Dockerfile")).unwrap();
    let copied: BTreeSet<String> = dockerfile
        .split_whitespace()
        .filter_map(|w| w.strip_prefix("/src/target/release/"))
        .map(str::to_string)
        .collect();
    assert_eq!(
        copied, bins,
        "the Dockerfile copies exactly the package's binaries"
    );
    let def = std::fs::read_to_string(root().join("deploy/apptainer/rollout.def")).unwrap();
    let files: BTreeSet<String> = def
        .lines()
        .filter_map(|l| l.trim().strip_prefix("target/release/"))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect();
    assert_eq!(
        files, bins,
        "the Apptainer definition copies the package's binaries"
    );
    for section in ["Bootstrap: docker", "%files", "%post", "%runscript"] {
        assert!(def.contains(section), "rollout.def lacks {section}");
    }
}

/// Builds the image. It needs a Docker engine, which this project's machines (and its
/// CI) do not have, so it runs only when asked: `cargo test --test deploy --
/// --ignored`; there, an engine that does not answer fails it.
#[test]
#[ignore = "needs a Docker engine: run with --ignored where one answers"]
fn the_image_builds_where_an_engine_answers() {
    let engine = Command::new("docker")
        .arg("info")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        engine,
        "no Docker engine answers here (`docker info` fails)"
    );
    let out = Command::new("docker")
        .current_dir(root())
        .args(["build", "-t", "rollout:test", "."])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "docker build failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
