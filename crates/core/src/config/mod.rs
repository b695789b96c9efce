//! The typed settings tree, loaded with the `config` crate.
//!
//! Sources, later ones winning: built-in defaults, then a TOML file (`--config PATH` or
//! the `ROLLOUT_CONFIG` variable), then environment variables `ROLLOUT__SECTION__KEY`
//! (double underscores separate the levels, so snake_case keys survive, e.g.
//! `ROLLOUT__QUEUE__DELIVERY_LIMIT=5`). Every value is checked once at load time, and an
//! error names the key and what was expected, so a typo fails at start-up rather than as
//! a stuck job.

mod paths;
mod sections;
mod validate;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use paths::redact_url;
pub use sections::*;

/// A configuration problem a user can fix: names the key and what was expected.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file or environment could not be read or did not have the expected shape.
    #[error("configuration error: {0} (see rollout.example.toml for every key and its type)")]
    Load(#[from] config::ConfigError),
    /// A value parsed but is out of range or inconsistent.
    #[error("configuration error: `{key}` {problem}")]
    Invalid {
        /// The dotted key, e.g. `queue.delivery_limit`.
        key: String,
        /// What is wrong and what is expected.
        problem: String,
    },
}

/// All settings of every binary. Each binary reads the sections it needs.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    /// NATS connection and naming.
    pub nats: NatsSettings,
    /// Database connection.
    pub database: DatabaseSettings,
    /// HTTP gateway.
    pub gateway: GatewaySettings,
    /// This machine's identity.
    pub node: NodeSettings,
    /// Delivery and retry policy of the work queue.
    pub queue: QueueSettings,
    /// Per-stage worker settings.
    pub stages: StagesSettings,
    /// The hand-off repair loop.
    pub reconciler: ReconcilerSettings,
    /// Sandboxes on this node.
    pub sandbox: SandboxSettings,
    /// Inference backends registered from this file (`[[backends]]`); more can be added
    /// through the API.
    pub backends: Vec<crate::domain::backend::BackendSpec>,
    /// How jobs use the backend pool.
    pub pool: PoolSettings,
    /// Defaults of the `agent` task kind.
    pub agent: AgentSettings,
    /// Where `rollout up` keeps its SQLite file and NATS data.
    pub state_dir: PathBuf,
    /// Logging.
    pub log: LogSettings,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            nats: NatsSettings::default(),
            database: DatabaseSettings::default(),
            gateway: GatewaySettings::default(),
            node: NodeSettings::default(),
            queue: QueueSettings::default(),
            stages: StagesSettings::default(),
            reconciler: ReconcilerSettings::default(),
            sandbox: SandboxSettings::default(),
            backends: Vec::new(),
            pool: PoolSettings::default(),
            agent: AgentSettings::default(),
            state_dir: PathBuf::from(".rollout"),
            log: LogSettings::default(),
        }
    }
}

impl Settings {
    /// Loads settings from defaults, the optional file and the environment.
    ///
    /// `path` wins over `ROLLOUT_CONFIG`. A named file that does not exist is an error.
    pub fn load(path: Option<&Path>) -> Result<Settings, ConfigError> {
        let env_path = std::env::var_os("ROLLOUT_CONFIG").map(PathBuf::from);
        let file = path.map(Path::to_path_buf).or(env_path);
        Self::load_from(file.as_deref(), std::env::vars())
    }

