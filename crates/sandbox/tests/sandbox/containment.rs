//! The containment suite on `bwrap`: each escape attempt fails, the failure is reported
//! to the agent, and the host and this test process are unharmed.

use crate::helpers::{TestSandbox, request, start, start_with};
use rollout_sandbox::RuntimeKind;
use std::time::Duration;

/// The host can still start processes and the sandbox is still usable.
async fn host_and_sandbox_fine(t: &TestSandbox) {
    assert!(
        std::process::Command::new("true")
            .status()
            .unwrap()
            .success()
    );
    let r =
        t.sb.client
            .bash("echo alive", Some(Duration::from_secs(30)))
            .await
            .unwrap();
    assert_eq!(r.output, "alive\n", "{r:?}");
}

#[tokio::test]
async fn host_files_outside_the_binds_are_invisible() {
    let (root, req) = request(RuntimeKind::Bwrap, &[]);
    let secret = root.path().join("secret.txt");
    std::fs::write(&secret, "TOP-SECRET-VALUE").unwrap();
    let in_tmp = std::env::temp_dir().join(format!("rollout-secret-{}", std::process::id()));
    std::fs::write(&in_tmp, "TOP-SECRET-VALUE").unwrap();
    let t = start_with(root, req).await;
    for path in [
        secret.display().to_string(),
        in_tmp.display().to_string(),
        "/etc/shadow".into(),
    ] {
        let r =
            t.sb.client
                .bash(&format!("cat {path}"), None)
                .await
                .unwrap();
        assert_ne!(r.exit_code, Some(0), "{path}: {r:?}");
        assert!(r.output.contains("No such file"), "{path}: {r:?}");
        assert!(!r.output.contains("TOP-SECRET"));
    }
    let r =
        t.sb.client
            .python(
                &format!("open({:?}).read()", secret.display().to_string()),
                None,
            )
            .await
            .unwrap();
    assert!(r.error.unwrap().contains("FileNotFoundError"));
    let _ = std::fs::remove_file(in_tmp);
    host_and_sandbox_fine(&t).await;
    t.stop().await;
}

#[tokio::test]
async fn the_hosts_loopback_is_unreachable() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let t = start(RuntimeKind::Bwrap, &[]).await;
    let r =
        t.sb.client
            .bash(
                &format!("echo hi > /dev/tcp/127.0.0.1/{port}"),
                Some(Duration::from_secs(20)),
            )
            .await
            .unwrap();
    assert_ne!(r.exit_code, Some(0), "{r:?}");
    assert!(
        r.output.contains("Connection refused") || r.output.contains("unreachable"),
        "{r:?}"
    );
    let r = t
        .sb
        .client
        .python(
            &format!("import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=5)"),
            None,
        )
        .await
        .unwrap();
    assert!(r.error.unwrap().contains("ConnectionRefusedError"));
    assert_eq!(
        listener.accept().err().map(|e| e.kind()),
        Some(std::io::ErrorKind::WouldBlock),
        "nothing reached the host's listener"
    );
    host_and_sandbox_fine(&t).await;
    t.stop().await;
}

#[tokio::test]
async fn nothing_outside_the_workspace_is_writable() {
    let (root, req) = request(RuntimeKind::Bwrap, &[]);
    let host_file = root.path().join("host.txt");
    std::fs::write(&host_file, "original").unwrap();
    let t = start_with(root, req).await;
    for target in [
        "/usr/pwned",
        "/etc/passwd",
        "/etc/new-file",
        "/run/rollout-sandbox",
        "/pwned",
        &host_file.display().to_string(),
    ] {
        let r =
            t.sb.client
                .bash(&format!("echo pwned > {target}"), None)
                .await
                .unwrap();
        assert_ne!(r.exit_code, Some(0), "{target}: {r:?}");
        assert!(
            r.output.contains("Read-only file system")
                || r.output.contains("No such file")
                || r.output.contains("Permission denied"),
            "{target}: {r:?}"
        );
    }
    assert_eq!(std::fs::read_to_string(&host_file).unwrap(), "original");
    assert!(!std::path::Path::new("/usr/pwned").exists());
    // `/etc` is the node's prepared copy of the listed entries, the same as the host's,
    // and nothing else of it.
    let r =
        t.sb.client
            .bash("cat /etc/passwd; ls /etc", None)
            .await
            .unwrap();
    assert!(
        r.output
            .starts_with(&std::fs::read_to_string("/etc/passwd").unwrap()),
        "{r:?}"
    );
    for absent in ["shadow", "gshadow", "sudoers", "machine-id"] {
        assert!(
            !r.output.lines().any(|l| l == absent),
            "/etc/{absent} is visible: {r:?}"
        );
    }
    let r =
        t.sb.client
            .bash("echo mine > /workspace/ok && cat ok", None)
            .await
            .unwrap();
    assert_eq!(r.output, "mine\n");
    host_and_sandbox_fine(&t).await;
    t.stop().await;
}

