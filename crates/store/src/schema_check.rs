//! The two migration trees held against each other.
//!
//! SQLite and Postgres get the same schema from two trees of migrations, numbered
//! differently, and nothing else compares them: a column added to one tree and
//! forgotten in the other would only show when a statement that reads it runs on the
//! other database. This test brings a fresh database of each kind up to date as the
//! store does (the migrations, then the views file) and compares what the store reads:
//! every table and view, every column with its type (as a family: SQLite's `INTEGER` is
//! Postgres's `bigint`, its `REAL` is `double precision`; a view's column on SQLite has
//! no declared type, or NUMERIC affinity, and matches any), and every index the
//! migrations create (its table, whether it is unique, its columns or expression, and,
//! for a partial index, the rows it covers). The differences that are meant are listed
//! in [`MEANT`], each with its reason; any other fails the test, named.

use std::collections::BTreeMap;

use sqlx::Row;

use crate::migrations::Schema;

/// Differences between the trees that are meant: an index only one dialect has, and
/// why.
const MEANT: &[(&str, &str)] = &[(
    "index jobs_status",
    "Postgres drops it so that a job's updates stay heap-only (0011_hot_job_updates)",
)];

/// One database's schema as the store reads it: relation → its kind and its columns'
/// type families; index → its description.
#[derive(Debug, Default)]
struct Read {
    relations: BTreeMap<String, (String, BTreeMap<String, String>)>,
    indexes: BTreeMap<String, String>,
}

/// The family of a declared column type, as the store's statements read it.
fn family(declared: &str) -> &'static str {
    let t = declared.to_ascii_lowercase();
    // No declared type, or SQLite's NUMERIC affinity (a view's column computed in a
    // common table expression): SQLite's statements read it as whatever it holds.
    if t.is_empty() || t == "num" || t == "numeric" {
        "any"
    } else if t.contains("int") {
        "integer"
    } else if t.contains("real") || t.contains("double") || t.contains("float") {
        "real"
    } else if t.contains("text") || t.contains("char") || t.contains("clob") {
        "text"
    } else if t.contains("bool") {
        "boolean"
    } else if t.contains("json") {
        "json"
    } else if t.contains("blob") || t.contains("bytea") {
        "blob"
    } else {
        "other"
    }
}

