//! The README's lists that must match the code, checked against the code: the store's
//! traits, the HTTP routes (against the reviewed OpenAPI document, itself checked
//! against the served one by `tests/pipeline/openapi.rs`), the `rollout` CLI's
//! commands (against its own `--help`), and the configuration keys (the README's
//! variables and `rollout.example.toml`, against the settings' own). A list that drifts
//! fails here, naming what is missing on which side.

use std::collections::BTreeSet;
use std::path::Path;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn readme() -> String {
    std::fs::read_to_string(root().join("README.md")).expect("README.md")
}

/// The README's section under `heading` (a `## ` line), up to the next `## `.
fn section<'a>(text: &'a str, heading: &str) -> &'a str {
    let start = text
        .find(&format!("\n## {heading}\n"))
        .unwrap_or_else(|| panic!("README has no `## {heading}` section"));
    let body = &text[start + heading.len() + 5..];
    body.find("\n## ").map_or(body, |end| &body[..end])
}

/// The words in backticks in `text`.
fn ticked(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

fn agree(what: &str, readme: &BTreeSet<String>, code: &BTreeSet<String>) {
    let missing: Vec<_> = code.difference(readme).collect();
    let stale: Vec<_> = readme.difference(code).collect();
    assert!(
        missing.is_empty() && stale.is_empty(),
        "{what}: in the code but not in the README: {missing:?}; in the README but not in the code: {stale:?}"
    );
}

#[test]
fn the_store_traits_listed_are_the_stores_traits() {
    let mut code = BTreeSet::new();
    for entry in std::fs::read_dir(root().join("crates/store/src")).unwrap() {
        let text = std::fs::read_to_string(entry.unwrap().path()).unwrap_or_default();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("pub trait ") {
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                // `Store` itself is all of them together.
                if name.ends_with("Store") && name != "Store" {
                    code.insert(name);
                }
            }
        }
    }
    assert!(
        code.len() >= 5,
        "the store's traits were not found: {code:?}"
    );
    let text = readme();
    let sentence = text
        .split("The store is split by concern (")
        .nth(1)
        .and_then(|s| s.split(')').next())
        .expect("README's sentence listing the store traits");
    let listed = ticked(sentence).into_iter().map(String::from).collect();
    agree("store traits", &listed, &code);
}

#[test]
fn the_http_routes_listed_are_the_apis_routes() {
    let snap = std::fs::read_to_string(
        root().join("tests/pipeline/snapshots/pipeline__openapi__openapi.snap"),
    )
    .unwrap();
    let doc: serde_json::Value = serde_json::from_str(&snap[snap.find('{').unwrap()..]).unwrap();
    let mut code = BTreeSet::new();
    for (path, ops) in doc["paths"].as_object().unwrap() {
        for method in ops.as_object().unwrap().keys() {
            code.insert(format!("{} {path}", method.to_uppercase()));
        }
    }
    let text = readme();
    let api = section(&text, "HTTP API");
    let mut listed = BTreeSet::new();
    for row in api.lines().filter(|l| l.starts_with("| `")) {
        let first = row.split(" | ").next().unwrap();
        for route in ticked(first) {
            let route = route.split('?').next().unwrap();
            if let Some((method, path)) = route.split_once(' ')
                && ["GET", "POST", "PUT", "DELETE", "PATCH"].contains(&method)
            {
                listed.insert(format!("{method} {path}"));
            }
        }
        // A row may name a sibling route in its description (`/groups/stream`).
        if row.contains("`/groups/stream`") {
            listed.insert("GET /v1/batches/{id}/groups/stream".into());
        }
    }
    agree("HTTP routes", &listed, &code);
}

#[test]
fn the_cli_commands_listed_are_the_clis_commands() {
    let help = std::process::Command::new(env!("CARGO_BIN_EXE_rollout"))
        .arg("--help")
        .output()
        .expect("rollout --help");
    let help = String::from_utf8_lossy(&help.stdout);
    let mut code = BTreeSet::new();
    let mut in_commands = false;
    for line in help.lines() {
        if line.trim_end() == "Commands:" {
            in_commands = true;
            continue;
        }
        if in_commands {
            let Some(name) = line
                .strip_prefix("  ")
                .and_then(|l| l.split_whitespace().next())
            else {
                break;
            };
            if name != "help" {
                code.insert(name.to_string());
            }
        }
    }
    assert!(code.len() >= 5, "no commands in `rollout --help`: {help}");
    let text = readme();
    let cli = section(&text, "Command line");
    let mut listed = BTreeSet::new();
    for row in cli.lines().filter(|l| l.starts_with("| `rollout ")) {
        let first = row.split(" | ").next().unwrap();
        for cmd in ticked(first) {
            if let Some(rest) = cmd.strip_prefix("rollout ")
                && let Some(name) = rest.split_whitespace().next()
                && !name.starts_with('-')
            {
                listed.insert(name.to_string());
            }
        }
    }
    agree("rollout commands", &listed, &code);
}

/// Every dotted key under `table` (`nats.url`, `stages.run.concurrency`); an array of
/// tables counts as its key alone.
fn keys(prefix: &str, table: &toml::Table, out: &mut BTreeSet<String>) {
    for (k, v) in table {
        let key = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        match v {
            toml::Value::Table(t) => keys(&key, t, out),
            _ => {
                out.insert(key);
            }
        }
    }
}

