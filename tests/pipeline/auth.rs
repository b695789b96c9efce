//! Authentication: the gateway's bearer token (checked on every endpoint but `/healthz`
//! and `/openapi.json`, sent by the client and the CLI) and NATS credentials (a server
//! that requires a token refuses `Queue::connect` without it; `rollout up`'s own server
//! requires one).

use std::time::Duration;

use rollout::client::{Client, ClientError};
use rollout::config::Settings;
use rollout::domain::Status;
use rollout::natsd::NatsServer;
use rollout::queue::{Queue, QueueError};

use crate::helpers::{TestEnv, synthetic};

const TOKEN: &str = "test-gateway-token-0123456789abcdef";

/// A request to the gateway with an optional raw `Authorization` header: status, the
/// `WWW-Authenticate` header and the body as JSON (panics when it is not JSON).
async fn call(
    env: &TestEnv,
    path: &str,
    auth: Option<&str>,
) -> (u16, Option<String>, serde_json::Value) {
    let mut req = reqwest::Client::new().get(format!("{}{path}", env.base));
    if let Some(a) = auth {
        req = req.header("authorization", a);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let challenge = resp
        .headers()
        .get("www-authenticate")
        .map(|v| v.to_str().unwrap().to_string());
    let text = resp.text().await.unwrap();
    let json = serde_json::from_str(&text)
        .unwrap_or_else(|_| panic!("{path}: body is not JSON ({status}): {text}"));
    (status, challenge, json)
}

/// With `gateway.token` set, requests without it or with a wrong one get 401 with a JSON
/// error and a `WWW-Authenticate: Bearer` challenge on every protected endpoint (unknown
/// paths included); `/healthz` and `/openapi.json` stay open; the client with the right
/// token submits and reads results back, and without it gets an error saying what to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_token_is_required_and_the_client_sends_it() {
    let env = TestEnv::start(|s| s.gateway.token = TOKEN.into()).await;

    let wrong = format!("Bearer {}x", &TOKEN[..TOKEN.len() - 1]);
    for path in [
        "/v1/jobs",
        "/v1/status",
        "/v1/results?after=0",
        "/v1/backends",
        "/metrics",
        "/v1/no-such-endpoint",
    ] {
        for auth in [
            None,
            Some(wrong.as_str()),
            Some(TOKEN),
            Some("Basic dXNlcjpwYXNz"),
        ] {
            let (status, challenge, json) = call(&env, path, auth).await;
            assert_eq!(status, 401, "{path} with {auth:?}: {json}");
            assert_eq!(challenge.as_deref(), Some("Bearer"), "{path} with {auth:?}");
            let error = json["error"].as_str().unwrap_or_default();
            assert!(error.contains("gateway.token"), "{path}: {json}");
        }
    }
    let (_, _, json) = call(&env, "/v1/status", None).await;
    assert!(
        json["error"].as_str().unwrap().contains("requires a token"),
        "{json}"
    );
    let (_, _, json) = call(&env, "/v1/status", Some(&wrong)).await;
    assert!(
        json["error"].as_str().unwrap().contains("not the one"),
        "{json}"
    );
    // The scheme name is case-insensitive.
    let (status, _, json) = call(&env, "/v1/status", Some(&format!("bearer {TOKEN}"))).await;
    assert_eq!(status, 200, "{json}");

    // Open without a token: health (for load balancers) and the API description, which
    // declares the bearer scheme.
    let (status, _, health) = call(&env, "/healthz", None).await;
    assert_eq!(status, 200, "{health}");
    assert_eq!(health["status"], "ok");
    let (status, _, api) = call(&env, "/openapi.json", None).await;
    assert_eq!(status, 200);
    assert_eq!(
        api["components"]["securitySchemes"]["bearer"]["scheme"],
        "bearer"
    );
    assert!(api["security"].is_array(), "{}", api["security"]);

    // The client without the token, and with a wrong one, gets a clear error.
    let task = synthetic(serde_json::json!({"run_ms": 5}));
    for (client, sent) in [
        (Client::new(&env.base), false),
        (
            Client::new(&env.base).with_token(Some("wrong-token-0123456789".into())),
            true,
        ),
    ] {
        let e = client
            .submit(std::slice::from_ref(&task), Some("refused"))
            .await
            .unwrap_err();
        match &e {
            ClientError::Unauthorized { sent_token, .. } => assert_eq!(*sent_token, sent),
            other => panic!("expected Unauthorized, got {other:?}"),
        }
        let msg = e.to_string();
        for needle in ["401", "--token", "ROLLOUT_GATEWAY_TOKEN", "gateway.token"] {
            assert!(msg.contains(needle), "{needle} missing from: {msg}");
        }
    }
    let status = env.client.status(None).await.unwrap();
    assert!(status.counts.is_empty(), "a refused submit wrote jobs");

    // The client with the token: submit, read the job and its result back.
    let client = Client::new(&env.base).with_token(Some(TOKEN.into()));
    let resp = client
        .submit(std::slice::from_ref(&task), Some("authed"))
        .await
        .unwrap();
    let id = &resp.jobs[0].id;
    assert_eq!(client.job(id).await.unwrap().job.id, *id);
    env.workers_in_process(1);
    let results =
        tokio::time::timeout(Duration::from_secs(30), client.collect_results("authed", 1))
            .await
            .expect("result within 30 s")
            .unwrap();
    assert_eq!(results[0].job_id, *id);
    assert_eq!(results[0].status, Status::Done);
}

