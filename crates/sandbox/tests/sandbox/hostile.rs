//! The hostile-agent suite on `bwrap`: what an RL policy that attacks its sandbox on
//! purpose would try (reach the host's services, read the worker's secrets, learn the
//! tools' marker tokens, plant code the tools import, stall or crash the server, fill
//! memory shared with other sandboxes), each asserting containment. The reward-forging
//! attacks, which need EVAL, are in the pipeline suite (`tests/pipeline/hostile.rs`).

use crate::helpers::{TestSandbox, request, start, start_with};
use rollout_sandbox::RuntimeKind;
use rollout_sandbox::protocol::{ErrorCode, ExecArgs, FileArgs};
use std::net::{IpAddr, Ipv4Addr, TcpListener};
use std::time::Duration;

async fn sh(t: &TestSandbox, command: &str) -> rollout_sandbox::protocol::BashResult {
    t.sb.client
        .bash(command, Some(Duration::from_secs(60)))
        .await
        .unwrap()
}

/// This host's own non-loopback IPv4 addresses.
fn host_addrs() -> Vec<Ipv4Addr> {
    nix::ifaddrs::getifaddrs()
        .unwrap()
        .filter_map(|i| i.address?.as_sockaddr_in().map(|a| a.ip()))
        .filter(|ip| !ip.is_loopback())
        .collect()
}

/// A `network: true` sandbox, where this worker can connect one. Where it cannot (no
/// slirp4netns, or a TUN device only root may open, as for an unprivileged worker on some
/// hosts), checks that the start is refused with the reason, never run on the host's
/// network, and gives `None`.
async fn networked() -> Option<TestSandbox> {
    let (root, mut req) = request(RuntimeKind::Bwrap, &[]);
    req.network = true;
    let settings = rollout_sandbox::net::NetSettings::default();
    if let Err(why) = rollout_sandbox::net::probe(&settings) {
        let err = rollout_sandbox::Runtimes::default()
            .get(RuntimeKind::Bwrap)
            .start(&req)
            .await
            .err()
            .expect("a network: true sandbox does not start without its own network");
        assert!(err.to_string().contains(&why), "{err}");
        eprintln!("network: true refused here, as it must be: {why}");
        return None;
    }
    Some(start_with(root, req).await)
}

#[tokio::test]
async fn a_networked_sandbox_cannot_reach_the_hosts_services() {
    // A service on the host's loopback (NATS, the gateway) and one on every address.
    let lo = TcpListener::bind("127.0.0.1:0").unwrap();
    let any = TcpListener::bind("0.0.0.0:0").unwrap();
    lo.set_nonblocking(true).unwrap();
    any.set_nonblocking(true).unwrap();
    let (lo_port, any_port) = (
        lo.local_addr().unwrap().port(),
        any.local_addr().unwrap().port(),
    );
    let Some(t) = networked().await else { return };
    let mut targets = vec![
        (IpAddr::from([127, 0, 0, 1]), lo_port),
        // The host's loopback seen through the user-mode network's gateway.
        (IpAddr::from([10, 0, 2, 2]), lo_port),
        (IpAddr::from([10, 0, 2, 2]), any_port),
    ];
    targets.extend(host_addrs().into_iter().map(|a| (IpAddr::V4(a), any_port)));
    for (ip, port) in &targets {
        let r = sh(
            &t,
            &format!("timeout 10 bash -c 'echo hi > /dev/tcp/{ip}/{port}'"),
        )
        .await;
        assert_ne!(r.exit_code, Some(0), "{ip}:{port} was reachable: {r:?}");
    }
    for l in [&lo, &any] {
        assert_eq!(
            l.accept().err().map(|e| e.kind()),
            Some(std::io::ErrorKind::WouldBlock),
            "a connection reached the host"
        );
    }
    // Private, link-local (cloud metadata) and the host's networks have no route; a
    // public address has one. UDP connect only consults the routing table.
    let probe = r#"
import socket
def route(ip):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect((ip, 53)); return "ok"
    except OSError as e:
        return "denied"
"#;
    t.sb.client.python(probe, None).await.unwrap();
    for ip in [
        "10.1.2.3",
        "172.16.0.1",
        "192.168.1.1",
        "169.254.169.254",
        "100.64.0.1",
    ]
    .into_iter()
    .map(String::from)
    .chain(host_addrs().iter().map(|a| a.to_string()))
    {
        let r =
            t.sb.client
                .python(&format!("route({ip:?})"), None)
                .await
                .unwrap();
        assert_eq!(r.value.as_deref(), Some("'denied'"), "{ip}: {r:?}");
    }
    let r = t.sb.client.python("route('8.8.8.8')", None).await.unwrap();
    assert_eq!(
        r.value.as_deref(),
        Some("'ok'"),
        "outbound has a route: {r:?}"
    );
    // The routes cannot be removed from inside.
    let r = sh(&t, "ip route del prohibit 10.0.0.0/8 2>&1; ip route").await;
    assert!(r.output.contains("prohibit 10.0.0.0/8"), "{r:?}");
    let r = sh(&t, "cat /etc/resolv.conf").await;
    assert_eq!(r.output.trim_end(), "nameserver 10.0.2.3\noptions edns0");
    t.stop().await;
}

