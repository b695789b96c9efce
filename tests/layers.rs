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
//! agent, sampling, graders, natsd the multi-turn episode; the sampling-batch driver;
//!                                graders (crate rollout-graders); a local nats-server
//! ending, sandbox, backends,     finishing jobs; sandboxes (crate rollout-sandbox, and
//! client, model, policy          the service's `sandbox::node`); inference servers;
//!                                the gateway's HTTP client (crate rollout-api); a
//!                                model's tokenizer and chat template (crate
//!                                rollout-model, re-exported as `agent::{model,
//!                                template, tokenizer, …}`); the current policy
//!                                version (`policy`)
//! store, queue, telemetry, api   the database (crate rollout-store); JetStream; logging;
//!                                the HTTP API's wire types (crate rollout-api), beside
//!                                the store: neither uses the other
//! config                         settings (plain data)
//! domain, nul, shutdown, metrics, retry, supervise
//! ```
//!
//! `rollout-core` holds `domain`, `nul`, `metrics`, `retry`, `shutdown`, `supervise` and
//! `config`; `rollout-api` holds `api` and `client`.
//! Every `crate::…` path in `src/`, `crates/core/src/` and `crates/api/src/` (in `use`
//! items, code, and macro arguments) is checked against the table below; test code
//! (`#[cfg(test)]`) may reach anywhere, since the stand-in server a test drives sits
//! above what it tests. A new top-level module must be given a layer here.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use syn::visit::Visit;

/// Lowest first. Modules in one layer do not use each other.
const LAYERS: &[&[&str]] = &[
    &["domain", "nul", "shutdown", "metrics", "retry", "supervise"],
    &["config"],
    &["store", "queue", "telemetry", "api"],
    &["ending", "sandbox", "backends", "client", "model", "policy"],
    &["agent", "sampling", "graders", "natsd"],
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

/// Collects the first segment after `crate::` of every path outside test code (and
/// after `super::`, in a crate's top-level files, where it means the same).
#[derive(Default)]
struct Uses {
    modules: BTreeSet<String>,
    /// `super::` names the crate's root (the file is a top-level module's own).
    super_is_crate: bool,
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

impl Uses {
    fn is_root(&self, first: &syn::Ident) -> bool {
        first == "crate" || (self.super_is_crate && first == "super")
    }

    fn note(&mut self, first: &syn::Ident, second: Option<&syn::Ident>) {
        if self.is_root(first)
            && let Some(s) = second
        {
            self.modules.insert(s.to_string());
        }
    }

    /// `crate :: name` inside a macro's tokens (`tracing::info!`, `json!`, …).
    fn scan_tokens(&mut self, tokens: proc_macro2::TokenStream) {
        let tokens: Vec<proc_macro2::TokenTree> = tokens.into_iter().collect();
        for (i, t) in tokens.iter().enumerate() {
            match t {
                proc_macro2::TokenTree::Group(g) => self.scan_tokens(g.stream()),
                proc_macro2::TokenTree::Ident(id) if id == "crate" => {
                    if let (
                        Some(proc_macro2::TokenTree::Punct(a)),
                        Some(proc_macro2::TokenTree::Punct(b)),
                        Some(proc_macro2::TokenTree::Ident(name)),
                    ) = (tokens.get(i + 1), tokens.get(i + 2), tokens.get(i + 3))
                        && a.as_char() == ':'
                        && b.as_char() == ':'
                    {
                        self.modules.insert(name.to_string());
                    }
                }
                _ => {}
            }
        }
    }
}

impl<'ast> Visit<'ast> for Uses {
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
        /// Notes the name that follows `crate::` in each branch of a `use` tree.
        fn walk(uses: &mut Uses, tree: &syn::UseTree, after_crate: bool) {
            match tree {
                syn::UseTree::Path(p) if after_crate => {
                    uses.modules.insert(p.ident.to_string());
                }
                syn::UseTree::Path(p) if uses.is_root(&p.ident) => walk(uses, &p.tree, true),
                syn::UseTree::Name(n) if after_crate => {
                    uses.modules.insert(n.ident.to_string());
                }
                syn::UseTree::Rename(r) if after_crate => {
                    uses.modules.insert(r.ident.to_string());
                }
                syn::UseTree::Group(g) => {
                    for t in &g.items {
                        walk(uses, t, after_crate);
                    }
                }
                _ => {}
            }
        }
        walk(self, &u.tree, false);
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        let mut segs = p.segments.iter();
        if let Some(first) = segs.next() {
            self.note(&first.ident, segs.next().map(|s| &s.ident));
        }
        syn::visit::visit_path(self, p);
    }

    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        self.scan_tokens(m.tokens.clone());
        syn::visit::visit_macro(self, m);
    }
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
            "config",
        ],
    ),
    ("store", "rollout-store", &["store"]),
    ("api", "rollout-api", &["api", "client"]),
    ("sandbox", "rollout-sandbox", &["sandbox"]),
    ("graders", "rollout-graders", &["graders"]),
    ("model", "rollout-model", &["model"]),
    ("scripted-llm", "rollout-scripted-llm", &["scripted"]),
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
/// forbids it, and the store's denies it but in the one module that borrows sockets.
#[test]
fn only_the_sandbox_crate_may_use_unsafe() {
    let mut roots = vec![
        ("src/lib.rs", "#![forbid(unsafe_code)]"),
        ("src/main.rs", "#![forbid(unsafe_code)]"),
        ("crates/core/src/lib.rs", "#![forbid(unsafe_code)]"),
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
    // Under `deny`, an `allow` reopens it: the store has one, on `nodelay`.
    let mut store = Vec::new();
    rust_files(&root().join("crates/store/src"), &mut store);
    let allows: Vec<String> = store
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
        ["crates/store/src/lib.rs: #[allow(unsafe_code)]"],
        "the store allows `unsafe` in its `nodelay` module only"
    );
    let lib = std::fs::read_to_string(root().join("crates/store/src/lib.rs")).unwrap();
    assert!(lib.contains("#[allow(unsafe_code)]\npub mod nodelay;"));
}