/// The settings' keys, as the defaults serialize them (an optional key absent by default
/// is not among them).
fn settings_keys() -> BTreeSet<String> {
    let defaults: toml::Table =
        toml::from_str(&toml::to_string(&rollout::config::Settings::default()).unwrap()).unwrap();
    let mut out = BTreeSet::new();
    keys("", &defaults, &mut out);
    assert!(
        out.len() >= 30,
        "the settings' keys were not found: {out:?}"
    );
    out
}

/// `rollout.example.toml` "lists every key with its default and meaning": each key is
/// there, set or commented out (`# key = …` under its table), and nothing else is.
/// (`config`'s own test checks that the values it sets are the defaults.)
#[test]
fn the_example_file_lists_every_configuration_key() {
    let text = std::fs::read_to_string(root().join("rollout.example.toml")).unwrap();
    // Each key shown, with the value the file shows for it.
    let mut listed = std::collections::BTreeMap::new();
    let mut table = String::new();
    for line in text.lines() {
        let line = line.trim();
        // Commented-out tables (`# [[backends]]`) count as the keys they show.
        let body = line.trim_start_matches('#').trim();
        let is_name = |n: &str| {
            !n.is_empty()
                && n.chars()
                    .all(|c| c.is_ascii_lowercase() || c == '_' || c == '.')
        };
        if let Some(name) = body.strip_prefix("[[").and_then(|l| l.strip_suffix("]]"))
            && is_name(name)
        {
            table = name.to_string();
            listed.insert(table.clone(), String::new());
        } else if let Some(name) = body.strip_prefix('[').and_then(|l| l.strip_suffix(']'))
            && is_name(name)
        {
            table = name.to_string();
        } else if let Some((key, value)) = body.split_once(" = ")
            && !key.is_empty()
            && key
                .chars()
                .all(|c| c.is_ascii_lowercase() || c == '_' || c.is_ascii_digit())
            && (!line.starts_with('#') || !table.is_empty())
        {
            let key = if table.is_empty() {
                key.to_string()
            } else {
                format!("{table}.{key}")
            };
            listed.insert(key, value.to_string());
        }
    }
    let code = settings_keys();
    let missing: Vec<_> = code.iter().filter(|k| !listed.contains_key(*k)).collect();
    assert!(
        missing.is_empty(),
        "keys missing from rollout.example.toml: {missing:?}"
    );
    // A key the defaults leave out (an optional one, absent by default) is real when
    // the settings take it with the value the file shows; one they refuse as unknown
    // is not. (A backend's keys belong to `[[backends]]` entries, read elsewhere.)
    let dir = tempfile::tempdir().unwrap();
    let mut stale = Vec::new();
    for (key, value) in &listed {
        if code.contains(key) || key.starts_with("backends") {
            continue;
        }
        let (section, name) = key.rsplit_once('.').unwrap_or(("", key));
        let file = dir.path().join("one.toml");
        let head = if section.is_empty() {
            String::new()
        } else {
            format!("[{section}]\n")
        };
        std::fs::write(&file, format!("{head}{name} = {value}\n")).unwrap();
        if let Err(e) = rollout::config::Settings::load_from(Some(&file), Vec::new())
            && e.to_string().contains("unknown field")
        {
            stale.push(format!("{key}: {e}"));
        }
    }
    assert!(
        stale.is_empty(),
        "rollout.example.toml names keys the settings do not have: {stale:?}"
    );
}

/// Every `ROLLOUT__SECTION__KEY` variable the README names is a real key, and so is
/// each key named beside one as "also `X`" (`STAGES__RUN__…` also `INIT`, `EVAL`).
#[test]
fn the_configuration_variables_listed_are_settings_keys() {
    let code = settings_keys();
    let text = readme();
    let mut named = BTreeSet::new();
    // Every `ROLLOUT__…` in backticks, anywhere (the README's code fences would throw
    // `ticked`'s pairing off over the whole text).
    for (at, _) in text.match_indices("`ROLLOUT__") {
        let rest = &text[at + "`ROLLOUT__".len()..];
        // `ROLLOUT__NATS__REPLICAS=3`: the name before the value.
        let var = rest.split(['`', '=']).next().unwrap_or_default();
        // `ROLLOUT__SECTION__KEY` names the form, not a key.
        if var != "SECTION__KEY" {
            named.insert(var.to_lowercase().replace("__", "."));
        }
    }
    // "(also `INIT`, `EVAL`)" beside `STAGES__RUN__CONCURRENCY`: the same key in a
    // sibling section; "(also `MAX_TOKENS`, …)" beside `AGENT__MAX_TURNS`: a sibling key.
    for row in section(&text, "Configuration").lines() {
        let Some(var) = row
            .strip_prefix("| `ROLLOUT__")
            .and_then(|r| r.split('`').next())
        else {
            continue;
        };
        let path: Vec<String> = var.to_lowercase().split("__").map(String::from).collect();
        let Some(also) = row.split("(also ").nth(1) else {
            continue;
        };
        for word in ticked(also.split(')').next().unwrap_or_default()) {
            let word = word.to_lowercase();
            let (parent, key) = path.split_at(path.len() - 1);
            let sibling_key = [parent, std::slice::from_ref(&word)].concat().join(".");
            let sibling_section = match parent.split_last() {
                Some((_, grand)) => [grand, std::slice::from_ref(&word), key].concat().join("."),
                None => String::new(),
            };
            named.insert(if code.contains(&sibling_section) {
                sibling_section
            } else {
                sibling_key
            });
        }
    }
    assert!(
        named.len() >= 15,
        "no variables found in the README: {named:?}"
    );
    let unknown: Vec<_> = named.iter().filter(|k| !code.contains(*k)).collect();
    assert!(
        unknown.is_empty(),
        "the README names settings that do not exist: {unknown:?}"
    );
}