#[tokio::test]
async fn a_networked_sandboxs_helper_dies_with_it() {
    let Some(t) = networked().await else { return };
    let helper = t.sb.label.live_net_helper().expect("slirp4netns recorded");
    t.stop().await;
    assert!(
        rollout_sandbox::label::is_zombie(helper)
            || rollout_sandbox::label::process_start(helper).is_none(),
        "slirp4netns {helper} outlived its sandbox"
    );
}

#[tokio::test]
async fn the_workers_environment_is_not_readable_inside() {
    // Cargo runs this test with CARGO_* variables; none may show in any process inside.
    assert!(std::env::vars().any(|(k, _)| k.starts_with("CARGO")));
    for network in [false, true] {
        let t = if network {
            let Some(t) = networked().await else { continue };
            t
        } else {
            start(RuntimeKind::Bwrap, &[]).await
        };
        t.sb.client.python("1", None).await.unwrap();
        let r = sh(
            &t,
            "for f in /proc/[0-9]*/environ; do echo \"== $f\"; tr '\\0' '\\n' < $f 2>&1; done",
        )
        .await;
        assert!(r.output.contains("== /proc/1/environ"), "{r:?}");
        assert!(!r.output.contains("CARGO"), "{}", r.output);
        assert!(!r.output.contains("ROLLOUT_PY_TOKEN"), "{}", r.output);
        t.stop().await;
    }
}

#[tokio::test]
async fn the_tools_processes_cannot_be_read_or_traced() {
    let t = start(RuntimeKind::Bwrap, &[]).await;
    t.sb.client.python("1", None).await.unwrap();
    // The server, the persistent shell (this command's parent) and the interpreter.
    let r = sh(
        &t,
        r#"python3 - <<'EOF'
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
names = {}
for p in os.listdir('/proc'):
    if p.isdigit():
        try:
            names[int(p)] = open('/proc/%s/cmdline' % p, 'rb').read().split(b'\0')
        except OSError:
            pass
me = os.getpid()
targets = [p for p, c in names.items() if p != me and c and (
    c[0].endswith(b'rollout-sandbox') or c[0].endswith(b'rollout-bash')
    or (b'-I' in c and b'-c' in c))]
print('targets', len(targets))
for p in targets:
    for what in ('mem', 'environ'):
        try:
            f = open('/proc/%d/%s' % (p, what), 'rb')
            f.read(1)
            print('READ', p, what)
        except OSError as e:
            print('denied', p, what, e.errno)
    PTRACE_ATTACH = 16
    if libc.ptrace(PTRACE_ATTACH, p, None, None) == 0:
        print('TRACED', p)
EOF"#,
    )
    .await;
    assert!(r.output.contains("targets 3"), "{r:?}");
    assert!(!r.output.contains("READ"), "{}", r.output);
    assert!(!r.output.contains("TRACED"), "{}", r.output);
    t.stop().await;
}

