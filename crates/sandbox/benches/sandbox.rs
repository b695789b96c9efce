//! Sandbox tool benchmarks (not tests): run with `cargo bench --bench sandbox`.
//!
//! Every figure is printed beside a baseline measured in the same run:
//!
//! 1. **bash**: `echo hi` and `ls /usr/lib | wc -l` through the sandbox server's bash tool
//!    (a client on the Unix socket, as RUN uses it), p50/p99, beside a raw pty round trip
//!    (a bash on a pseudo-terminal driven directly: write the command and an end marker,
//!    read until the marker) and beside tmux driven by `send-keys` and `capture-pane`
//!    polling every 10 ms, the way tmux-based agent runtimes run commands.
//! 2. **python**: `1+1` through the python tool (plain CPython engine and IPython engine)
//!    beside a Jupyter kernel driven by `jupyter_client` (measured by a Python client in
//!    the same run; needs `pip install jupyter_client ipykernel`).
//! 3. **sandbox start**: a `bwrap` sandbox from the start call to its first answered
//!    ping (the server's bash is up by then), beside the floor of `bwrap … /bin/true`,
//!    with launchers made ahead of time (`sandbox.launcher_pool`, the default) and
//!    without (each start spawns bwrap), one after the other in the same loop; then the
//!    same with `network: true` and (for a root worker) with the workspace's own
//!    filesystem, each beside the plain start.
//! 4. **memory**: the sandbox server's resident set after the runs above.
//!
//! Set `BENCH_QUICK=1` for a short smoke run, `BENCH_STARTS_ONLY=1` for benchmark 3
//! alone.

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use rollout_sandbox::{Label, RuntimeKind, Runtimes, Sandbox, SandboxLimits, StartRequest};
use rollout_test_support::bench as common;

fn pct(sorted: &[Duration], p: f64) -> Duration {
    sorted[common::rank(sorted.len(), p).min(sorted.len() - 1)]
}

struct Stats {
    p50: Duration,
    p99: Duration,
}

fn stats(mut v: Vec<Duration>) -> Stats {
    v.sort();
    Stats {
        p50: pct(&v, 0.5),
        p99: pct(&v, 0.99),
    }
}

fn us(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us >= 10_000.0 {
        format!("{:.1} ms", us / 1000.0)
    } else {
        format!("{us:.0} µs")
    }
}

fn request(root: &Path, kind: RuntimeKind, env: &[(&str, &str)]) -> StartRequest {
    let id = uuid::Uuid::new_v4().simple().to_string();
    let dir = root.join(&id[..12]);
    std::fs::create_dir_all(dir.join("workspace")).unwrap();
    StartRequest {
        label: Label::new(&id, "bench", kind, &dir),
        dir,
        server_bin: PathBuf::from(env!("CARGO_BIN_EXE_rollout-sandbox")),
        network: false,
        env: env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        limits: SandboxLimits::default(),
        image: None,
        fakeroot: false,
        ro_binds: Vec::new(),
        die_with_parent: false,
        ready_timeout: Duration::from_secs(30),
    }
}

async fn start(root: &Path, kind: RuntimeKind, env: &[(&str, &str)]) -> Sandbox {
    Runtimes::default()
        .get(kind)
        .start(&request(root, kind, env))
        .await
        .expect("sandbox starts")
}

/// A bash on a pty driven directly: the floor under any tool server.
struct RawPty {
    master: OwnedFd,
    _child: std::process::Child,
}

impl RawPty {
    fn start() -> RawPty {
        use nix::sys::termios::{self, LocalFlags, OutputFlags, SetArg};
        use std::os::unix::process::CommandExt;
        let pty = nix::pty::openpty(None, None).unwrap();
        let mut t = termios::tcgetattr(&pty.slave).unwrap();
        t.local_flags.remove(LocalFlags::ECHO);
        t.output_flags.remove(OutputFlags::ONLCR);
        termios::tcsetattr(&pty.slave, SetArg::TCSANOW, &t).unwrap();
        let mut cmd = std::process::Command::new("bash");
        cmd.args(["--noprofile", "--norc", "--noediting", "-i"])
            .env("PS1", "")
            .env("PS2", "")
            .stdin(Stdio::from(pty.slave.try_clone().unwrap()))
            .stdout(Stdio::from(pty.slave.try_clone().unwrap()))
            .stderr(Stdio::from(pty.slave));
        // SAFETY: setsid and ioctl are async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                nix::unistd::setsid().map_err(std::io::Error::from)?;
                libc::ioctl(0, libc::TIOCSCTTY, 0);
                Ok(())
            });
        }
        let child = cmd.spawn().unwrap();
        let mut raw = RawPty {
            master: pty.master,
            _child: child,
        };
        raw.run("true");
        raw
    }

    /// Writes the command with an end marker and reads until the marker.
    fn run(&mut self, command: &str) -> Vec<u8> {
        let line = format!("{command}; printf '\\036END\\036'\n");
        nix::unistd::write(self.master.as_fd(), line.as_bytes()).unwrap();
        let mut out = Vec::new();
        let mut buf = [0u8; 65536];
        loop {
            let n = nix::unistd::read(self.master.as_fd(), &mut buf).unwrap();
            out.extend_from_slice(&buf[..n]);
            if out.ends_with(b"\x1eEND\x1e") {
                return out;
            }
        }
    }
}