/// The store crate's modules import one another without a circle, so each can be read
/// (and changed) knowing only those below it: the queries over the write path over the
/// dialect and the rows, never back. (The write path once formed a four-file circle with
/// the dialect, the job ends and the sampling verdicts.)
#[test]
fn the_store_modules_import_one_another_without_a_circle() {
    let src = root().join("crates/store/src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let modules: BTreeSet<String> = files.iter().filter_map(|f| module_of(&src, f)).collect();
    let mut edges: std::collections::BTreeMap<String, BTreeSet<String>> = Default::default();
    for file in &files {
        let Some(module) = module_of(&src, file) else {
            continue;
        };
        let text = std::fs::read_to_string(file).unwrap();
        let ast = syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let mut uses = Uses {
            super_is_crate: file.parent() == Some(src.as_path()),
            ..Uses::default()
        };
        uses.visit_file(&ast);
        let used: Vec<String> = uses
            .modules
            .into_iter()
            .filter(|m| *m != module && modules.contains(m))
            .collect();
        edges.entry(module).or_default().extend(used);
    }
    // Peel off modules that use nothing left; what cannot be peeled is on a circle.
    let mut left = edges.clone();
    loop {
        let free: Vec<String> = left
            .iter()
            .filter(|(_, uses)| uses.iter().all(|u| !left.contains_key(u)))
            .map(|(m, _)| m.clone())
            .collect();
        if free.is_empty() {
            break;
        }
        for m in free {
            left.remove(&m);
        }
    }
    assert!(
        left.is_empty(),
        "the store's modules on an import circle, or above one: {left:#?}"
    );
    // The checker sees the circle it is meant to find.
    assert!(edges["write"].contains("dialect") && !edges["dialect"].contains("write"));
}

/// Checks every file under `src` (shown as `shown_dir/…`) against the layers.
fn check_layers(src: &Path, shown_dir: &str, problems: &mut Vec<String>) {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    files.sort();
    for file in &files {
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
        let mut uses = Uses::default();
        uses.visit_file(&ast);
        for used in &uses.modules {
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
    let mut uses = Uses::default();
    uses.visit_file(&ast);
    assert_eq!(
        uses.modules.into_iter().collect::<Vec<_>>(),
        ["a", "b", "c", "d", "e"]
    );
}
