//! The Slurm scripts of `deploy/slurm/` on a real one-node Slurm cluster: munged,
//! slurmctld and slurmd (Debian's `slurm-wlm` and `munge`, installed by
//! `scripts/test.sh`) started on this machine in a private directory, on free ports,
//! without cgroups (`proctrack/linuxproc`, `task/none`). The head job and two worker
//! jobs are submitted with `sbatch`; a batch runs through them; one worker job is
//! `scancel`led while it holds jobs, which are handed back and finish on the other; every
//! job ends exactly once; the jobs' output files are plain text.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use rollout::client::Client;
use rollout::domain::{Stage, Status, Task};

use crate::eventually::eventually;
use crate::helpers::{TestDb, slow_shell_job};
use crate::host::{free_port, shared_tempdir, which};

/// Slurm's KillWait here (s): the workers' grace is set below it by the worker script.
const KILL_WAIT_S: u64 = 10;

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy/slurm")
        .join(name)
}

/// A one-node cluster: its daemons are stopped (and its jobs with them) when dropped.
struct Cluster {
    dir: PathBuf,
    conf: PathBuf,
    host: String,
}

impl Cluster {
    async fn start(dir: &Path) -> Cluster {
        for program in ["munged", "slurmctld", "slurmd", "sbatch"] {
            assert!(
                which(program).is_some(),
                "{program} is not installed: run scripts/test.sh (it installs Debian's slurm-wlm and munge)"
            );
        }
        assert!(
            nix::unistd::geteuid().is_root(),
            "the Slurm test starts slurmd, which must run as root"
        );
        let dir = dir.to_path_buf();
        for sub in ["munge", "state", "spool", "log"] {
            std::fs::create_dir_all(dir.join(sub)).unwrap();
        }
        let munge = dir.join("munge");
        run(sbin("mungekey")
            .arg("--create")
            .arg(format!("--keyfile={}", munge.join("key").display()))
            .arg("--force"));
        run(sbin("munged")
            .arg("--force")
            .arg(format!("--socket={}", munge.join("sock").display()))
            .arg(format!("--key-file={}", munge.join("key").display()))
            .arg(format!("--log-file={}", munge.join("log").display()))
            .arg(format!("--pid-file={}", munge.join("pid").display()))
            .arg(format!("--seed-file={}", munge.join("seed").display())));
        let host = nix::unistd::gethostname()
            .unwrap()
            .to_string_lossy()
            .split('.')
            .next()
            .unwrap()
            .to_string();
        let conf = dir.join("slurm.conf");
        std::fs::write(&conf, slurm_conf(&dir, &host)).unwrap();
        let cluster = Cluster { dir, conf, host };
        run(sbin("slurmctld").arg("-f").arg(&cluster.conf));
        run(sbin("slurmd")
            .arg("-f")
            .arg(&cluster.conf)
            .arg("-N")
            .arg(&cluster.host));
        eventually(
            "the one-node cluster is up",
            Duration::from_secs(60),
            || async {
                let state = cluster.output(Command::new("sinfo").args(["-h", "-o", "%t"]));
                if state.trim() == "idle" {
                    Ok(())
                } else {
                    Err(format!("sinfo: {state}{}", cluster.logs()))
                }
            },
        )
        .await;
        cluster
    }

    /// Runs a Slurm client command against this cluster; returns its stdout.
    fn output(&self, cmd: &mut Command) -> String {
        let out = cmd.env("SLURM_CONF", &self.conf).output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `sbatch --parsable` with `env`; returns the job id.
    fn sbatch(&self, args: &[&str], env: &[(&str, String)], script: &Path) -> String {
        let mut cmd = Command::new("sbatch");
        cmd.env("SLURM_CONF", &self.conf)
            .current_dir(&self.dir)
            .arg("--parsable")
            .args(args)
            .arg(script);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "sbatch {}: {}",
            script.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .split(';')
            .next()
            .unwrap()
            .to_string()
    }

    /// The job's state as `squeue` shows it (empty once it has left the queue).
    fn state(&self, job: &str) -> String {
        self.output(Command::new("squeue").args(["-h", "-o", "%T", "-j", job]))
            .trim()
            .to_string()
    }

    fn logs(&self) -> String {
        let mut out = String::new();
        for f in ["log/slurmctld.log", "log/slurmd.log"] {
            let text = std::fs::read_to_string(self.dir.join(f)).unwrap_or_default();
            out.push_str(&format!(
                "\n--- {f}\n{}",
                &text[text.len().saturating_sub(3000)..]
            ));
        }
        out
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new("scancel")
            .env("SLURM_CONF", &self.conf)
            .args(["--full", "-u", "root"])
            .status();
        #[allow(clippy::disallowed_methods, reason = "a test's teardown")]
        std::thread::sleep(Duration::from_millis(500));
        for pid_file in ["slurmd.pid", "slurmctld.pid", "munge/pid"] {
            if let Ok(pid) = std::fs::read_to_string(self.dir.join(pid_file))
                && let Ok(pid) = pid.trim().parse::<i32>()
            {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGTERM,
                );
            }
        }
    }
}