/// tmux driven the way tmux-based agent runtimes do it.
struct Tmux {
    session: String,
    seq: u64,
}

impl Tmux {
    fn start() -> Option<Tmux> {
        let session = format!("rollout-bench-{}", std::process::id());
        let ok = std::process::Command::new("tmux")
            .args([
                "new-session",
                "-d",
                "-s",
                &session,
                "-x",
                "200",
                "-y",
                "50",
                "bash --noprofile --norc",
            ])
            .status()
            .ok()?
            .success();
        ok.then_some(Tmux { session, seq: 0 })
    }

    fn run(&mut self, command: &str) {
        self.seq += 1;
        let marker = format!("__DONE_{}__", self.seq);
        let line = format!("{command}; echo {marker}");
        let tmux = |args: &[&str]| {
            std::process::Command::new("tmux")
                .args(args)
                .output()
                .unwrap()
        };
        tmux(&["send-keys", "-t", &self.session, &line, "Enter"]);
        loop {
            #[allow(
                clippy::disallowed_methods,
                reason = "the tmux baseline polls from the bench's own thread"
            )]
            std::thread::sleep(Duration::from_millis(10));
            let screen = tmux(&["capture-pane", "-p", "-t", &self.session]);
            // The marker appears twice once done: in the typed line and in the output.
            if String::from_utf8_lossy(&screen.stdout)
                .matches(&marker)
                .count()
                >= 2
            {
                tmux(&["clear-history", "-t", &self.session]);
                tmux(&["send-keys", "-t", &self.session, "clear", "Enter"]);
                return;
            }
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = std::process::Command::new("tmux")
            .args(["kill-session", "-t", &self.session])
            .status();
    }
}

async fn bash_row(
    sb: &Sandbox,
    raw: &mut RawPty,
    tmux: &mut Option<Tmux>,
    command: &str,
    n: usize,
) {
    for _ in 0..n / 10 {
        sb.client.bash(command, None).await.unwrap();
        raw.run(command);
    }
    let mut ours = Vec::with_capacity(n);
    let mut inside = Vec::with_capacity(n);
    let mut floor = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let r = sb.client.bash(command, None).await.unwrap();
        ours.push(t.elapsed());
        inside.push(Duration::from_micros(r.elapsed_us));
        assert_eq!(r.exit_code, Some(0));
        let t = Instant::now();
        raw.run(command);
        floor.push(t.elapsed());
    }
    let (ours, inside, floor) = (stats(ours), stats(inside), stats(floor));
    let ratio = ours.p50.as_secs_f64() / floor.p50.as_secs_f64();
    let tm = tmux.as_mut().map(|t| {
        let runs = if common::quick() { 5 } else { 50 };
        let v: Vec<Duration> = (0..runs)
            .map(|_| {
                let s = Instant::now();
                t.run(command);
                s.elapsed()
            })
            .collect();
        stats(v)
    });
    println!(
        "| bash `{command}` ({n} calls) | p50 {}, p99 {} (in the server: p50 {}) | raw pty p50 {}, p99 {}; tmux polling p50 {} | {ratio:.2}× raw pty{} |",
        us(ours.p50),
        us(ours.p99),
        us(inside.p50),
        us(floor.p50),
        us(floor.p99),
        tm.as_ref()
            .map(|s| us(s.p50))
            .unwrap_or_else(|| "n/a (no tmux)".into()),
        tm.as_ref()
            .map(|s| format!(
                ", tmux/ours {:.0}×",
                s.p50.as_secs_f64() / ours.p50.as_secs_f64()
            ))
            .unwrap_or_default(),
    );
}