    /// Loads from an explicit file and set of environment variables (testable core of
    /// [`Settings::load`]).
    pub fn load_from(
        file: Option<&Path>,
        vars: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Settings, ConfigError> {
        let defaults = config::Config::try_from(&Settings::default())?;
        let mut builder = config::Config::builder().add_source(defaults);
        if let Some(file) = file {
            if !file.exists() {
                return Err(ConfigError::Invalid {
                    key: "--config / ROLLOUT_CONFIG".into(),
                    problem: format!("names `{}`, which does not exist", file.display()),
                });
            }
            builder = builder.add_source(
                config::File::from(file.to_path_buf()).format(config::FileFormat::Toml),
            );
        }
        let env: config::Map<String, String> = vars
            .into_iter()
            .filter(|(k, _)| k.starts_with("ROLLOUT__"))
            .collect();
        builder = builder.add_source(
            config::Environment::with_prefix("ROLLOUT")
                .prefix_separator("__")
                .separator("__")
                .try_parsing(true)
                .source(Some(env)),
        );
        let settings: Settings = builder.build()?.try_deserialize()?;
        settings.validate()?;
        Ok(settings)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_passwords() {
        assert_eq!(
            redact_url("postgres://u:secret@h/db"),
            "postgres://u:***@h/db"
        );
        assert_eq!(redact_url("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(redact_url("sqlite://x.db"), "sqlite://x.db");
        assert_eq!(
            redact_url("nats://u:one@h1:4222,nats://u:two@h2:4222,nats://h3:4222"),
            "nats://u:***@h1:4222,nats://u:***@h2:4222,nats://h3:4222"
        );
    }

    #[test]
    fn nats_url_may_list_a_clusters_servers() {
        let s = Settings::load_from(
            None,
            env(&[
                (
                    "ROLLOUT__NATS__URL",
                    "nats://n1:4222, nats://n2:4222,nats://n3:4222,",
                ),
                ("ROLLOUT__NATS__REPLICAS", "3"),
            ]),
        )
        .unwrap();
        assert_eq!(
            s.nats.urls(),
            ["nats://n1:4222", "nats://n2:4222", "nats://n3:4222"]
        );
        assert_eq!(s.nats.replicas, 3);
        let single = Settings::load_from(None, env(&[])).unwrap();
        assert_eq!(single.nats.urls(), ["nats://127.0.0.1:4222"]);
        assert_eq!(single.nats.replicas, 1);
        for bad in [
            "nats://n1:4222,n2:4222",
            ",",
            "nats://n1:4222;nats://n2:4222x,http://n3",
        ] {
            let e = Settings::load_from(None, env(&[("ROLLOUT__NATS__URL", bad)]))
                .unwrap_err()
                .to_string();
            assert!(e.contains("`nats.url`"), "{bad}: {e}");
        }
        for bad in ["0", "6"] {
            let e = Settings::load_from(None, env(&[("ROLLOUT__NATS__REPLICAS", bad)]))
                .unwrap_err()
                .to_string();
            assert!(e.contains("`nats.replicas`"), "{bad}: {e}");
        }
    }

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn defaults_are_valid() {
        let s = Settings::load_from(None, env(&[])).unwrap();
        assert_eq!(s.nats.url, "nats://127.0.0.1:4222");
        assert_eq!(s.gateway.listen, "127.0.0.1:7878");
        assert!(s.database_url().starts_with("sqlite://"));
    }

    #[test]
    fn environment_overrides_nested_snake_case_keys() {
        let s = Settings::load_from(
            None,
            env(&[
                ("ROLLOUT__NATS__URL", "nats://10.0.0.1:4222"),
                ("ROLLOUT__QUEUE__DELIVERY_LIMIT", "9"),
                ("ROLLOUT__STAGES__RUN__CONCURRENCY", "3"),
                ("ROLLOUT__NODE__NAME", "gpu-7"),
                ("UNRELATED", "x"),
            ]),
        )
        .unwrap();
        assert_eq!(s.nats.url, "nats://10.0.0.1:4222");
        assert_eq!(s.queue.delivery_limit, 9);
        assert_eq!(s.stages.run.concurrency, 3);
        assert_eq!(s.node.name, "gpu-7");
    }

    #[test]
    fn file_then_environment() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(
            &path,
            "[gateway]\nlisten = \"0.0.0.0:9000\"\n[stages.eval]\ntimeout_ms = 5\n",
        )
        .unwrap();
        let s = Settings::load_from(
            Some(&path),
            env(&[("ROLLOUT__GATEWAY__LISTEN", "127.0.0.1:1")]),
        )
        .unwrap();
        assert_eq!(s.gateway.listen, "127.0.0.1:1");
        assert_eq!(s.stages.eval.timeout_ms, 5);
    }

    #[test]
    fn bad_values_name_their_key() {
        let e = Settings::load_from(None, env(&[("ROLLOUT__QUEUE__DELIVERY_LIMIT", "lots")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("delivery_limit"), "{e}");
        let e = Settings::load_from(None, env(&[("ROLLOUT__GATEWAY__LISTEN", "nowhere")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("gateway.listen"), "{e}");
        let e = Settings::load_from(None, env(&[("ROLLOUT__DATABASE__URL", "mysql://x")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("database.url"), "{e}");
        let e = Settings::load_from(Some(Path::new("/nonexistent/rollout.toml")), env(&[]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("does not exist"), "{e}");
    }

    #[test]
    fn unknown_file_keys_are_rejected() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, "[gateway]\nlisten_addr = \"x\"\n").unwrap();
        let e = Settings::load_from(Some(&path), env(&[]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("listen_addr"), "{e}");
    }

    #[test]
    fn backends_load_from_the_file_and_bad_ones_name_their_field() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        let one = "[[backends]]\nid = \"gpu0\"\nurl = \"http://h:8000\"\nkind = \"sglang\"\nmodel = \"m\"\ntokenizer = \"/m\"\n";
        std::fs::write(&path, one).unwrap();
        let s = Settings::load_from(Some(&path), env(&[])).unwrap();
        assert_eq!(s.backends.len(), 1);
        assert_eq!(s.backends[0].kind, crate::domain::backend::WireKind::Sglang);
        assert_eq!(s.backends[0].weight, 1.0);
        std::fs::write(&path, format!("{one}{}", one.replace("h:8000", "h:8001"))).unwrap();
        let e = Settings::load_from(Some(&path), env(&[]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("backends[1].id"), "{e}");
        std::fs::write(&path, one.replace("http://", "tcp://")).unwrap();
        let e = Settings::load_from(Some(&path), env(&[]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("backends[0].url"), "{e}");
        let e = Settings::load_from(None, env(&[("ROLLOUT__AGENT__PARSER", "xml")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("agent.parser"), "{e}");
    }

    #[test]
    fn gateway_token_is_required_off_loopback() {
        let token = "0123456789abcdef0123";
        for listen in ["0.0.0.0:7878", "[::]:7878", "10.1.2.3:7878"] {
            let e = Settings::load_from(None, env(&[("ROLLOUT__GATEWAY__LISTEN", listen)]))
                .unwrap_err()
                .to_string();
            assert!(e.contains("`gateway.token`"), "{listen}: {e}");
            assert!(e.contains("non-loopback"), "{listen}: {e}");
            let s = Settings::load_from(
                None,
                env(&[
                    ("ROLLOUT__GATEWAY__LISTEN", listen),
                    ("ROLLOUT__GATEWAY__TOKEN", token),
                ]),
            )
            .unwrap();
            assert_eq!(s.gateway.token, token);
        }
        for listen in ["127.0.0.1:7878", "127.0.0.2:0", "[::1]:7878"] {
            Settings::load_from(None, env(&[("ROLLOUT__GATEWAY__LISTEN", listen)]))
                .unwrap_or_else(|e| panic!("{listen}: {e}"));
        }
    }

    #[test]
    fn gateway_token_must_be_long_and_printable() {
        for (bad, why) in [
            ("short-token", "too short"),
            ("0123456789 abcdef0123", "printable"),
            ("0123456789\tabcdef0123", "printable"),
            ("0123456789\u{7}abcdef0123", "printable"),
            ("0123456789ébcdef0123", "printable"),
        ] {
            let e = Settings::load_from(None, env(&[("ROLLOUT__GATEWAY__TOKEN", bad)]))
                .unwrap_err()
                .to_string();
            assert!(e.contains("`gateway.token`"), "{bad:?}: {e}");
            assert!(e.contains(why), "{bad:?}: {e}");
        }
    }

    #[test]
    fn nats_credentials_are_one_complete_method() {
        let dir = tempfile::tempdir().unwrap();
        let creds = dir.path().join("user.creds");
        std::fs::write(&creds, "not checked at load time").unwrap();
        let creds = creds.to_str().unwrap();
        let missing = dir.path().join("missing.creds");
        let missing = missing.to_str().unwrap();
        let rejected: [(&[(&str, &str)], &str); 6] = [
            (&[("ROLLOUT__NATS__USER", "u")], "`nats.password`"),
            (&[("ROLLOUT__NATS__PASSWORD", "p")], "`nats.user`"),
            (
                &[
                    ("ROLLOUT__NATS__USER", "u"),
                    ("ROLLOUT__NATS__PASSWORD", "p"),
                    ("ROLLOUT__NATS__TOKEN", "t"),
                ],
                "`nats.token`",
            ),
            (
                &[
                    ("ROLLOUT__NATS__TOKEN", "t"),
                    ("ROLLOUT__NATS__CREDS_FILE", creds),
                ],
                "`nats.token`",
            ),
            (
                &[
                    ("ROLLOUT__NATS__USER", "u"),
                    ("ROLLOUT__NATS__PASSWORD", "p"),
                    ("ROLLOUT__NATS__CREDS_FILE", creds),
                ],
                "`nats.token`",
            ),
            (
                &[("ROLLOUT__NATS__CREDS_FILE", missing)],
                "`nats.creds_file`",
            ),
        ];
        for (vars, key) in rejected {
            let e = Settings::load_from(None, env(vars))
                .unwrap_err()
                .to_string();
            assert!(e.contains(key), "{vars:?}: {e}");
        }
        let accepted: [&[(&str, &str)]; 3] = [
            &[
                ("ROLLOUT__NATS__USER", "u"),
                ("ROLLOUT__NATS__PASSWORD", "p"),
            ],
            &[("ROLLOUT__NATS__TOKEN", "t")],
            &[("ROLLOUT__NATS__CREDS_FILE", creds)],
        ];
        for vars in accepted {
            Settings::load_from(None, env(vars)).unwrap_or_else(|e| panic!("{vars:?}: {e}"));
        }
    }

    #[test]
    fn debug_output_hides_secrets() {
        let s = Settings::load_from(
            None,
            env(&[
                ("ROLLOUT__GATEWAY__TOKEN", "gateway-secret-0123456789"),
                ("ROLLOUT__NATS__USER", "worker"),
                ("ROLLOUT__NATS__PASSWORD", "nats-password-secret"),
            ]),
        )
        .unwrap();
        let shown = format!("{s:?}");
        assert!(!shown.contains("gateway-secret"), "{shown}");
        assert!(!shown.contains("nats-password-secret"), "{shown}");
        assert!(shown.contains("worker"), "{shown}");
        assert!(shown.contains("<redacted>"), "{shown}");
        let mut s = Settings::default();
        s.nats.token = "nats-token-secret".into();
        s.nats.url = "nats://u:url-secret@h:4222".into();
        s.database.url = "postgres://rollout:db-secret@h/rollout".into();
        let shown = format!("{s:?}");
        assert!(!shown.contains("nats-token-secret"), "{shown}");
        assert!(!shown.contains("url-secret"), "{shown}");
        assert!(!shown.contains("db-secret"), "{shown}");
    }

    #[test]
    fn default_limits_keep_within_their_maximums() {
        let e = Settings::load_from(
            None,
            env(&[("ROLLOUT__SANDBOX__MAX_LIMITS__MEMORY_BYTES", "1073741824")]),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("`sandbox.limits.memory_bytes`"), "{e}");
        assert!(e.contains("1073741824"), "{e}");
        let e = Settings::load_from(None, env(&[("ROLLOUT__SANDBOX__LIMITS__PROCESSES", "0")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("`sandbox.limits.processes`"), "{e}");
        Settings::load_from(
            None,
            env(&[
                ("ROLLOUT__SANDBOX__LIMITS__PROCESSES", "0"),
                ("ROLLOUT__SANDBOX__MAX_LIMITS__PROCESSES", "0"),
            ]),
        )
        .unwrap();
    }

    #[test]
    fn node_names_become_subject_tokens() {
        assert_eq!(sanitize_node_name("n1.cluster.local"), "n1-cluster-local");
        assert_eq!(sanitize_node_name("any"), "node");
    }
}

#[cfg(test)]
mod example_file {
    use super::*;

    /// The commented example file in the repository loads and matches the defaults, so it
    /// cannot drift from the code.
    #[test]
    fn example_toml_loads_and_matches_defaults() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../rollout.example.toml");
        let s = Settings::load_from(Some(&path), Vec::new()).unwrap();
        let d = Settings::default();
        assert_eq!(
            toml::to_string(&s).unwrap(),
            toml::to_string(&d).unwrap(),
            "rollout.example.toml disagrees with Settings::default()"
        );
    }
}
