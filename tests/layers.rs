//! The service's modules form layers that point one way: a module may use the modules of
//! the layers below its own, never those beside or above it. Some layers are crates of
//! the workspace (`crates/`), which the service re-exports under the layer's name, so
//! Cargo keeps those boundaries; this test keeps the rest, inside the service and inside
//! `rollout-core`, and checks that each crate's dependencies are crates of lower layers.
//!
//! ```text
//! wiring                         the `up` / `serve` processes: builds everything below
//! worker, reconciler, gateway    the services
//! kinds, scripted                task kinds; the stand-in inference server (crate
//!                                rollout-scripted-llm)
//! grading                        what a kind's EVAL runs: the task's grader in a
//!                                fresh sandbox, guarded and sealed
//! agent, sampling, graders,      the multi-turn episode; the sampling-batch driver;
//! stage                          graders (crate rollout-graders); the stage contract
//!                                kinds implement, and their shared sandbox steps
//! publish, sandbox, backends,    publishing what the store records; sandboxes (crate rollout-sandbox, and
//! client, model, policy          the service's `sandbox::node`); inference servers;
//!                                the gateway's HTTP client (crate rollout-api); a
//!                                model's tokenizer and chat template (crate
//!                                rollout-model, re-exported as `agent::{model,
//!                                template, tokenizer, …}`); the current policy
//!                                version (`policy`)
//! store, queue, telemetry, api   the database (crate rollout-store); JetStream; logging;
//!                                the HTTP API's wire types (crate rollout-api), beside
//!                                the store: neither uses the other
//! config, natsd                  settings (plain data); a local nats-server
//! domain, nul, shutdown, metrics, retry, supervise, child
//! ```
//!
//! `rollout-core` holds `domain`, `nul`, `metrics`, `retry`, `shutdown`, `supervise`,
//! `child`, `config` and `natsd`; `rollout-api` holds `api` and `client`.
//! `rollout-test-support` (the tests' fixtures) holds no layer: it is only ever a
//! dev-dependency.
//! Every `crate::…` path in `src/`, `crates/core/src/` and `crates/api/src/` (in `use`
//! items, code, and macro arguments) is checked against the table below; test code
//! (`#[cfg(test)]`) may reach anywhere, since the stand-in server a test drives sits
//! above what it tests. A new top-level module must be given a layer here.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use syn::visit::Visit;

/// Lowest first. Modules in one layer do not use each other.
const LAYERS: &[&[&str]] = &[
    &[
        "domain",
        "nul",
        "shutdown",
        "metrics",
        "retry",
        "supervise",
        "child",
    ],
    &["config", "natsd"],
    &["store", "queue", "telemetry", "api"],
    &[
        "publish", "sandbox", "backends", "client", "model", "policy",
    ],
    &["agent", "sampling", "graders", "stage"],
    &["grading"],
    &["kinds", "scripted"],
    &["worker", "reconciler", "gateway"],
    &["wiring"],
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

/// The top-level module a file of `src/` belongs to (`None` for `lib.rs` and the
/// binaries, which sit above everything: `main.rs`, its own modules under `cli/`, and
/// `bin/`).
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).ok()?;
    let first = rel.components().next()?.as_os_str().to_str()?;
    match first {
        "lib.rs" | "main.rs" | "cli" | "bin" => None,
        f => Some(f.trim_end_matches(".rs").to_string()),
    }
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The files of `files` that are test code as a whole: a module declared
/// `#[cfg(test)] mod name;` (in `name.rs` or `name/mod.rs` beside its parent's own
/// file, or under the parent's folder), and every file below such a module's folder.
fn test_only_files(files: &[PathBuf]) -> BTreeSet<PathBuf> {
    let mut tests = BTreeSet::new();
    for file in files {
        let text = std::fs::read_to_string(file).unwrap();
        let Ok(ast) = syn::parse_file(&text) else {
            continue;
        };
        let stem = file.file_stem().unwrap_or_default();
        let dir = file.parent().unwrap();
        // A module's children live in its own folder, unless it is a folder's `mod.rs`
        // (or the crate's root).
        let children = if stem == "mod" || stem == "lib" || stem == "main" {
            dir.to_path_buf()
        } else {
            dir.join(stem)
        };
        for item in &ast.items {
            if let syn::Item::Mod(m) = item
                && m.content.is_none()
                && is_test_only(&m.attrs)
            {
                let name = m.ident.to_string();
                let folder = children.join(&name);
                let own = children.join(format!("{name}.rs"));
                tests.extend(
                    files
                        .iter()
                        .filter(|f| **f == own || f.starts_with(&folder))
                        .cloned(),
                );
            }
        }
    }
    tests
}