async fn python_row(sb: &Sandbox, n: usize, label: &str) -> Stats {
    for _ in 0..n / 10 {
        sb.client.python("1+1", None).await.unwrap();
    }
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let r = sb.client.python("1+1", None).await.unwrap();
        v.push(t.elapsed());
        assert_eq!(r.value.as_deref(), Some("2"), "{label}");
    }
    stats(v)
}

/// `1+1` on a Jupyter kernel through jupyter_client, timed by the Python client.
fn jupyter(n: usize) -> Option<(f64, f64)> {
    let script = format!(
        r#"
import time, statistics
from jupyter_client.manager import start_new_kernel
km, kc = start_new_kernel(kernel_name="python3")
def run():
    msg_id = kc.execute("1+1")
    while True:
        m = kc.get_iopub_msg(timeout=10)
        if m["parent_header"].get("msg_id") == msg_id and m["msg_type"] == "status" and m["content"]["execution_state"] == "idle":
            return
for _ in range(20): run()
ts = []
for _ in range({n}):
    t = time.perf_counter(); run(); ts.append(time.perf_counter() - t)
ts.sort()
print(ts[len(ts)//2] * 1e6, ts[min(len(ts)-1, int(round((len(ts)-1)*0.99)))] * 1e6)
kc.stop_channels(); km.shutdown_kernel(now=True)
"#
    );
    let out = std::process::Command::new("python3")
        .arg("-c")
        .arg(script)
        .output()
        .ok()?;
    if !out.status.success() {
        eprintln!(
            "jupyter baseline skipped: {}",
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or("")
        );
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let mut it = text
        .split_whitespace()
        .filter_map(|s| s.parse::<f64>().ok());
    Some((it.next()?, it.next()?))
}

fn rss_kib(pid: i32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Round trip of one byte through a `cat` child over pipes: two process wake-ups, the
/// floor under any request/response between processes on this machine right now.
fn wakeup_floor(n: usize) -> Duration {
    use std::io::{Read, Write};
    let mut cat = std::process::Command::new("cat")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut tx = cat.stdin.take().unwrap();
    let mut rx = cat.stdout.take().unwrap();
    let mut b = [0u8; 1];
    let v: Vec<Duration> = (0..n)
        .map(|_| {
            let t = Instant::now();
            tx.write_all(b"x").unwrap();
            rx.read_exact(&mut b).unwrap();
            t.elapsed()
        })
        .collect();
    drop(tx);
    let _ = cat.wait();
    stats(v).p50
}

fn bwrap_true() -> Duration {
    let t = Instant::now();
    let ok = std::process::Command::new("bwrap")
        .args([
            "--unshare-all",
            "--unshare-user",
            "--ro-bind",
            "/usr",
            "/usr",
            "--symlink",
            "usr/lib",
            "/lib",
            "--symlink",
            "usr/lib64",
            "/lib64",
            "--symlink",
            "usr/bin",
            "/bin",
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "/bin/true",
        ])
        .status()
        .unwrap()
        .success();
    assert!(ok, "bwrap works");
    t.elapsed()
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    if !common::started_by_cargo_bench("sandbox") {
        return;
    }
    let n = if common::quick() { 200 } else { 5000 };
    let root = tempfile::Builder::new().prefix("rsb").tempdir().unwrap();
    println!("| benchmark | result | baseline (same run) | ratio |");
    println!("|---|---|---|---|");
    if std::env::var_os("BENCH_STARTS_ONLY").is_some() {
        start_rows(root.path(), &Runtimes::default()).await;
        return;
    }

    // How fast this machine wakes a blocked process right now (virtual machines vary a
    // lot: idle vCPUs are slow to wake), printed so the absolute figures can be read.
    let floor_before = wakeup_floor(n);

    // 1. bash.
    let local = start(
        root.path(),
        RuntimeKind::Local,
        &[("ROLLOUT_SANDBOX_PYTHON_ENGINE", "cpython")],
    )
    .await;
    let mut raw = RawPty::start();
    let mut tmux = Tmux::start();
    bash_row(&local, &mut raw, &mut tmux, "echo hi", n).await;
    bash_row(&local, &mut raw, &mut tmux, "ls /usr/lib | wc -l", n / 5).await;

    // 2. python.
    let ipy_sb = python_rows(root.path(), &local, n).await;

    // 4. memory (before the sandboxes go).
    let rss = local.label.live_pid().and_then(rss_kib);
    let rss_ipy = ipy_sb.label.live_pid().and_then(rss_kib);

    // 3. sandbox start.
    let backends = Runtimes::default();
    start_rows(root.path(), &backends).await;
    println!(
        "| sandbox server RSS after the runs above | {} (CPython engine sandbox), {} (IPython) | — | — |",
        rss.map(|k| format!("{:.1} MB", k as f64 / 1024.0))
            .unwrap_or_default(),
        rss_ipy
            .map(|k| format!("{:.1} MB", k as f64 / 1024.0))
            .unwrap_or_default(),
    );
    println!(
        "| process wake-up floor: 1-byte round trip through a `cat` child ({n} trips) | p50 {} before the runs, {} after | — | — |",
        us(floor_before),
        us(wakeup_floor(n))
    );
    for sb in [local, ipy_sb] {
        drop(sb.client);
        backends.stop(&sb.label.dir).await.unwrap();
    }
}

/// Benchmark 2: `1+1` in the CPython engine of `local`, then in the IPython engine of a
/// sandbox started for it (returned, for the memory row), beside a Jupyter kernel.
async fn python_rows(root: &Path, local: &Sandbox, n: usize) -> Sandbox {
    let plain = python_row(local, n, "cpython").await;
    let ipy_sb = start(
        root,
        RuntimeKind::Local,
        &[("ROLLOUT_SANDBOX_PYTHON_ENGINE", "ipython")],
    )
    .await;
    let ipy = python_row(&ipy_sb, n / 5, "ipython").await;
    let jup = jupyter(if common::quick() { 100 } else { 1000 });
    let jup_text = jup
        .map(|(p50, p99)| {
            format!("Jupyter kernel via jupyter_client p50 {p50:.0} µs, p99 {p99:.0} µs")
        })
        .unwrap_or_else(|| "Jupyter: n/a (pip install jupyter_client ipykernel)".into());
    let ratio = |s: &Stats| {
        jup.map(|(p50, _)| {
            format!(
                "{:.1}× faster than Jupyter",
                p50 / (s.p50.as_secs_f64() * 1e6)
            )
        })
        .unwrap_or_default()
    };
    println!(
        "| python `1+1`, CPython engine ({n} calls) | p50 {}, p99 {} | {jup_text} | {} |",
        us(plain.p50),
        us(plain.p99),
        ratio(&plain)
    );
    println!(
        "| python `1+1`, IPython engine ({} calls) | p50 {}, p99 {} | (same) | {} |",
        n / 5,
        us(ipy.p50),
        us(ipy.p99),
        ratio(&ipy)
    );
    ipy_sb
}

/// Benchmark 3: bwrap sandbox starts, plain (beside bare `bwrap /bin/true`), with
/// `network: true`, and with the workspace quota where this machine enforces one.
async fn start_rows(root: &Path, backends: &Runtimes) {
    let starts = if common::quick() { 10 } else { 100 };
    // The same node without launchers made ahead of time: each start spawns bwrap and
    // moves it into its cgroups while bwrap waits.
    let spawning = bwrap_runtimes(0, true);
    // The same with the `/etc` entries bound one by one, as before the prepared view.
    let per_entry = bwrap_runtimes(backends.bwrap.launchers.depth(), false);
    let _ = timed_start(&per_entry, &request(root, RuntimeKind::Bwrap, &[]), "first").await;
    let mut ready_per_entry = Vec::new();
    let mut ready = Vec::new();
    let mut ready_spawned = Vec::new();
    let mut floor = Vec::new();
    let mut profiles = Vec::new();
    let mut profiles_spawned = Vec::new();
    // A first start fills the pool (its own launcher is made on its path).
    let _ = timed_start(backends, &request(root, RuntimeKind::Bwrap, &[]), "first").await;
    let missed_before = backends.bwrap.launchers.misses();
    for _ in 0..starts {
        floor.push(bwrap_true());
        let req = request(root, RuntimeKind::Bwrap, &[]);
        let (t, profile) = timed_start(&spawning, &req, "bwrap sandbox, spawned").await;
        ready_spawned.push(t);
        profiles_spawned.push(profile);
        let req = request(root, RuntimeKind::Bwrap, &[]);
        let (t, _) = timed_start(&per_entry, &req, "bwrap sandbox, /etc per entry").await;
        ready_per_entry.push(t);
        let req = request(root, RuntimeKind::Bwrap, &[]);
        let (t, profile) = timed_start(backends, &req, "bwrap sandbox").await;
        ready.push(t);
        profiles.push(profile);
    }
    let missed = backends.bwrap.launchers.misses() - missed_before;
    // The same with `network: true`: slirp4netns and the deny routes on top.
    let mut ready_net = Vec::new();
    for _ in 0..starts {
        let mut req = request(root, RuntimeKind::Bwrap, &[]);
        req.network = true;
        ready_net.push(
            timed_start(backends, &req, "networked bwrap sandbox")
                .await
                .0,
        );
    }
    let quota = rollout_sandbox::quota::WorkspaceQuota::probe();
    let back_to_back = quota_starts(root, backends, &quota, starts, false).await;
    let settled = quota_starts(root, backends, &quota, starts, true).await;
    let (ready, floor, ready_net) = (stats(ready), stats(floor), stats(ready_net));
    let spawned = stats(ready_spawned);
    print_vs_bare(
        &format!(
            "bwrap sandbox start from a launcher, `/etc` bound entry by entry (`etc_view` off) → tools ready ({starts} starts)"
        ),
        &stats(ready_per_entry),
        &floor,
    );
    print_vs_bare(
        &format!(
            "bwrap sandbox start, bwrap spawned at the start (`launcher_pool = 0`) → tools ready ({starts} starts)"
        ),
        &spawned,
        &floor,
    );
    print_vs_bare(
        &format!(
            "bwrap sandbox start from a launcher made ahead of time (`launcher_pool = {}`) → tools ready ({starts} starts, {missed} found none ready)",
            backends.bwrap.launchers.depth()
        ),
        &ready,
        &floor,
    );
    println!(
        "| bwrap sandbox with `network: true` start → tools ready ({starts} starts) | p50 {}, p99 {} | the same without network p50 {} | +{} for its own network |",
        us(ready_net.p50),
        us(ready_net.p99),
        us(ready.p50),
        us(ready_net.p50.saturating_sub(ready.p50))
    );
    print_quota_rows(&quota, starts, [&back_to_back, &settled], &ready);
    print_profile("plain bwrap start, bwrap spawned", &profiles_spawned);
    print_profile("plain bwrap start from a launcher", &profiles);
    for (run, how) in [(&back_to_back, "back to back"), (&settled, "pool full")] {
        if !run.profiles.is_empty() {
            print_profile(
                &format!("bwrap start with the workspace quota, {how}"),
                &run.profiles,
            );
        }
    }
}

/// The quota rows: each run of [`quota_starts`] against the bare bwrap starts that
/// alternated with it and the plain start (`plain`, p50).
fn print_quota_rows(
    quota: &rollout_sandbox::quota::WorkspaceQuota,
    starts: usize,
    [back_to_back, settled]: [&QuotaRun; 2],
    ready: &Stats,
) {
    if back_to_back.ready.is_empty() {
        println!(
            "| bwrap sandbox with its workspace quota | not measured: {:?} | — | — |",
            quota
        );
    }
    for (run, how) in [
        (&back_to_back, "starts back to back"),
        (&settled, "the pool full before each start"),
    ] {
        if run.ready.is_empty() {
            continue;
        }
        let (q, bare) = (stats(run.ready.clone()), stats(run.floor.clone()));
        println!(
            "| bwrap sandbox with its workspace quota (10 GiB ext4 image from the pool, root worker; {how}) start → tools ready ({starts} starts, {} found the pool empty) | p50 {}, p99 {} | bare bwrap alternating with it p50 {}; the plain start p50 {} | +{} over the plain start; {:.2}× bare bwrap |",
            run.misses,
            us(q.p50),
            us(q.p99),
            us(bare.p50),
            us(ready.p50),
            us(q.p50.saturating_sub(ready.p50)),
            q.p50.as_secs_f64() / bare.p50.as_secs_f64()
        );
    }
}

/// Backends whose bwrap keeps `launchers` launchers ready and binds the prepared `/etc`
/// (`etc_view`) or its entries one by one.
fn bwrap_runtimes(launchers: usize, etc_view: bool) -> Runtimes {
    Runtimes {
        bwrap: rollout_sandbox::bwrap::BwrapRuntime {
            launchers: rollout_sandbox::launcher::LauncherPool::new(launchers),
            etc_view,
            ..Default::default()
        },
        ..Default::default()
    }
}

/// Prints a row of starts `s` beside bare bwrap's `floor`.
fn print_vs_bare(what: &str, s: &Stats, floor: &Stats) {
    println!(
        "| {what} | p50 {}, p99 {} | `bwrap … /bin/true` p50 {} | +{} over bare bwrap; {:.2}× bare bwrap |",
        us(s.p50),
        us(s.p99),
        us(floor.p50),
        us(s.p50.saturating_sub(floor.p50)),
        s.p50.as_secs_f64() / floor.p50.as_secs_f64()
    );
}

/// Prints the p50 of each step of `profiles` (see `rollout_sandbox::profile`), in the
/// order the steps ended in the first start.
fn print_profile(what: &str, profiles: &[Vec<(&'static str, Duration)>]) {
    let Some(first) = profiles.first() else {
        return;
    };
    println!();
    println!(
        "| step of the {what} ({} starts) | p50 | p99 |",
        profiles.len()
    );
    println!("|---|---|---|");
    for (name, _) in first {
        let v: Vec<Duration> = profiles
            .iter()
            .filter_map(|p| p.iter().find(|(n, _)| n == name).map(|(_, d)| *d))
            .collect();
        let s = stats(v);
        println!("| {name} | {} | {} |", us(s.p50), us(s.p99));
    }
}

/// One start's steps and how long each took.
type Steps = Vec<(&'static str, Duration)>;

/// Starts a bwrap sandbox for `req` and stops it again; returns how long it took to be
/// ready (`what` names it if it fails) and its steps.
async fn timed_start(backends: &Runtimes, req: &StartRequest, what: &str) -> (Duration, Steps) {
    let t = Instant::now();
    let sb = backends
        .get(RuntimeKind::Bwrap)
        .start(req)
        .await
        .expect(what);
    let ready = t.elapsed();
    drop(sb.client);
    backends.stop(&req.dir).await.unwrap();
    (ready, sb.profile.steps())
}

/// Bwrap sandbox starts with the workspace's own filesystem (the disk quota of a root
/// worker), taken from a pool of images mounted ahead of time as a node keeps it (see
/// `rollout_sandbox::pool`; filled before the first start, its chores done after each
/// start as a node does them), unmounted on stop, each beside a bare `bwrap /bin/true`
/// for the same run's floor. With `settled`, each start waits (untimed) until the pool
/// is full again, as on a node whose starts are not back to back; without, the pool's
/// chores of one start run into the next. None where `quota` is not enforced.
async fn quota_starts(
    root: &Path,
    backends: &Runtimes,
    quota: &rollout_sandbox::quota::WorkspaceQuota,
    starts: usize,
    settled: bool,
) -> QuotaRun {
    let mut run = QuotaRun::default();
    let bytes = SandboxLimits::default().workspace_bytes;
    // The pool an operator turns on with `sandbox.workspace_pool = 2` (off by default).
    let depth = 2;
    let pool = rollout_sandbox::pool::WorkspacePool::new(quota.clone(), root, depth);
    if quota.enforced() {
        pool.refill(bytes);
        wait_full(&pool, bytes, depth).await;
    }
    for _ in 0..(if quota.enforced() { starts } else { 0 }) {
        if settled {
            wait_full(&pool, bytes, depth).await;
        }
        run.floor.push(bwrap_true());
        let req = request(root, RuntimeKind::Bwrap, &[]);
        if pool.ready(bytes) == 0 {
            run.misses += 1;
        }
        let t = Instant::now();
        let taken = pool
            .mount(&req.dir, &req.workspace(), bytes)
            .await
            .expect("workspace filesystem");
        let mounted = t.elapsed();
        let sb = backends
            .get(RuntimeKind::Bwrap)
            .start(&req)
            .await
            .expect("bwrap sandbox with a quota");
        run.ready.push(t.elapsed());
        // As a node does: the pool's chores after the start.
        pool.settle(taken);
        let mut steps = vec![("workspace image mounted", mounted)];
        steps.extend(sb.profile.steps());
        run.profiles.push(steps);
        drop(sb.client);
        backends.stop(&req.dir).await.unwrap();
    }
    pool.close().await;
    run
}

/// What [`quota_starts`] measured.
#[derive(Default)]
struct QuotaRun {
    /// Start → tools ready, per start.
    ready: Vec<Duration>,
    /// Bare `bwrap /bin/true`, one before each start.
    floor: Vec<Duration>,
    /// Each start's steps.
    profiles: Vec<Steps>,
    /// Starts that found the pool empty and mounted their own image.
    misses: usize,
}

/// Waits until the pool holds `depth` images of `bytes` (its chores done).
async fn wait_full(pool: &rollout_sandbox::pool::WorkspacePool, bytes: u64, depth: usize) {
    while pool.ready(bytes) < depth {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