/// SQLite's schema after its migrations, on a fresh file in `dir`.
async fn sqlite_schema(dir: &std::path::Path) -> Read {
    let url = format!("sqlite://{}?mode=rwc", dir.join("schema.db").display());
    let pool = sqlx::SqlitePool::connect(&url).await.unwrap();
    Schema::SQLITE
        .bring_up(&mut *pool.acquire().await.unwrap())
        .await
        .unwrap();
    let mut schema = Read::default();
    let relations = sqlx::query(
        "SELECT type, name FROM sqlite_master WHERE type IN ('table', 'view') \
         AND name NOT LIKE 'sqlite_%' AND name <> '_sqlx_migrations'",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    for r in relations {
        let (kind, name): (String, String) = (r.get(0), r.get(1));
        let columns = sqlx::query("SELECT name, type FROM pragma_table_info(?)")
            .bind(&name)
            .fetch_all(&pool)
            .await
            .unwrap()
            .into_iter()
            .map(|c| (c.get::<String, _>(0), family(&c.get::<String, _>(1)).into()))
            .collect();
        schema
            .relations
            .insert(name, (kind.to_ascii_lowercase(), columns));
    }
    let indexes = sqlx::query(
        "SELECT name, tbl_name, sql FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    for i in indexes {
        let (name, table, sql): (String, String, String) = (i.get(0), i.get(1), i.get(2));
        let columns: Vec<String> =
            sqlx::query("SELECT name FROM pragma_index_info(?) ORDER BY seqno")
                .bind(&name)
                .fetch_all(&pool)
                .await
                .unwrap()
                .into_iter()
                .map(|c| {
                    c.get::<Option<String>, _>(0)
                        .unwrap_or_else(|| "(expression)".into())
                })
                .collect();
        let unique = sql.to_ascii_uppercase().starts_with("CREATE UNIQUE");
        let predicate = sql
            .to_ascii_uppercase()
            .rfind(" WHERE ")
            .map(|at| sql[at + " WHERE ".len()..].to_string());
        schema.indexes.insert(
            name,
            describe_index(&table, unique, &columns, predicate.as_deref()),
        );
    }
    pool.close().await;
    schema
}

/// Postgres's schema after its migrations, on the fresh database at `url`.
async fn postgres_schema(url: &str) -> Read {
    let pool = sqlx::PgPool::connect(url).await.unwrap();
    Schema::POSTGRES
        .bring_up(&mut *pool.acquire().await.unwrap())
        .await
        .unwrap();
    let mut schema = Read::default();
    let relations = sqlx::query(
        "SELECT table_type, table_name FROM information_schema.tables \
         WHERE table_schema = 'public' AND table_name <> '_sqlx_migrations'",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    for r in relations {
        let (kind, name): (String, String) = (r.get(0), r.get(1));
        let columns = sqlx::query(
            "SELECT column_name::text, data_type::text FROM information_schema.columns \
             WHERE table_schema = 'public' AND table_name = $1",
        )
        .bind(&name)
        .fetch_all(&pool)
        .await
        .unwrap()
        .into_iter()
        .map(|c| (c.get::<String, _>(0), family(&c.get::<String, _>(1)).into()))
        .collect();
        let kind = if kind == "VIEW" { "view" } else { "table" };
        schema.relations.insert(name, (kind.into(), columns));
    }
    // The indexes the migrations create (not those backing a key or a constraint),
    // with their columns in order (an expression has no column).
    let indexes = sqlx::query(
        "SELECT i.relname::text, t.relname::text, x.indisunique, \
                array(SELECT coalesce(a.attname::text, '(expression)') \
                      FROM unnest(x.indkey::int2[]) WITH ORDINALITY AS k(attnum, ord) \
                      LEFT JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = k.attnum \
                      ORDER BY k.ord), \
                pg_get_expr(x.indpred, x.indrelid) \
         FROM pg_index x \
         JOIN pg_class i ON i.oid = x.indexrelid \
         JOIN pg_class t ON t.oid = x.indrelid \
         JOIN pg_namespace n ON n.oid = t.relnamespace \
         WHERE n.nspname = 'public' \
           AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = x.indexrelid)",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    for i in indexes {
        let (name, table, unique, columns): (String, String, bool, Vec<String>) =
            (i.get(0), i.get(1), i.get(2), i.get(3));
        let predicate: Option<String> = i.get(4);
        schema.indexes.insert(
            name,
            describe_index(&table, unique, &columns, predicate.as_deref()),
        );
    }
    pool.close().await;
    schema
}

/// An index in words: its table, whether it is unique, its columns, and the rows it
/// covers when it is partial (see [`predicate`]).
fn describe_index(
    table: &str,
    unique: bool,
    columns: &[String],
    predicate: Option<&str>,
) -> String {
    format!(
        "{}on {table} ({}){}",
        if unique { "unique " } else { "" },
        columns.join(", "),
        predicate
            .map(|p| format!(" where {}", self::predicate(p)))
            .unwrap_or_default()
    )
}

/// A partial index's condition in one spelling for both databases: SQLite keeps it as
/// written, Postgres as it reads it back (`(status = ANY (ARRAY['a'::text, …]))` for
/// `status IN ('a', …)`, in parentheses, with casts). Lower case, without casts to text
/// and without parentheses, with `= ANY (ARRAY[…])` read as `IN (…)`, and single spaces.
fn predicate(p: &str) -> String {
    let mut s = p.to_ascii_lowercase().replace("::text", "");
    while let Some(at) = s.find(" = any (array[") {
        let Some(len) = s[at..].find("])") else { break };
        let items = s[at + " = any (array[".len()..at + len].to_string();
        s.replace_range(at..at + len + 2, &format!(" in ({items})"));
    }
    s.replace(['(', ')'], "")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// Every difference between the two schemas, in words.
fn differences(sqlite: &Read, postgres: &Read) -> Vec<String> {
    let mut out = Vec::new();
    let names = |s: &Read| s.relations.keys().cloned().collect::<Vec<_>>();
    for name in names(sqlite).iter().chain(names(postgres).iter()) {
        let (Some((kind_s, cols_s)), Some((kind_p, cols_p))) =
            (sqlite.relations.get(name), postgres.relations.get(name))
        else {
            let only = if sqlite.relations.contains_key(name) {
                "SQLite"
            } else {
                "Postgres"
            };
            out.push(format!("relation {name} is only in {only}'s migrations"));
            continue;
        };
        if !out
            .iter()
            .any(|d| d.starts_with(&format!("relation {name}:")))
        {
            if kind_s != kind_p {
                out.push(format!(
                    "relation {name}: a {kind_s} on SQLite, a {kind_p} on Postgres"
                ));
            }
            for (column, fam_s) in cols_s {
                match cols_p.get(column) {
                    None => out.push(format!(
                        "relation {name}: column {column} is only on SQLite"
                    )),
                    Some(fam_p) if fam_s != fam_p && fam_s != "any" && fam_p != "any" => out
                        .push(format!(
                            "relation {name}: column {column} is {fam_s} on SQLite, {fam_p} on Postgres"
                        )),
                    Some(_) => {}
                }
            }
            for column in cols_p.keys().filter(|c| !cols_s.contains_key(*c)) {
                out.push(format!(
                    "relation {name}: column {column} is only on Postgres"
                ));
            }
        }
    }
    for name in sqlite.indexes.keys().chain(postgres.indexes.keys()) {
        match (sqlite.indexes.get(name), postgres.indexes.get(name)) {
            (Some(a), Some(b)) if a != b => {
                out.push(format!("index {name}: {a} on SQLite, {b} on Postgres"));
            }
            (Some(_), None) => out.push(format!("index {name} is only on SQLite")),
            (None, Some(_)) => out.push(format!("index {name} is only on Postgres")),
            _ => {}
        }
    }
    out.sort();
    out.dedup();
    out
}

/// Runs on Postgres (the test command's Postgres pass; named for it).
#[tokio::test]
async fn postgres_and_sqlite_migrations_give_one_schema() {
    let Some(unit) = crate::postgres::UnitDb::create().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let sqlite = sqlite_schema(dir.path()).await;
    let postgres = postgres_schema(&unit.url).await;
    unit.remove().await;
    assert!(
        sqlite.relations.len() > 10 && sqlite.indexes.len() > 10,
        "the schema was not read: {sqlite:?}"
    );
    let unmeant: Vec<String> = differences(&sqlite, &postgres)
        .into_iter()
        .filter(|d| {
            !MEANT
                .iter()
                .any(|(what, _)| d.starts_with(&format!("{what} ")))
        })
        .collect();
    assert!(
        unmeant.is_empty(),
        "the SQLite and Postgres migrations disagree:\n{}",
        unmeant.join("\n")
    );
}

#[test]
fn a_column_one_tree_lacks_is_a_difference() {
    let table = |cols: &[(&str, &str)]| {
        let columns = cols
            .iter()
            .map(|(c, t)| (c.to_string(), family(t).to_string()))
            .collect();
        Read {
            relations: BTreeMap::from([("jobs".to_string(), ("table".to_string(), columns))]),
            indexes: BTreeMap::new(),
        }
    };
    let sqlite = table(&[("id", "TEXT"), ("attempts", "INTEGER"), ("reward", "REAL")]);
    let postgres = table(&[
        ("id", "text"),
        ("attempts", "bigint"),
        ("reward", "double precision"),
    ]);
    assert!(differences(&sqlite, &postgres).is_empty());
    let more = table(&[
        ("id", "text"),
        ("attempts", "bigint"),
        ("reward", "double precision"),
        ("note", "text"),
    ]);
    assert_eq!(
        differences(&sqlite, &more),
        ["relation jobs: column note is only on Postgres"]
    );
    let retyped = table(&[
        ("id", "text"),
        ("attempts", "text"),
        ("reward", "double precision"),
    ]);
    assert_eq!(
        differences(&sqlite, &retyped),
        ["relation jobs: column attempts is integer on SQLite, text on Postgres"]
    );
}

/// The two databases' spellings of one condition read the same; a different condition
/// does not.
#[test]
fn a_partial_index_reads_the_same_on_both_and_a_different_condition_differs() {
    assert_eq!(
        predicate("status IN ('failed', 'timed_out')"),
        predicate("(status = ANY (ARRAY['failed'::text, 'timed_out'::text]))")
    );
    assert_eq!(
        predicate("finished_at IS NULL"),
        predicate("(finished_at IS NULL)")
    );
    let index = |p: &str| {
        let mut indexes = BTreeMap::new();
        let columns = ["created_at".to_string()];
        indexes.insert(
            "jobs_open".to_string(),
            describe_index("jobs", false, &columns, Some(p)),
        );
        Read {
            relations: BTreeMap::new(),
            indexes,
        }
    };
    let sqlite = index("finished_at IS NULL");
    assert!(differences(&sqlite, &index("(finished_at IS NULL)")).is_empty());
    assert_eq!(
        differences(&sqlite, &index("(finished_at IS NOT NULL)")),
        [
            "index jobs_open: on jobs (created_at) where finished_at is null on SQLite, \
          on jobs (created_at) where finished_at is not null on Postgres"
        ]
    );
}