#[tokio::test]
async fn workspace_modules_do_not_shadow_the_interpreters_own() {
    let poison = "raise SystemExit('shadowed')\n";
    let t = start(
        RuntimeKind::Bwrap,
        &[
            ("ast.py", poison),
            ("json.py", poison),
            ("traceback.py", poison),
            ("sitecustomize.py", poison),
            ("mine.py", "VALUE = 41\n"),
        ],
    )
    .await;
    let r =
        t.sb.client
            .python("import mine\nmine.VALUE + 1", None)
            .await
            .unwrap();
    assert_eq!(r.value.as_deref(), Some("42"), "{r:?}");
    let r = t.sb.client.python("1/0", None).await.unwrap();
    assert!(r.error.unwrap().contains("ZeroDivisionError"));
    let r =
        t.sb.client
            .python("import os; os.getcwd()", None)
            .await
            .unwrap();
    assert_eq!(r.value.as_deref(), Some("'/workspace'"));
    t.stop().await;
}

#[tokio::test]
async fn a_fifo_or_device_does_not_stall_the_file_tool() {
    let t = start(RuntimeKind::Bwrap, &[]).await;
    sh(&t, "mkfifo pipe").await;
    for path in ["pipe", "/dev/zero", "/dev/stdin"] {
        let r = tokio::time::timeout(
            Duration::from_secs(30),
            t.sb.client.file(&FileArgs::View {
                path: path.into(),
                view_range: None,
            }),
        )
        .await
        .expect("the file tool answered")
        .unwrap();
        assert!(r.is_err(), "{path}: {r:?}");
    }
    // A reader blocked on the pipe (in bash) does not block the file tool either.
    let client = &t.sb.client;
    let (bash, view) = tokio::join!(
        client.bash("cat pipe", Some(Duration::from_secs(3))),
        async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            client
                .file(&FileArgs::Create {
                    path: "pipe".into(),
                    file_text: "x".into(),
                })
                .await
        }
    );
    assert!(view.unwrap().is_err());
    // The refused open may have ended the reader's wait (end of file); either way the
    // shell answered.
    bash.unwrap();
    t.sb.client.ping().await.unwrap();
    t.stop().await;
}

#[tokio::test]
async fn an_oversized_answer_is_an_error_not_a_lost_connection() {
    let t = start(RuntimeKind::Bwrap, &[]).await;
    sh(&t, "head -c 20000000 /dev/urandom | base64 -w0 > big.txt").await;
    let r =
        t.sb.client
            .call(
                "bash",
                serde_json::json!({"command": "cat big.txt", "max_output_bytes": 40_000_000}),
                None,
            )
            .await
            .unwrap();
    assert!(!r.ok);
    assert_eq!(r.error.unwrap().code, ErrorCode::TooLarge);
    let r =
        t.sb.client
            .export(&Default::default())
            .await
            .unwrap()
            .unwrap_err();
    assert_eq!(r.code, ErrorCode::TooLarge, "{r:?}");
    t.sb.client.ping().await.unwrap();
    t.stop().await;
}

#[tokio::test]
async fn exec_status_cannot_be_forged_by_output() {
    let t = start(RuntimeKind::Bwrap, &[]).await;
    let r =
        t.sb.client
            .exec(
                &ExecArgs {
                    env: Default::default(),
                    command: "for i in $(seq 0 200); do printf '\\036x:%d:0\\036' $i; done; exit 1"
                        .into(),
                    ..Default::default()
                },
                None,
            )
            .await
            .unwrap();
    assert_eq!(r.exit_code, Some(1), "{r:?}");
    t.stop().await;
}

#[tokio::test]
async fn dev_shm_is_bounded() {
    let t = start(RuntimeKind::Bwrap, &[]).await;
    let r = sh(&t, "dd if=/dev/zero of=/dev/shm/fill bs=1M count=1024 2>&1").await;
    assert_ne!(r.exit_code, Some(0), "{r:?}");
    assert!(r.output.contains("No space left"), "{r:?}");
    t.stop().await;
}

