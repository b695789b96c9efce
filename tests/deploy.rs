//! The container files, checked as far as this machine allows: `docker-compose.yml` is
//! valid to Compose itself (`docker compose config`, or Debian's `docker-compose`,
//! installed by `scripts/test.sh`), every command its services run from the image is a
//! command the `rollout` binary accepts, the Dockerfile and the Apptainer definition put
//! every binary a node needs in the image (the sandbox server beside the workers), and
//! the image is built when a Docker engine answers. The Slurm scripts of `deploy/slurm/`
//! are run here outside Slurm, against stand-in programs, for what they do before they
//! start anything: say which program is missing and what to set, with exit status 3,
//! find programs through `ROLLOUT_ENV_SETUP` and `ROLLOUT_BIN_DIR`, and choose the log
//! format (`tests/pipeline/slurm.rs` runs them on a real cluster).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

use rollout_test_support::host;

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
    let mut bins: BTreeSet<String> = manifest["bin"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["name"].as_str().unwrap().to_string())
        .collect();
    // The other default members' binaries (`cargo build --bins` at the top builds them
    // too): a crate's `src/main.rs` is a binary named after its package.
    for member in manifest["workspace"]["default-members"].as_array().unwrap() {
        let member = member.as_str().unwrap();
        let dir = root().join(member);
        if member == "." || !dir.join("src/main.rs").is_file() {
            continue;
        }
        let theirs: toml::Table = std::fs::read_to_string(dir.join("Cargo.toml"))
            .unwrap()
            .parse()
            .unwrap();
        bins.insert(theirs["package"]["name"].as_str().unwrap().to_string());
    }
    bins
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

/// A directory of stand-ins for a Slurm script: links to the ordinary tools it uses, a
/// `rollout` (in `rollout_bin/`) that prints its arguments and the grace it got, and an
/// `scontrol` (in `slurm/`) that reports a KillWait of 42 s.
struct Stand {
    dir: tempfile::TempDir,
}