#[tokio::test]
async fn a_fork_bomb_hits_the_process_limit() {
    let (root, mut req) = request(RuntimeKind::Bwrap, &[]);
    req.limits.processes = 64;
    let t = start_with(root, req).await;
    let r =
        t.sb.client
            .bash(
                "bomb() { bomb | bomb & }; bomb; sleep 2; echo survived",
                Some(Duration::from_secs(10)),
            )
            .await
            .unwrap();
    assert!(
        r.output.contains("Resource temporarily unavailable") || r.output.contains("retry"),
        "the limit is reported: {r:?}"
    );
    // The bomb keeps the sandbox at its process limit until the sandbox is stopped;
    // stopping must remove every one of them.
    assert!(
        std::process::Command::new("true")
            .status()
            .unwrap()
            .success()
    );
    let pid = t.sb.label.pid.unwrap();
    t.stop().await;
    assert!(rollout_sandbox::label::descendants(pid).is_empty());
}

#[tokio::test]
async fn a_gigabyte_of_output_is_capped() {
    let t = start(RuntimeKind::Bwrap, &[]).await;
    let r =
        t.sb.client
            .bash(
                "head -c 1000000000 /dev/zero; echo done",
                Some(Duration::from_secs(300)),
            )
            .await
            .unwrap();
    assert!(
        r.output.len() < 40_000,
        "{} bytes came back",
        r.output.len()
    );
    if r.timed_out {
        assert!(r.omitted_bytes > 0, "{r:?}");
    } else {
        assert_eq!(r.omitted_bytes, 1_000_000_005 - 32 * 1024);
        assert!(r.output.ends_with("done\n"));
    }
    host_and_sandbox_fine(&t).await;
    t.stop().await;
}

#[tokio::test]
async fn a_sleeping_command_is_interrupted() {
    let t = start(RuntimeKind::Bwrap, &[]).await;
    let r =
        t.sb.client
            .bash("sleep 100000", Some(Duration::from_millis(500)))
            .await
            .unwrap();
    assert!(r.timed_out && r.escalation.is_some(), "{r:?}");
    host_and_sandbox_fine(&t).await;
    t.stop().await;
}

#[tokio::test]
async fn filling_tmp_and_oversized_files_fail_cleanly() {
    let (root, mut req) = request(RuntimeKind::Bwrap, &[]);
    req.limits.tmp_bytes = 16 << 20;
    req.limits.file_size_bytes = 8 << 20;
    let t = start_with(root, req).await;
    let r =
        t.sb.client
            .bash("head -c 100000000 /dev/zero > /tmp/fill", None)
            .await
            .unwrap();
    assert_ne!(r.exit_code, Some(0));
    assert!(
        r.output.contains("No space left on device") || r.output.contains("File size limit"),
        "{r:?}"
    );
    let r =
        t.sb.client
            .bash("head -c 100000000 /dev/zero > /workspace/big", None)
            .await
            .unwrap();
    assert_ne!(r.exit_code, Some(0));
    assert!(r.output.contains("File size limit exceeded"), "{r:?}");
    let big = std::fs::metadata(t.workspace().join("big")).unwrap().len();
    assert!(big <= 8 << 20, "{big}");
    let py = t.sb.client.python("sum(range(10))", None).await.unwrap();
    assert_eq!(py.value.as_deref(), Some("45"));
    host_and_sandbox_fine(&t).await;
    t.stop().await;
}

#[tokio::test]
async fn the_label_finds_the_namespace_even_after_bwrap_itself_died() {
    let t = start(RuntimeKind::Bwrap, &[]).await;
    let init =
        t.sb.label
            .ns_init
            .expect("bwrap reported its namespace init");
    assert!(t.sb.label.live_ns_init().is_some());
    t.sb.client.bash("sleep 100000 &", None).await.unwrap();
    // Only the outer bwrap dies; the namespace lives on in a session of its own.
    let outer = t.sb.label.pid.unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(outer),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    t.sb.label.wait_gone(Duration::from_millis(200)).await;
    assert!(
        t.sb.label.live_ns_init().is_some(),
        "the sandbox outlived bwrap"
    );
    t.stop().await;
    assert!(
        rollout_sandbox::label::process_start(init).is_none()
            || rollout_sandbox::label::is_zombie(init)
    );
}

/// `/dev` holds the device nodes and nothing else: a file written there would be
/// memory the sandbox's limits do not count (a tmpfs of no size, on the host).
#[tokio::test]
async fn dev_holds_no_files_and_its_devices_still_work() {
    let (root, mut req) = request(RuntimeKind::Bwrap, &[]);
    // No file-size limit: only the filesystem may refuse.
    req.limits.file_size_bytes = 0;
    let t = start_with(root, req).await;
    for target in ["/dev/fill", "/dev/pts/../fill2"] {
        let r =
            t.sb.client
                .bash(&format!("head -c 67108864 /dev/zero > {target}"), None)
                .await
                .unwrap();
        assert_ne!(r.exit_code, Some(0), "{target}: {r:?}");
        assert!(
            r.output.contains("Read-only file system"),
            "{target}: {r:?}"
        );
    }
    let r =
        t.sb.client
            .bash(
                "mkdir /dev/d 2>&1; ls /dev | grep -c fill; echo x > /dev/null && \
                 head -c 3 /dev/urandom | wc -c && echo y > /dev/shm/ok && cat /dev/shm/ok",
                None,
            )
            .await
            .unwrap();
    assert!(r.output.contains("Read-only file system"), "{r:?}");
    assert!(r.output.ends_with("0\n3\ny\n"), "{r:?}");
    host_and_sandbox_fine(&t).await;
    t.stop().await;
}