/// A test module in a file of its own is test code like an inline one, and so is
/// everything in its folder.
#[test]
fn modules_declared_for_tests_are_test_code_whatever_their_file() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    let write = |path: &str, text: &str| {
        let path = src.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, text).unwrap();
        path
    };
    let files = vec![
        write(
            "a/mod.rs",
            "mod b;\n#[cfg(test)]\nmod tests;\n#[cfg(test)]\nmod deep;\n",
        ),
        write("a/b.rs", "#[cfg(test)]\nmod tests;\n"),
        write("a/b/tests.rs", ""),
        write("a/tests.rs", ""),
        write("a/deep/mod.rs", "mod more;\n"),
        write("a/deep/more.rs", ""),
        write("c.rs", "#[cfg(test)] mod inline { }\n"),
    ];
    let found: Vec<_> = test_only_files(&files)
        .into_iter()
        .map(|f| f.strip_prefix(src).unwrap().display().to_string())
        .collect();
    assert_eq!(
        found,
        [
            "a/b/tests.rs",
            "a/deep/mod.rs",
            "a/deep/more.rs",
            "a/tests.rs"
        ]
    );
}

fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        (a.path().is_ident("cfg")
            && a.parse_args::<syn::Meta>()
                .is_ok_and(|m| m.path().is_ident("test")))
            // `#[test]`, `#[tokio::test]`.
            || a.path().segments.last().is_some_and(|s| s.ident == "test")
    })
}

fn item_attrs(item: &syn::Item) -> &[syn::Attribute] {
    use syn::Item::*;
    match item {
        Const(i) => &i.attrs,
        Enum(i) => &i.attrs,
        ExternCrate(i) => &i.attrs,
        Fn(i) => &i.attrs,
        ForeignMod(i) => &i.attrs,
        Impl(i) => &i.attrs,
        Macro(i) => &i.attrs,
        Mod(i) => &i.attrs,
        Static(i) => &i.attrs,
        Struct(i) => &i.attrs,
        Trait(i) => &i.attrs,
        TraitAlias(i) => &i.attrs,
        Type(i) => &i.attrs,
        Union(i) => &i.attrs,
        Use(i) => &i.attrs,
        _ => &[],
    }
}

/// The top-level modules a file's code outside its tests names through `crate::` (in
/// `use` items, code and types, and macro arguments).
fn crate_modules(ast: &syn::File) -> BTreeSet<String> {
    let mut paths = Paths::default();
    paths.visit_file(ast);
    paths
        .found
        .into_iter()
        .filter(|p| p.len() > 1 && p[0] == "crate")
        .map(|p| p[1].clone())
        .collect()
}

/// The crates of the workspace, each with the layers' modules it holds (its directory
/// under `crates/` first).
const CRATES: &[(&str, &str, &[&str])] = &[
    (
        "core",
        "rollout-core",
        &[
            "domain",
            "nul",
            "metrics",
            "retry",
            "shutdown",
            "supervise",
            "child",
            "config",
            "natsd",
        ],
    ),
    ("store", "rollout-store", &["store"]),
    ("api", "rollout-api", &["api", "client"]),
    ("sandbox", "rollout-sandbox", &["sandbox"]),
    ("graders", "rollout-graders", &["graders"]),
    ("model", "rollout-model", &["model"]),
    ("scripted-llm", "rollout-scripted-llm", &["scripted"]),
    ("test-support", "rollout-test-support", &[]),
];

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn lower_layers_never_use_higher_ones() {
    let mut problems = Vec::new();
    // The service's own modules, and those of the crates that hold several layers.
    for dir in ["src", "crates/core/src", "crates/api/src"] {
        check_layers(&root().join(dir), dir, &mut problems);
    }
    assert!(
        problems.is_empty(),
        "layering violations:\n{}",
        problems.join("\n")
    );
}