fn slurm_conf(dir: &Path, host: &str) -> String {
    let d = dir.display();
    format!(
        "ClusterName=rollouttest\n\
         SlurmctldHost={host}(127.0.0.1)\n\
         SlurmctldPort={ctld}\n\
         SlurmdPort={slurmd}\n\
         SlurmUser=root\n\
         SlurmdUser=root\n\
         AuthType=auth/munge\n\
         AuthInfo=socket={d}/munge/sock\n\
         CredType=cred/munge\n\
         StateSaveLocation={d}/state\n\
         SlurmdSpoolDir={d}/spool\n\
         SlurmctldPidFile={d}/slurmctld.pid\n\
         SlurmdPidFile={d}/slurmd.pid\n\
         SlurmctldLogFile={d}/log/slurmctld.log\n\
         SlurmdLogFile={d}/log/slurmd.log\n\
         ProctrackType=proctrack/linuxproc\n\
         TaskPlugin=task/none\n\
         JobAcctGatherType=jobacct_gather/none\n\
         AccountingStorageType=accounting_storage/none\n\
         SelectType=select/cons_tres\n\
         SelectTypeParameters=CR_Core\n\
         SlurmdParameters=config_overrides\n\
         ReturnToService=2\n\
         KillWait={KILL_WAIT_S}\n\
         MpiDefault=none\n\
         NodeName={host} NodeHostname={host} NodeAddr=127.0.0.1 CPUs=16 RealMemory=16000 State=UNKNOWN\n\
         PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n",
        ctld = free_port(),
        slurmd = free_port(),
    )
}

/// A command running `program` found by [`which`].
fn sbin(program: &str) -> Command {
    Command::new(which(program).unwrap_or_else(|| program.into()))
}