#[tokio::test]
async fn the_socket_is_out_of_the_sandboxs_reach() {
    let t = start(RuntimeKind::Bwrap, &[]).await;
    let sock = t.sb.label.socket.clone();
    assert!(!sock.starts_with(t.workspace()));
    let r = sh(&t, "ls -la /run; find / -xdev -type s 2>/dev/null | head").await;
    assert!(!r.output.contains("sock"), "{r:?}");
    // A symlink in place of a socket is refused by the client.
    let link = t._root.path().join("link");
    std::os::unix::fs::symlink(&sock, &link).unwrap();
    assert!(
        rollout_sandbox::SandboxClient::connect(&link)
            .await
            .is_err()
    );
    t.stop().await;
}

#[tokio::test]
async fn sandbox_directories_are_private() {
    use std::os::unix::fs::PermissionsExt;
    let t = start(RuntimeKind::Bwrap, &[]).await;
    sh(&t, "cp /usr/bin/id suid && chmod 4755 suid").await;
    let mode = std::fs::metadata(&t.sb.label.dir)
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o077, 0, "sandbox dir mode {mode:o}");
    // Another host user can neither reach nor run what the sandbox made.
    if nix::unistd::geteuid().is_root() {
        let suid = t.workspace().join("suid");
        let out = std::process::Command::new("runuser")
            .args(["-u", "nobody", "--"])
            .arg(&suid)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{out:?}");
    }
    t.stop().await;
}

#[tokio::test]
async fn memory_is_limited_per_sandbox_not_per_process() {
    let cgroups = rollout_sandbox::cgroup::Cgroups::probe(None);
    if !cgroups.enforced() {
        crate::prerequisite::missing(
            "memory_is_limited_per_sandbox_not_per_process",
            &format!("this machine gives the worker no cgroups ({cgroups:?})"),
        );
        return;
    }
    let (root, mut req) = request(RuntimeKind::Bwrap, &[]);
    req.limits.memory_bytes = 256 << 20;
    let t = start_with(root, req).await;
    assert!(!t.sb.label.cgroups.is_empty(), "the sandbox has a cgroup");
    // Three processes of 150 MB each: fine under a per-process limit, not together.
    let r = sh(
        &t,
        "for i in 1 2 3; do python3 -c \"x = b'x' * (150 << 20); import time; time.sleep(3)\" & done; wait; echo done",
    )
    .await;
    assert!(r.output.contains("done"), "{r:?}");
    let peak =
        t.sb.label
            .cgroups
            .iter()
            .find_map(|d| {
                ["memory.peak", "memory.max_usage_in_bytes"]
                    .iter()
                    .find_map(|f| std::fs::read_to_string(d.join(f)).ok())
            })
            .and_then(|s| s.trim().parse::<u64>().ok())
            .expect("the memory cgroup reports its peak");
    assert!(peak <= 256 << 20, "the sandbox held {peak} bytes");
    host_is_fine(&t).await;
    let dirs = t.sb.label.cgroups.clone();
    t.stop().await;
    assert!(dirs.iter().all(|d| !d.exists()), "stop removes the cgroups");
}

#[tokio::test]
async fn one_sandboxs_fork_bomb_does_not_starve_another() {
    let (root, mut req) = request(RuntimeKind::Bwrap, &[]);
    req.limits.processes = 64;
    let bomb = start_with(root, req).await;
    let other = start(RuntimeKind::Bwrap, &[]).await;
    let fork = bomb.sb.client.bash(
        "f() { f | f & }; f 2>/dev/null; sleep 3; echo survived",
        Some(Duration::from_secs(30)),
    );
    let run = async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        sh(
            &other,
            "for i in $(seq 50); do /bin/true || exit 1; done; echo ran",
        )
        .await
    };
    let (_, r) = tokio::join!(fork, run);
    assert!(r.output.contains("ran"), "{r:?}");
    bomb.stop().await;
    other.stop().await;
}

async fn host_is_fine(t: &TestSandbox) {
    let r = sh(t, "echo alive").await;
    assert_eq!(r.output, "alive\n");
}

/// Set in the unprivileged re-run of this suite, so that it does not start another.
const UNPRIVILEGED_RUN: &str = "ROLLOUT_TEST_UNPRIVILEGED";