/// Each crate of the workspace depends only on crates of layers below its own.
#[test]
fn each_crate_depends_only_on_crates_of_lower_layers() {
    let top = |mods: &[&str]| mods.iter().filter_map(|m| layer_of(m)).max().unwrap();
    let bottom = |mods: &[&str]| mods.iter().filter_map(|m| layer_of(m)).min().unwrap();
    let members = std::fs::read_dir(root().join("crates"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect::<BTreeSet<_>>();
    let known = CRATES.iter().map(|(d, ..)| d.to_string()).collect();
    assert_eq!(
        members, known,
        "every crate under crates/ needs a row in CRATES"
    );
    let mut problems = Vec::new();
    for (dir, name, mods) in CRATES {
        let manifest: toml::Table =
            std::fs::read_to_string(root().join("crates").join(dir).join("Cargo.toml"))
                .unwrap()
                .parse()
                .unwrap();
        assert_eq!(manifest["package"]["name"].as_str(), Some(*name));
        if mods.is_empty() {
            // The tests' fixtures: below nothing, so nothing may depend on it but tests.
            for (other, ..) in CRATES {
                let text =
                    std::fs::read_to_string(root().join("crates").join(other).join("Cargo.toml"))
                        .unwrap();
                let theirs: toml::Table = text.parse().unwrap();
                let normal = theirs.get("dependencies").and_then(|d| d.as_table());
                if normal.is_some_and(|d| d.contains_key(*name)) {
                    problems.push(format!(
                        "{other} depends on {name}, which is for tests only"
                    ));
                }
            }
            continue;
        }
        let deps = manifest.get("dependencies").and_then(|d| d.as_table());
        for dep in deps.into_iter().flat_map(|d| d.keys()) {
            let Some((_, _, theirs)) = CRATES.iter().find(|(_, n, _)| n == dep) else {
                continue;
            };
            if top(theirs) >= bottom(mods) {
                problems.push(format!(
                    "{name} depends on {dep}, a crate of its own layer or above"
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The API's crate is what a program links to talk to the service, and what keeps the
/// database's rows out of the API: nothing it builds on, however indirectly, is a
/// database driver, the queue's client, the store or the sandbox. (The layers keep the
/// workspace's crates out of its manifest; this follows `Cargo.lock` through every
/// crate it pulls in. Dev-dependencies are followed too, which only makes it stricter.)
#[test]
fn the_api_crate_pulls_in_no_database_queue_or_sandbox() {
    let lock: toml::Table = std::fs::read_to_string(root().join("Cargo.lock"))
        .unwrap()
        .parse()
        .unwrap();
    let packages = lock["package"].as_array().unwrap();
    // A dependency is written `name` or, when several versions are locked, `name version`.
    let deps_of = |name: &str| -> Vec<String> {
        packages
            .iter()
            .filter(|p| p["name"].as_str() == Some(name))
            .flat_map(|p| p.get("dependencies").and_then(|d| d.as_array()).cloned())
            .flatten()
            .map(|d| d.as_str().unwrap().split(' ').next().unwrap().to_string())
            .collect()
    };
    let mut seen = BTreeSet::new();
    let mut todo = vec!["rollout-api".to_string()];
    while let Some(name) = todo.pop() {
        if seen.insert(name.clone()) {
            todo.extend(deps_of(&name));
        }
    }
    assert!(seen.len() > 10, "Cargo.lock was not followed: {seen:?}");
    let banned: Vec<&str> = ["sqlx", "async-nats", "rollout-store", "rollout-sandbox"]
        .into_iter()
        .filter(|b| seen.contains(*b))
        .collect();
    assert!(banned.is_empty(), "rollout-api pulls in {banned:?}");
}

/// `unsafe` only where a sandbox is started: every crate root but the sandbox crate's
/// forbids it; the store's denies it but in the one module that borrows sockets, and
/// the core's but in the one that asks for a parent-death signal before `exec`.
#[test]
fn only_the_sandbox_crate_may_use_unsafe() {
    let mut roots = vec![
        ("src/lib.rs", "#![forbid(unsafe_code)]"),
        ("src/main.rs", "#![forbid(unsafe_code)]"),
        ("crates/core/src/lib.rs", "#![deny(unsafe_code)]"),
        ("crates/api/src/lib.rs", "#![forbid(unsafe_code)]"),
        ("crates/graders/src/lib.rs", "#![forbid(unsafe_code)]"),
        ("crates/model/src/lib.rs", "#![forbid(unsafe_code)]"),
        ("crates/scripted-llm/src/lib.rs", "#![forbid(unsafe_code)]"),
        ("crates/store/src/lib.rs", "#![deny(unsafe_code)]"),
    ];
    let mut bins = Vec::new();
    rust_files(&root().join("workers"), &mut bins);
    rust_files(&root().join("src/bin"), &mut bins);
    let bins: Vec<String> = bins
        .iter()
        .map(|b| b.strip_prefix(root()).unwrap().display().to_string())
        .collect();
    roots.extend(bins.iter().map(|b| (b.as_str(), "#![forbid(unsafe_code)]")));
    for (file, attr) in roots {
        let text = std::fs::read_to_string(root().join(file)).unwrap();
        assert!(text.contains(attr), "{file} lacks `{attr}`");
    }
    // Under `deny`, an `allow` reopens it: the store has one, on `nodelay`, and the
    // core one, on `child`.
    for (krate, module) in [("store", "nodelay"), ("core", "child")] {
        let mut files = Vec::new();
        rust_files(&root().join("crates").join(krate).join("src"), &mut files);
        let allows: Vec<String> = files
            .iter()
            .flat_map(|f| {
                let text = std::fs::read_to_string(f).unwrap();
                let shown = f.strip_prefix(root()).unwrap().display().to_string();
                text.lines()
                    .filter(|l| l.contains("allow(unsafe_code)"))
                    .map(|l| format!("{shown}: {}", l.trim()))
                    .collect::<Vec<_>>()
            })
            .collect();
        assert_eq!(
            allows,
            [format!("crates/{krate}/src/lib.rs: #[allow(unsafe_code)]")],
            "{krate} allows `unsafe` in its `{module}` module only"
        );
        let lib =
            std::fs::read_to_string(root().join("crates").join(krate).join("src/lib.rs")).unwrap();
        assert!(lib.contains(&format!("#[allow(unsafe_code)]\npub mod {module};")));
    }
}

/// The modules of each folder import one another without a circle, so each can be read
/// (and changed) knowing only those below it. Every folder of every crate is checked
/// (`src/` and `crates/*/src/`, and each folder below them): a module is a sibling's
/// file or subfolder, and it uses a sibling when any of its files, outside test code,
/// names a path through it (`super::x`, `crate::a::x`, in `use` items, code and macro
/// arguments). The store's write path once formed a four-file circle with the
/// dialect, the job ends and the sampling verdicts; the agent's episode and generation,
/// the worker's claim, lease and record, and the math grader's parser, values and
/// sampling each formed one.
#[test]
fn the_modules_of_each_folder_import_one_another_without_a_circle() {
    let mut roots = vec![root().join("src")];
    for entry in std::fs::read_dir(root().join("crates")).unwrap() {
        roots.push(entry.unwrap().path().join("src"));
    }
    let mut circles = Vec::new();
    for src in &roots {
        for (folder, left) in folder_circles(src) {
            let shown = folder.strip_prefix(root()).unwrap().display().to_string();
            circles.push(format!("{shown}: {left:?}"));
        }
    }
    assert!(
        circles.is_empty(),
        "modules on an import circle, or above one, by folder:\n{}",
        circles.join("\n")
    );
}

/// The checker finds a circle between two files of a folder through `super::`, `use`
/// groups, `crate::` paths and macro arguments, and none where the arrows point one way.
#[test]
fn the_circle_checker_sees_circles_and_only_circles() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    let write = |file: &str, text: &str| {
        let path = src.join(file);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    };
    write("lib.rs", "mod a;\n");
    write("a/mod.rs", "mod x; mod y; mod z; mod w;\n");
    write("a/x.rs", "use super::{y::Y, z};\n");
    write(
        "a/y.rs",
        "fn f() { tracing::info!(v = %crate::a::x::X); }\n",
    );
    write(
        "a/z.rs",
        "#[cfg(test)] mod tests { use super::super::w::W; }\n",
    );
    write("a/w.rs", "fn g() -> super::z::Z { todo!() }\n");
    let found = folder_circles(src);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].0, src.join("a"));
    assert_eq!(
        found[0].1,
        ["x", "y"]
            .map(String::from)
            .into_iter()
            .collect::<BTreeSet<_>>()
    );
}

/// For each folder under `src` whose modules import one another in a circle, the
/// modules that cannot be peeled off (those on a circle, or using one).
fn folder_circles(src: &Path) -> Vec<(PathBuf, BTreeSet<String>)> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    // Each file's module path and the absolute module paths it names.
    let mut named: Vec<(Vec<String>, Vec<Vec<String>>)> = Vec::new();
    for file in &files {
        let module = module_path(src, file);
        let text = std::fs::read_to_string(file).unwrap();
        let ast = syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let mut paths = Paths::default();
        paths.visit_file(&ast);
        let absolute = paths
            .found
            .into_iter()
            .filter_map(|p| absolute(&module, &p))
            .collect();
        named.push((module, absolute));
    }
    let mut folders: BTreeSet<Vec<String>> = BTreeSet::new();
    for (module, _) in &named {
        for n in 0..module.len() {
            folders.insert(module[..n].to_vec());
        }
    }
    let mut found = Vec::new();
    for folder in folders {
        let depth = folder.len();
        let siblings: BTreeSet<String> = named
            .iter()
            .filter(|(m, _)| m.len() > depth && m.starts_with(&folder))
            .map(|(m, _)| m[depth].clone())
            .collect();
        let mut edges: std::collections::BTreeMap<String, BTreeSet<String>> = siblings
            .iter()
            .map(|s| (s.clone(), BTreeSet::new()))
            .collect();
        for (module, paths) in &named {
            if module.len() <= depth || !module.starts_with(&folder) {
                continue;
            }
            let from = &module[depth];
            for path in paths {
                if path.len() > depth
                    && path.starts_with(&folder)
                    && path[depth] != *from
                    && siblings.contains(&path[depth])
                {
                    edges.get_mut(from).unwrap().insert(path[depth].clone());
                }
            }
        }
        // Peel off modules that use nothing left; what cannot be peeled is on a circle.
        loop {
            let free: Vec<String> = edges
                .iter()
                .filter(|(_, uses)| uses.iter().all(|u| !edges.contains_key(u)))
                .map(|(m, _)| m.clone())
                .collect();
            if free.is_empty() {
                break;
            }
            for m in free {
                edges.remove(&m);
            }
        }
        if !edges.is_empty() {
            let dir = folder.iter().fold(src.to_path_buf(), |d, m| d.join(m));
            found.push((dir, edges.into_keys().collect()));
        }
    }
    found
}

/// The module path of a file under `src`: `a/b.rs` and `a/b/mod.rs` are `[a, b]`, the
/// crate's roots (`lib.rs`, `main.rs`) are `[]`.
fn module_path(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap();
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_str().unwrap().to_string())
        .collect();
    let last = parts.pop().unwrap();
    match last.as_str() {
        "mod.rs" => {}
        "lib.rs" | "main.rs" if parts.is_empty() => {}
        other => parts.push(other.trim_end_matches(".rs").to_string()),
    }
    parts
}

/// `path` as named in the file of `module`, made absolute (`crate::`, `super::`,
/// `self::`); `None` for paths that start anywhere else (another crate, a local item).
fn absolute(module: &[String], path: &[String]) -> Option<Vec<String>> {
    let (first, rest) = path.split_first()?;
    let mut base: Vec<String> = match first.as_str() {
        "crate" => Vec::new(),
        "self" => module.to_vec(),
        "super" => module[..module.len().checked_sub(1)?].to_vec(),
        _ => return None,
    };
    let mut rest = rest;
    while let Some(("super", tail)) = rest.split_first().map(|(h, t)| (h.as_str(), t)) {
        base.pop()?;
        rest = tail;
    }
    base.extend(rest.iter().cloned());
    Some(base)
}

/// Every path a file names outside test code, as its segments: in `use` trees (each
/// branch), in code and types, and in macro arguments (`crate::…`, `super::…`).
#[derive(Default)]
struct Paths {
    found: Vec<Vec<String>>,
}

impl Paths {
    fn scan_tokens(&mut self, tokens: proc_macro2::TokenStream) {
        let tokens: Vec<proc_macro2::TokenTree> = tokens.into_iter().collect();
        let mut i = 0;
        while i < tokens.len() {
            if let proc_macro2::TokenTree::Group(g) = &tokens[i] {
                self.scan_tokens(g.stream());
            }
            let mut path = Vec::new();
            let mut j = i;
            while let Some(proc_macro2::TokenTree::Ident(id)) = tokens.get(j) {
                path.push(id.to_string());
                match (tokens.get(j + 1), tokens.get(j + 2)) {
                    (
                        Some(proc_macro2::TokenTree::Punct(a)),
                        Some(proc_macro2::TokenTree::Punct(b)),
                    ) if a.as_char() == ':' && b.as_char() == ':' => j += 3,
                    _ => break,
                }
            }
            if path.len() > 1 {
                self.found.push(path);
                i = j + 1;
            } else {
                i += 1;
            }
        }
    }
}

impl<'ast> Visit<'ast> for Paths {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        if !is_test_only(item_attrs(item)) {
            syn::visit::visit_item(self, item);
        }
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        if !is_test_only(&f.attrs) {
            syn::visit::visit_impl_item_fn(self, f);
        }
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        fn walk(paths: &mut Paths, tree: &syn::UseTree, prefix: &mut Vec<String>) {
            match tree {
                syn::UseTree::Path(p) => {
                    prefix.push(p.ident.to_string());
                    walk(paths, &p.tree, prefix);
                    prefix.pop();
                }
                syn::UseTree::Name(n) => {
                    let mut path = prefix.clone();
                    path.push(n.ident.to_string());
                    paths.found.push(path);
                }
                syn::UseTree::Rename(r) => {
                    let mut path = prefix.clone();
                    path.push(r.ident.to_string());
                    paths.found.push(path);
                }
                syn::UseTree::Glob(_) => paths.found.push(prefix.clone()),
                syn::UseTree::Group(g) => {
                    for t in &g.items {
                        walk(paths, t, prefix);
                    }
                }
            }
        }
        walk(self, &u.tree, &mut Vec::new());
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        self.found
            .push(p.segments.iter().map(|s| s.ident.to_string()).collect());
        syn::visit::visit_path(self, p);
    }

    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        self.scan_tokens(m.tokens.clone());
        syn::visit::visit_macro(self, m);
    }
}

/// Checks every file under `src` (shown as `shown_dir/…`) against the layers.
fn check_layers(src: &Path, shown_dir: &str, problems: &mut Vec<String>) {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    files.sort();
    let tests = test_only_files(&files);
    for file in files.iter().filter(|f| !tests.contains(*f)) {
        let Some(module) = module_of(src, file) else {
            continue;
        };
        let shown = format!("{shown_dir}/{}", file.strip_prefix(src).unwrap().display());
        let Some(own) = layer_of(&module) else {
            problems.push(format!(
                "{shown}: module `{module}` has no layer in tests/layers.rs"
            ));
            continue;
        };
        let text = std::fs::read_to_string(file).unwrap();
        let ast = syn::parse_file(&text).unwrap_or_else(|e| panic!("{shown}: {e}"));
        for used in &crate_modules(&ast) {
            if *used == module {
                continue;
            }
            match layer_of(used) {
                Some(l) if l < own => {}
                Some(l) => problems.push(format!(
                    "{shown}: `{module}` (layer {own}) uses `crate::{used}` (layer {l})"
                )),
                None => problems.push(format!(
                    "{shown}: `{module}` uses `crate::{used}`, which is not a module with a \
                     layer (root items belong in a module)"
                )),
            }
        }
    }
}

/// The checker sees what it is meant to: paths in code and in macros, but not in tests.
#[test]
fn the_checker_finds_uses_in_code_and_macros_but_not_in_tests() {
    let ast = syn::parse_file(
        r#"
        use crate::{a::X, b};
        fn f() { crate::c::g(); tracing::info!(x = %crate::d::Y); let _: crate::e::T; }
        #[cfg(test)] mod tests { use crate::z::W; }
        "#,
    )
    .unwrap();
    assert_eq!(
        crate_modules(&ast).into_iter().collect::<Vec<_>>(),
        ["a", "b", "c", "d", "e"]
    );
}