/// `rollout status` takes the token from `--token`, `ROLLOUT_GATEWAY_TOKEN` or
/// `gateway.token`, and without one fails with a message saying how to pass it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_sends_the_token_from_flag_environment_or_settings() {
    let env = TestEnv::start(|s| s.gateway.token = TOKEN.into()).await;
    let run = |args: &[&str], vars: &[(&str, &str)]| {
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_rollout"));
        cmd.arg("status").arg("--gateway").arg(&env.base).args(args);
        for (k, _) in std::env::vars() {
            if k.starts_with("ROLLOUT") {
                cmd.env_remove(k);
            }
        }
        cmd.env("ROLLOUT__LOG__LEVEL", "warn");
        cmd.envs(vars.iter().copied());
        cmd.output()
    };
    let out = run(&[], &[]).await.unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--token") && stderr.contains("ROLLOUT_GATEWAY_TOKEN"),
        "{stderr}"
    );
    for (args, vars) in [
        (&["--token", TOKEN][..], &[][..]),
        (&[][..], &[("ROLLOUT_GATEWAY_TOKEN", TOKEN)][..]),
        (&[][..], &[("ROLLOUT__GATEWAY__TOKEN", TOKEN)][..]),
    ] {
        let out = run(args, vars).await.unwrap();
        assert!(
            out.status.success(),
            "{args:?} {vars:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(String::from_utf8_lossy(&out.stdout).contains("STATUS"));
    }
}

/// Settings for a queue on `url` under a fresh prefix.
fn queue_settings(url: &str) -> Settings {
    let mut s = Settings::default();
    s.nats.url = url.into();
    s.nats.prefix = format!("t{}", &uuid::Uuid::now_v7().simple().to_string()[20..]);
    s
}

/// A nats-server that requires a token refuses `Queue::connect` without it or with a
/// wrong one, naming the settings to fix, and accepts it with the token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_connect_needs_the_servers_token() {
    let dir = tempfile::tempdir().unwrap();
    let token = "nats-token-0123456789";
    let server =
        NatsServer::start_with_token(dir.path(), "127.0.0.1:0".parse().unwrap(), token).unwrap();
    let conf = std::fs::metadata(dir.path().join("nats-server.conf")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        conf.permissions().mode() & 0o077,
        0,
        "config readable by others"
    );
    let mut s = queue_settings(&server.url());

    for wrong in ["", "nats-token-wrong"] {
        s.nats.token = wrong.into();
        let e = Queue::connect(&s, "test", false).await.unwrap_err();
        assert!(
            matches!(e, QueueError::Unauthorized { .. }),
            "token {wrong:?}: {e}"
        );
        assert!(e.to_string().contains("nats.token"), "{e}");
    }
    s.nats.token = token.into();
    let queue = Queue::connect(&s, "test", false).await.unwrap();
    queue.ping().await.unwrap();

    // A bad credentials file is reported as such, before any connection attempt.
    let creds = dir.path().join("bad.creds");
    std::fs::write(&creds, "not a creds file").unwrap();
    s.nats.token.clear();
    s.nats.creds_file = creds;
    let e = Queue::connect(&s, "test", false).await.unwrap_err();
    assert!(matches!(e, QueueError::CredsFile { .. }), "{e}");
    assert!(e.to_string().contains("nats.creds_file"), "{e}");
}

/// The nats-server `rollout up` starts when none answers requires a fresh token, which
/// the settings of that process then carry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn up_protects_the_nats_server_it_starts() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = queue_settings("nats://127.0.0.1:0");
    s.state_dir = dir.path().to_path_buf();
    let server = rollout::wiring::ensure_nats(&mut s)
        .unwrap()
        .expect("a server was started");
    assert_eq!(s.nats.url, server.url());
    assert!(s.nats.token.len() >= 32, "token {:?}", s.nats.token);
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", server.pid())).unwrap();
    assert!(
        !String::from_utf8_lossy(&cmdline).contains(&s.nats.token),
        "the token is visible on the command line"
    );
    Queue::connect(&s, "test", false)
        .await
        .unwrap()
        .ping()
        .await
        .unwrap();
    let mut without = s.clone();
    without.nats.token.clear();
    let e = Queue::connect(&without, "test", false).await.unwrap_err();
    assert!(matches!(e, QueueError::Unauthorized { .. }), "{e}");
}