/// The whole suite again as an unprivileged user, which is how workers run on a shared
/// cluster: when this run is root and the machine lets an unprivileged user make the
/// namespaces bwrap needs, this test binary and the sandbox server are copied where
/// `nobody` can run them and the `hostile::` tests are run as `nobody`. (A run that is not
/// root already is that run.) What cannot hold without root (per-sandbox cgroups, the
/// workspace quota) is reported as not enforced, never silently missing.
///
/// Where the host's TUN device is root's only (mode 0600), the first run checks that
/// `network: true` is refused with the reason; a second run then gives `nobody` a TUN
/// device it may open, in a mount namespace of its own (nothing on the host changes),
/// so the unprivileged network path is attacked as well.
#[test]
fn the_suite_holds_for_an_unprivileged_worker() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    if std::env::var_os(UNPRIVILEGED_RUN).is_some() {
        return; // the run this test starts, as `nobody`: only the attacks run there
    }
    if !nix::unistd::geteuid().is_root() {
        crate::prerequisite::missing(
            "the_suite_holds_for_an_unprivileged_worker",
            "it runs the suite as another user, which needs root",
        );
        return;
    }
    let nobody = nix::unistd::User::from_name("nobody")
        .unwrap()
        .expect("a `nobody` user");
    let (uid, gid) = (nobody.uid.as_raw(), nobody.gid.as_raw());
    let can_unshare = std::process::Command::new("bwrap")
        .args([
            "--unshare-all",
            "--unshare-user",
            "--ro-bind",
            "/",
            "/",
            "true",
        ])
        .uid(uid)
        .gid(gid)
        .status()
        .is_ok_and(|s| s.success());
    if !can_unshare {
        crate::prerequisite::missing(
            "the_suite_holds_for_an_unprivileged_worker",
            "an unprivileged user cannot create user namespaces here",
        );
        return;
    }
    let dir = tempfile::Builder::new()
        .prefix("rsb-nobody")
        .tempdir()
        .unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let me = dir.path().join("suite");
    let server = dir.path().join("rollout-sandbox");
    crate::helpers::copy_executable(&std::env::current_exe().unwrap(), &me);
    crate::helpers::copy_executable(&crate::helpers::server_bin(), &server);
    let home = dir.path().join("home");
    std::fs::create_dir(&home).unwrap();
    std::os::unix::fs::chown(&home, Some(uid), Some(gid)).unwrap();
    let tun_is_roots =
        std::fs::metadata("/dev/net/tun").is_ok_and(|m| m.permissions().mode() & 0o006 != 0o006);
    let as_nobody = format!("setpriv --reuid={uid} --regid={gid} --clear-groups");
    let mut runs = vec![("as the host has it", as_nobody.clone())];
    if tun_is_roots {
        runs.push((
            "with a TUN device nobody may open",
            format!(
                "d=$(mktemp -d) && mount -t tmpfs tmpfs \"$d\" && mknod -m 666 \"$d/tun\" c 10 200 \
                 && mount --bind \"$d/tun\" /dev/net/tun && exec {as_nobody}"
            ),
        ));
    }
    for (what, prefix) in runs {
        let out = std::process::Command::new("unshare")
            .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
            .arg(format!("{prefix} \"$@\""))
            .arg("sh")
            .arg(&me)
            // An unprivileged worker has no cgroups, by design: the memory-limit test
            // needs them, and runs in the root pass only.
            .args([
                "hostile::",
                "--skip",
                "hostile::memory_is_limited_per_sandbox_not_per_process",
                "--test-threads",
                "2",
            ])
            .env(UNPRIVILEGED_RUN, "1")
            .env("ROLLOUT_TEST_SANDBOX_BIN", &server)
            .env("HOME", &home)
            .env("TMPDIR", &home)
            .current_dir(&home)
            .output()
            .unwrap();
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "as nobody, {what}:\n{said}");
        // The attacks did run (not zero tests by a filter gone wrong).
        assert!(
            said.contains(
                "test hostile::a_networked_sandbox_cannot_reach_the_hosts_services ... ok"
            ),
            "{said}"
        );
        eprintln!("as nobody, {what}:\n{said}");
    }
}