impl Stand {
    fn new() -> Stand {
        let stand = Stand {
            dir: tempfile::tempdir().unwrap(),
        };
        for sub in ["tools", "rollout_bin", "slurm", "tmp"] {
            std::fs::create_dir(stand.path(sub)).unwrap();
        }
        for tool in [
            "awk", "cat", "chmod", "date", "head", "hostname", "mkdir", "od", "readlink", "seq",
            "sleep", "tr",
        ] {
            let found = host::which(tool).unwrap_or_else(|| panic!("`{tool}` is not installed"));
            std::os::unix::fs::symlink(found, stand.path("tools").join(tool)).unwrap();
        }
        stand.script(
            "rollout_bin/rollout",
            "echo \"rollout $*\"\necho \"grace=$ROLLOUT__STAGES__GRACE_MS\"\n",
        );
        stand.script(
            "slurm/scontrol",
            "echo 'KillWait                = 42 sec'\n",
        );
        std::fs::write(
            stand.path("head.env"),
            "ROLLOUT__NATS__URL=nats://head:4222\n",
        )
        .unwrap();
        stand
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    fn script(&self, rel: &str, body: &str) {
        use std::os::unix::fs::PermissionsExt;
        let path = self.path(rel);
        std::fs::write(&path, format!("#!/bin/sh\n{body}")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    /// A `PATH` of these stand-in directories.
    fn path_of(&self, dirs: &[&str]) -> String {
        dirs.iter()
            .map(|d| self.path(d).display().to_string())
            .collect::<Vec<_>>()
            .join(":")
    }

    /// Runs `deploy/slurm/<script>` with bash, with nothing of this process's
    /// environment but `env`.
    fn run(&self, script: &str, env: &[(&str, String)]) -> Output {
        let bash = host::which("bash").expect("bash is installed");
        let mut cmd = Command::new(bash);
        cmd.env_clear()
            .current_dir(self.dir.path())
            .arg(root().join("deploy/slurm").join(script))
            .env("TMPDIR", self.path("tmp"))
            .env("ROLLOUT_HEAD_FILE", self.path("head.env"))
            .env("ROLLOUT_HEAD_WAIT_S", "1");
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.output().unwrap()
    }
}

/// Standard output and error.
fn texts(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A script, the directories of its `PATH`, more environment, and the words its error
/// must hold.
type MissingCase<'a> = (
    &'a str,
    &'a [&'a str],
    &'a [(&'a str, &'a str)],
    &'a [&'a str],
);

/// A missing program stops a script at once with its name, what to set and status 3
/// (a worker without `scontrol` used to exit 127 saying nothing).
#[test]
fn the_slurm_scripts_name_a_missing_program_and_what_to_set() {
    let stand = Stand::new();
    let cases: &[MissingCase] = &[
        (
            "rollout-worker.sbatch",
            &["tools", "rollout_bin"],
            &[],
            &[
                "`scontrol` is not on PATH",
                "ROLLOUT_ENV_SETUP",
                "ROLLOUT__STAGES__GRACE_MS",
            ],
        ),
        (
            "rollout-worker.sbatch",
            &["tools", "slurm"],
            &[],
            &[
                "`rollout` is not on PATH",
                "ROLLOUT_BIN_DIR",
                "ROLLOUT_ENV_SETUP",
            ],
        ),
        (
            "rollout-worker.sbatch",
            &["tools", "rollout_bin", "slurm"],
            &[("ROLLOUT_ENV_SETUP", "no-such-file.sh")],
            &["cannot read ROLLOUT_ENV_SETUP"],
        ),
        (
            "rollout-head.sbatch",
            &["tools"],
            &[],
            &["`rollout` is not on PATH", "ROLLOUT_BIN_DIR"],
        ),
        (
            "rollout-head.sbatch",
            &["tools", "rollout_bin"],
            &[],
            &[
                "`nats-server` is not on PATH",
                "ROLLOUT_BIN_DIR",
                "ROLLOUT_ENV_SETUP",
            ],
        ),
        (
            "rollout-head.sbatch",
            &["tools", "rollout_bin"],
            &[
                ("ROLLOUT_NATS_FILE", "nats.env"),
                ("ROLLOUT_HEAD_POSTGRES", "1"),
            ],
            &["`initdb` is not on PATH", "ROLLOUT_ENV_SETUP"],
        ),
        (
            "rollout-nats.sbatch",
            &["tools", "slurm"],
            &[],
            &["`nats-server` is not on PATH", "ROLLOUT_BIN_DIR"],
        ),
    ];
    for (script, path, env, words) in cases {
        let mut vars = vec![("PATH", stand.path_of(path))];
        vars.extend(env.iter().map(|(k, v)| (*k, v.to_string())));
        let out = stand.run(script, &vars);
        let (stdout, stderr) = texts(&out);
        assert_eq!(
            out.status.code(),
            Some(3),
            "{script} with PATH {path:?} and {env:?}: {stdout}{stderr}"
        );
        for word in *words {
            assert!(
                stderr.contains(word),
                "{script} with PATH {path:?}: `{word}` missing from: {stderr}"
            );
        }
    }
}

/// The worker script finds `rollout` in `ROLLOUT_BIN_DIR` and `scontrol` through the
/// file `ROLLOUT_ENV_SETUP` names, sets the grace below KillWait, and runs `rollout
/// node` with readable logs unless `ROLLOUT_LOG_FORMAT` says `json`.
#[test]
fn the_worker_script_finds_its_programs_through_its_variables_and_logs_text_by_default() {
    let stand = Stand::new();
    let setup = stand.path("setup.sh");
    std::fs::write(
        &setup,
        format!(
            "# module load slurm\nexport PATH=\"{}:$PATH\"\n",
            stand.path("slurm").display()
        ),
    )
    .unwrap();
    let base = vec![
        ("PATH", stand.path_of(&["tools"])),
        (
            "ROLLOUT_BIN_DIR",
            stand.path("rollout_bin").display().to_string(),
        ),
        ("ROLLOUT_ENV_SETUP", setup.display().to_string()),
    ];
    let out = stand.run("rollout-worker.sbatch", &base);
    let (stdout, stderr) = texts(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(
        stdout.contains("rollout --log-format text node --stages init,run,eval"),
        "{stdout}{stderr}"
    );
    assert!(
        stdout.contains("grace=37000"),
        "KillWait 42 s less 5: {stdout}"
    );
    assert!(stderr.contains("text logs"), "{stderr}");

    let mut json = base.clone();
    json.push(("ROLLOUT_LOG_FORMAT", "json".into()));
    let (stdout, stderr) = texts(&stand.run("rollout-worker.sbatch", &json));
    assert!(
        stdout.contains("rollout --log-format json node"),
        "{stdout}{stderr}"
    );

    let mut wrong = base.clone();
    wrong.push(("ROLLOUT_LOG_FORMAT", "xml".into()));
    let out = stand.run("rollout-worker.sbatch", &wrong);
    let (stdout, stderr) = texts(&out);
    assert_eq!(out.status.code(), Some(2), "{stdout}{stderr}");
    assert!(stderr.contains("ROLLOUT_LOG_FORMAT must be"), "{stderr}");

    // A grace given needs no scontrol.
    let out = stand.run(
        "rollout-worker.sbatch",
        &[
            ("PATH", stand.path_of(&["tools", "rollout_bin"])),
            ("ROLLOUT__STAGES__GRACE_MS", "1234".into()),
        ],
    );
    let (stdout, stderr) = texts(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(stdout.contains("grace=1234"), "{stdout}");
}

/// The head job asks for a time limit of its own (a partition's default may be
/// minutes), and so does the NATS cluster's: both must outlive the training run.
#[test]
fn the_head_and_nats_jobs_ask_for_a_time_limit() {
    for script in ["rollout-head.sbatch", "rollout-nats.sbatch"] {
        let text = std::fs::read_to_string(root().join("deploy/slurm").join(script)).unwrap();
        assert!(
            text.lines().any(|l| l.starts_with("#SBATCH --time=")),
            "{script} sets no --time"
        );
    }
}
