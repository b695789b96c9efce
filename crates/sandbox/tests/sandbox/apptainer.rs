//! The `apptainer` backend's command lines, checked against a stand-in executable that
//! records them and runs the sandbox server on the host (Apptainer cannot be installed
//! on the build machines; `docs/apptainer.md` says how to check on a real cluster).

use crate::helpers::{TestSandbox, request};
use rollout_sandbox::apptainer::{ApptainerRuntime, instance_name};
use rollout_sandbox::{RuntimeKind, Runtimes, SandboxError, SandboxRuntime};
use std::path::{Path, PathBuf};

/// Copies the stand-in into a directory of its own and returns its path.
fn stand_in(dir: &Path) -> PathBuf {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let to = bin.join("apptainer");
    crate::helpers::copy_executable(
        Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/sandbox/fake-apptainer"
        )),
        &to,
    );
    to
}

fn calls(program: &Path) -> Vec<Vec<String>> {
    std::fs::read_to_string(program.parent().unwrap().join("calls.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[tokio::test]
async fn instance_lifecycle_uses_the_documented_command_lines() {
    let (root, mut req) = request(RuntimeKind::Apptainer, &[("task.txt", "hello\n")]);
    // Outside the sandbox's root, which stopping the sandbox removes.
    let tools = tempfile::tempdir().unwrap();
    let program = stand_in(tools.path());
    let image = root.path().join("swe.sif");
    std::fs::write(&image, b"not really an image").unwrap();
    req.image = Some(image.display().to_string());
    req.fakeroot = true;
    req.env.insert("TASK_FLAVOUR".into(), "sour".into());
    let backend = ApptainerRuntime {
        program: program.clone(),
        ..Default::default()
    };
    let sb = backend.start(&req).await.expect("start");
    let name = instance_name(&req.dir);
    assert_eq!(sb.label.instance.as_deref(), Some(name.as_str()));

    let r = sb
        .client
        .bash("cat task.txt; echo $TASK_FLAVOUR", None)
        .await
        .unwrap();
    assert_eq!(r.output, "hello\nsour\n");

    let ws = req.workspace().display().to_string();
    let run = req.run_dir().display().to_string();
    let bin = req.server_bin.display().to_string();
    let expected_start: Vec<String> = [
        "instance",
        "start",
        "--containall",
        "--writable-tmpfs",
        "--net",
        "--network",
        "none",
        "--fakeroot",
        "--bind",
        &format!("{ws}:/workspace"),
        "--bind",
        &format!("{run}:/run/rollout"),
        "--bind",
        &format!("{bin}:/run/rollout-sandbox:ro"),
        "--env",
        "TASK_FLAVOUR=sour",
        &image.display().to_string(),
        &name,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let expected_exec: Vec<String> = [
        "exec",
        "--pwd",
        "/workspace",
        &format!("instance://{name}"),
        "/run/rollout-sandbox",
        "serve",
        "--socket",
        "/run/rollout/sock",
        "--workdir",
        "/workspace",
        "--ctl-dir",
        "/run/rollout/ctl",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    assert_eq!(calls(&program), vec![expected_start, expected_exec]);

    let t = TestSandbox { sb, _root: root };
    let backends = Runtimes {
        apptainer: ApptainerRuntime {
            program: program.clone(),
            ..Default::default()
        },
        ..Runtimes::default()
    };
    t.stop_with(&backends).await;
    let all = calls(&program);
    assert_eq!(
        all.last().unwrap(),
        &vec!["instance".to_string(), "stop".into(), name]
    );
    assert_eq!(
        std::fs::read_dir(program.parent().unwrap().join("instances"))
            .unwrap()
            .count(),
        0
    );
}

#[tokio::test]
async fn network_is_only_shared_when_the_task_allows_it() {
    let (root, mut req) = request(RuntimeKind::Apptainer, &[]);
    req.network = true;
    let args = ApptainerRuntime::default().start_args(&req, "img.sif");
    assert!(
        !args.iter().any(|a| a == "--network" || a == "--net"),
        "{args:?}"
    );
    assert!(!args.iter().any(|a| a == "--fakeroot"));
    // That is the host's network, so only an operator who accepts it gets it.
    let program = stand_in(root.path());
    req.image = Some("img.sif".into());
    let err = ApptainerRuntime {
        program: program.clone(),
        ..Default::default()
    }
    .start(&req)
    .await
    .err()
    .expect("refused");
    assert!(
        matches!(&err, SandboxError::Config(m) if m.contains("apptainer_host_network")),
        "{err}"
    );
    assert!(calls(&program).is_empty(), "nothing was started");
    drop(root);
}

#[tokio::test]
async fn a_missing_image_is_a_clear_error() {
    let (root, mut req) = request(RuntimeKind::Apptainer, &[]);
    let program = stand_in(root.path());
    let backend = ApptainerRuntime {
        program,
        ..Default::default()
    };
    let err = backend
        .start(&req)
        .await
        .err()
        .expect("no image configured");
    assert!(matches!(err, SandboxError::Config(_)), "{err}");
    req.image = Some(root.path().join("missing.sif").display().to_string());
    let err = backend
        .start(&req)
        .await
        .err()
        .expect("image does not exist");
    let text = err.to_string();
    assert!(
        text.contains("instance start") && text.contains("missing.sif"),
        "{text}"
    );
}