fn run(cmd: &mut Command) {
    let out = cmd.stdin(Stdio::null()).output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A shell job whose RUN takes 8 s, longer than the workers' grace (KillWait less 5 s):
/// a RUN the cancelled worker job holds cannot finish within it and must be handed back.
fn slow_job(i: usize) -> Task {
    slow_shell_job(format!("slurm-{i}"), 4)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn head_and_worker_jobs_run_a_batch_and_a_cancelled_worker_loses_nothing() {
    let dir = shared_tempdir();
    let cluster = Cluster::start(&dir.path().join("slurm")).await;
    let db = TestDb::new(dir.path()).await;
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_rollout")).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let head_file = dir.path().join("head.env");
    let env = [
        ("PATH", path),
        ("ROLLOUT_HEAD_FILE", head_file.display().to_string()),
        ("ROLLOUT_HEAD_HOST", "127.0.0.1".into()),
        ("ROLLOUT_NATS_PORT", free_port().to_string()),
        ("ROLLOUT_GATEWAY_PORT", free_port().to_string()),
        ("ROLLOUT__DATABASE__URL", db.url.clone()),
        ("TMPDIR", dir.path().display().to_string()),
        // Two INITs at a time per node, so both nodes get sandboxes (and RUNs) to hold.
        ("ROLLOUT__STAGES__INIT__CONCURRENCY", "2".into()),
    ];
    let head = cluster.sbatch(&["--cpus-per-task=1"], &env, &script("rollout-head.sbatch"));
    let workers: Vec<String> = (0..2)
        .map(|_| {
            cluster.sbatch(
                &["--cpus-per-task=1"],
                &env,
                &script("rollout-worker.sbatch"),
            )
        })
        .collect();
    let head_env = wait_head_file(&cluster, &head_file, &head).await;
    let client = Client::new(&head_env["ROLLOUT_GATEWAY"])
        .with_token(Some(head_env["ROLLOUT_GATEWAY_TOKEN"].clone()));

    for w in &workers {
        wait_started(&cluster, w).await;
    }
    let tasks: Vec<Task> = (0..16).map(slow_job).collect();
    client.submit(&tasks, Some("slurm")).await.unwrap();
    // Cancel the first worker job once it holds jobs in RUN.
    let victim = &workers[0];
    let victim_node = format!("{}-{victim}", cluster.host);
    let held = wait_held(&client, &victim_node).await;
    cluster.output(Command::new("scancel").arg(victim));
    eventually(
        "the cancelled worker job is gone",
        Duration::from_secs(60),
        || async {
            match cluster.state(victim) {
                s if s.is_empty() => Ok(()),
                s => Err(s),
            }
        },
    )
    .await;

    let results = client.collect_results("slurm", tasks.len()).await.unwrap();
    let mut ids: Vec<&str> = results.iter().map(|r| r.job_id.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), tasks.len(), "every job has exactly one result");
    for r in &results {
        assert_eq!(r.status, Status::Done, "{r:?}");
        assert_eq!(r.reward, Some(1.0), "{r:?}");
    }
    // The RUNs the cancelled worker job held were handed back and finished on the other.
    let jobs = client.batch_jobs("slurm").await.unwrap();
    let survivor = format!("{}-{}", cluster.host, workers[1]);
    for id in &held {
        let job = jobs.iter().find(|j| &j.id == id).unwrap();
        assert_eq!(job.node.as_deref(), Some(survivor.as_str()), "{job:?}");
        assert_eq!(job.status, Status::Done, "{job:?}");
    }
    // The cancelled job's `rollout node` took SIGTERM as "hand back", however many times
    // it came, rather than as "exit now".
    let victim_log =
        std::fs::read_to_string(cluster.dir.join(format!("rollout-worker-{victim}.log")))
            .unwrap_or_default();
    assert!(
        victim_log.contains("SIGTERM received"),
        "the cancelled worker job did not see SIGTERM: {}",
        &victim_log[victim_log.len().saturating_sub(3000)..]
    );
    assert!(
        !victim_log.contains("exiting now"),
        "a repeated SIGTERM ended the worker without its hand-back"
    );
    // The scripts' default log format is plain text a person reads in the output file:
    // no JSON objects, no colour codes.
    let started = victim_log
        .lines()
        .find(|l| l.contains("worker started"))
        .unwrap_or_default();
    assert!(
        !started.starts_with('{') && !victim_log.contains('\u{1b}'),
        "the worker job's output is not plain text: {started}"
    );
    drop(cluster);
}

/// Waits until worker job `job`'s three stages have started taking work.
async fn wait_started(cluster: &Cluster, job: &str) {
    let log = cluster.dir.join(format!("rollout-worker-{job}.log"));
    eventually(
        &format!("worker job {job} started"),
        Duration::from_secs(120),
        || async {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let started = text
                .lines()
                .filter(|l| l.contains("worker started"))
                .count();
            if started == 3 {
                Ok(())
            } else {
                Err(format!(
                    "{started} stages started; state `{}`",
                    cluster.state(job)
                ))
            }
        },
    )
    .await;
}

/// Waits until the worker job named `node` holds jobs of the batch in RUN; returns their
/// ids.
async fn wait_held(client: &Client, node: &str) -> Vec<String> {
    eventually(
        &format!("worker job {node} holds a job in RUN"),
        Duration::from_secs(120),
        || async {
            let jobs = client
                .batch_jobs("slurm")
                .await
                .map_err(|e| e.to_string())?;
            let held: Vec<String> = jobs
                .iter()
                .filter(|j| {
                    j.status == Status::Running
                        && j.stage == Stage::Run
                        && j.node.as_deref() == Some(node)
                })
                .map(|j| j.id.clone())
                .collect();
            if held.is_empty() {
                Err(format!(
                    "{:?}",
                    jobs.iter().map(|j| (&j.node, j.status)).collect::<Vec<_>>()
                ))
            } else {
                Ok(held)
            }
        },
    )
    .await
}

/// Waits for the head job's file; returns its variables.
async fn wait_head_file(
    cluster: &Cluster,
    path: &Path,
    head: &str,
) -> std::collections::BTreeMap<String, String> {
    eventually("the head job's file", Duration::from_secs(120), || async {
        match std::fs::read_to_string(path) {
            Ok(text) if text.contains("ROLLOUT_GATEWAY_TOKEN=") => Ok(text
                .lines()
                .filter_map(|l| l.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()),
            _ => {
                let log = cluster.dir.join(format!("rollout-head-{head}.log"));
                Err(format!(
                    "state `{}`: {}{}",
                    cluster.state(head),
                    std::fs::read_to_string(log).unwrap_or_default(),
                    cluster.logs()
                ))
            }
        }
    })
    .await
}
