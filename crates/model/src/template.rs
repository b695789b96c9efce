//! Chat templates: a model's Jinja `chat_template` rendered the way Hugging Face
//! transformers' `apply_chat_template` renders it.
//!
//! The prompt a policy was trained on is the template's exact output, so the renderer
//! must agree with transformers to the character. transformers renders in a sandboxed
//! Jinja2 environment with `trim_blocks` and `lstrip_blocks`, loop controls, the globals
//! `raise_exception` and `strftime_now`, and a `tojson` filter that is plain `json.dumps`
//! (`ensure_ascii=False`, no HTML escaping, key order kept, `", "` and `": "`
//! separators). minijinja's own `tojson` escapes `<`, `>`, `&` and `'` and writes compact
//! JSON, so it is replaced here; Python string methods (`strip`, `split`, `startswith`,
//! `items`, `get`, …) come from minijinja-contrib's pycompat callback. Printed values,
//! `string` and `join` write numbers, lists and dicts as Python's `str()` does (see
//! `pyrepr`).

use minijinja::value::{Kwargs, Serde, Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind};
use serde::Serialize;

/// Why a template could not be loaded or rendered.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TemplateError {
    /// `tokenizer_config.json` has no `chat_template` (or none of the wanted name).
    #[error("the tokenizer config has no chat template{0}")]
    Missing(String),
    /// The template does not parse.
    #[error("the chat template does not parse: {0}")]
    Syntax(String),
    /// Rendering failed, or the template called `raise_exception` (its message is here:
    /// templates use it to reject conversations they cannot format).
    #[error("the chat template failed: {0}")]
    Render(String),
}

const NAME: &str = "chat_template";

/// The named special tokens transformers passes to every template (its
/// `SPECIAL_TOKENS_ATTRIBUTES`); one the tokenizer does not set is undefined there.
const SPECIAL_TOKENS: [&str; 7] = [
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
];

/// The template variables every render sets itself; transformers refuses them as extra
/// template arguments ("got multiple values for keyword argument"), and so do task specs.
pub const RESERVED_ARGS: [&str; 4] = ["messages", "tools", "documents", "add_generation_prompt"];

/// The message fields transformers reads reasoning from, in its order of preference;
/// it copies the first one set into `reasoning_content` and `thinking`.
const REASONING_FIELDS: [&str; 3] = ["reasoning_content", "thinking", "reasoning"];

/// A loaded chat template with the special tokens it refers to.
pub struct ChatTemplate {
    env: Environment<'static>,
    /// The special tokens the tokenizer sets, by name (`bos_token`, …).
    special: Vec<(&'static str, String)>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("special", &self.special)
            .finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// Loads `source` with the special tokens the template may print; an empty one is
    /// taken as not set (undefined in the template, as transformers leaves it).
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self, TemplateError> {
        let special = [("bos_token", bos_token), ("eos_token", eos_token)]
            .into_iter()
            .filter(|(_, v)| !v.is_empty())
            .map(|(k, v)| (k, v.to_string()))
            .collect();
        Self::with_special_tokens(source, special)
    }

    /// Loads `source` with the tokenizer's special tokens, by name.
    fn with_special_tokens(
        source: &str,
        special: Vec<(&'static str, String)>,
    ) -> Result<Self, TemplateError> {
        let mut env = Environment::new();
        env.set_syntax(
            minijinja::syntax::SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .build()
                .map_err(|e| TemplateError::Syntax(e.to_string()))?,
        );
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        // Printed values, `string` and `join` as Python's `str()` writes them.
        env.set_formatter(|out, state, value| match value.kind() {
            ValueKind::Number | ValueKind::Seq | ValueKind::Map => {
                out.write_str(&super::pyrepr::python_str(value))?;
                Ok(())
            }
            _ => minijinja::escape_formatter(out, state, value),
        });
        env.add_filter("string", string);
        env.add_filter("join", join);
        env.add_filter("tojson", tojson);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter(super::iteration::FILTER, super::iteration::iterable);
        env.add_test("iterable", super::iteration::is_iterable);
        env.add_filter("length", length);
        env.add_filter("format", super::percent::format);
        env.add_filter("count", length);
        let source = super::literals::python_literals(source).map_err(TemplateError::Syntax)?;
        env.add_template_owned(NAME, super::iteration::guard_for_loops(&source))
            .map_err(|e| TemplateError::Syntax(describe(&e)))?;
        Ok(ChatTemplate { env, special })
    }

    /// Loads the template of a `tokenizer_config.json`. `chat_template` is either a
    /// string or a list of `{name, template}`; with a list, `name` picks one (transformers
    /// picks `tool_use` when tools are given and it exists, else `default`).
    pub fn from_tokenizer_config(
        config: &serde_json::Value,
        name: Option<&str>,
    ) -> Result<Self, TemplateError> {
        let source = match &config["chat_template"] {
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Array(list) => {
                let wanted = name.unwrap_or("default");
                list.iter()
                    .find(|t| t["name"] == wanted)
                    .and_then(|t| t["template"].as_str())
                    .map(str::to_string)
                    .ok_or_else(|| TemplateError::Missing(format!(" named `{wanted}`")))?
            }
            _ => return Err(TemplateError::Missing(String::new())),
        };
        let special = SPECIAL_TOKENS
            .iter()
            .filter_map(|&key| match &config[key] {
                serde_json::Value::String(s) => Some((key, s.clone())),
                // Older configs wrap special tokens: {"content": "<s>", ...}.
                v => v["content"].as_str().map(|s| (key, s.to_string())),
            })
            .collect();
        Self::with_special_tokens(&source, special)
    }

    /// Renders `messages` (OpenAI-style objects), offering `tools` (JSON schemas, as
    /// transformers passes them), optionally opening the assistant's turn; `extra`
    /// holds template switches such as `enable_thinking`.
    ///
    /// The messages are first normalised as transformers' `apply_chat_template` does:
    /// fields set to null are dropped (OpenAI clients send `tool_calls: null`, which
    /// templates test with `is defined`), and reasoning given under any of its names is
    /// copied to `reasoning_content` and `thinking`. `documents` is null, and the
    /// special tokens the tokenizer sets are defined.
    pub fn render<M: Serialize, T: Serialize>(
        &self,
        messages: &[M],
        tools: Option<&[T]>,
        add_generation_prompt: bool,
        extra: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String, TemplateError> {
        let context = self.context(tools, extra)?;
        let messages = messages
            .iter()
            .map(PreparedMessage::new)
            .collect::<Result<Vec<_>, _>>()?;
        self.render_prepared(&context, &messages, add_generation_prompt)
    }

    /// What every render of one conversation shares (the tools, the template switches
    /// in `extra`, the special tokens and `documents`), converted into the renderer's
    /// values once. Rendering a short conversation once per observation would otherwise
    /// convert the tool schemas every time, which costs more than the render itself.
    pub fn context<T: Serialize>(
        &self,
        tools: Option<&[T]>,
        extra: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<RenderContext, TemplateError> {
        let mut ctx = extra.clone();
        ctx.insert("documents".into(), serde_json::Value::Null);
        // Through one JSON value, keeping the callers' key order (serde_json is built
        // with `preserve_order`), which tool schemas must keep.
        let tools = match tools {
            Some(t) => serialise(t)?,
            None => serde_json::Value::Null,
        };
        ctx.insert("tools".into(), tools);
        for (name, token) in &self.special {
            // Arguments given by the caller win over special tokens, as in transformers.
            if !extra.contains_key(*name) {
                ctx.insert((*name).into(), token.clone().into());
            }
        }
        Ok(RenderContext(Value::from(Serde(
            serde_json::Value::Object(ctx),
        ))))
    }

    /// Renders `messages` in `context` (see [`ChatTemplate::context`]), optionally
    /// opening the assistant's turn; the same text as [`ChatTemplate::render`] with the
    /// tools and switches the context was made from.
    pub fn render_prepared(
        &self,
        context: &RenderContext,
        messages: &[PreparedMessage],
        add_generation_prompt: bool,
    ) -> Result<String, TemplateError> {
        let list: Vec<Value> = messages.iter().map(|m| m.0.clone()).collect();
        let own = minijinja::context! {
            messages => Value::from(list),
            add_generation_prompt => add_generation_prompt,
        };
        // The later map wins: `messages` and `add_generation_prompt` override switches
        // of the same name, as transformers' own arguments do.
        let ctx = minijinja::value::merge_maps([context.0.clone(), own]);
        let tmpl = self
            .env
            .get_template(NAME)
            .map_err(|e| TemplateError::Syntax(describe(&e)))?;
        tmpl.render(ctx)
            .map_err(|e| TemplateError::Render(describe(&e)))
    }
}

/// The template inputs shared by every render of one conversation; made by
/// [`ChatTemplate::context`]. Cloning it is cheap.
#[derive(Debug, Clone)]
pub struct RenderContext(Value);

/// One message normalised as transformers hands it to a template and converted into
/// the renderer's values, so a message rendered many times (the turn glue's fixed
/// conversation) is converted once. Cloning it is cheap.
#[derive(Debug, Clone)]
pub struct PreparedMessage(Value);

impl PreparedMessage {
    /// Normalises `message` (an OpenAI-style object) as [`ChatTemplate::render`]
    /// describes and converts it.
    pub fn new<M: Serialize>(message: &M) -> Result<Self, TemplateError> {
        let json = normalise_message(serialise(message)?);
        Ok(PreparedMessage(Value::from(Serde(json))))
    }
}

/// `value` as JSON, keeping its key order.
fn serialise<T: Serialize + ?Sized>(value: &T) -> Result<serde_json::Value, TemplateError> {
    serde_json::to_value(value)
        .map_err(|e| TemplateError::Render(format!("cannot serialise the input: {e}")))
}

/// One message as transformers hands it to the template: without null fields, and
/// with its reasoning under every name templates read it by. The key order is
/// transformers' too (`thinking` first, `reasoning_content` last unless present),
/// which a template printing the message with `tojson` shows.
fn normalise_message(message: serde_json::Value) -> serde_json::Value {
    let serde_json::Value::Object(fields) = message else {
        return message;
    };
    let mut fields: serde_json::Map<String, serde_json::Value> =
        fields.into_iter().filter(|(_, v)| !v.is_null()).collect();
    let reasoning = REASONING_FIELDS
        .iter()
        .find_map(|k| fields.get(*k).cloned());
    let Some(reasoning) = reasoning else {
        return serde_json::Value::Object(fields);
    };
    // Python's `{"thinking": r, **message, "reasoning_content": r}`: `thinking` comes
    // first and keeps the message's own value; `reasoning_content` keeps its place.
    let mut out = serde_json::Map::with_capacity(fields.len() + 2);
    let thinking = fields
        .remove("thinking")
        .unwrap_or_else(|| reasoning.clone());
    out.insert("thinking".into(), thinking);
    out.extend(fields);
    out.entry("reasoning_content").or_insert(reasoning);
    serde_json::Value::Object(out)
}

/// An error's message with its cause chain and the template line, for users.
fn describe(e: &Error) -> String {
    let mut s = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(inner) = source {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        source = inner.source();
    }
    s
}

/// `length` as Jinja2 has it: an undefined value has length 0 (minijinja refuses it);
/// `none` has none, as in Python.
fn length(v: &Value) -> Result<usize, Error> {
    if v.is_undefined() {
        return Ok(0);
    }
    minijinja::filters::length(v)
}

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// Jinja2's `string`: `str(value)`, a string left as it is (safe or not).
fn string(value: &Value) -> Value {
    if value.kind() == ValueKind::String {
        value.clone()
    } else {
        Value::from(super::pyrepr::python_str(value))
    }
}

/// Jinja2's `join(d="", attribute=None)`: `str()` of each item (or of its `attribute`),
/// joined by `d`.
fn join(value: &Value, d: Option<&str>, kwargs: Kwargs) -> Result<String, Error> {
    let attribute: Option<Value> = kwargs.get("attribute")?;
    kwargs.assert_all_used()?;
    if value.is_undefined() || value.is_none() {
        return Ok(String::new());
    }
    if let Some(s) = value.as_str() {
        // Joining a string joins its characters.
        return Ok(s
            .chars()
            .map(String::from)
            .collect::<Vec<_>>()
            .join(d.unwrap_or("")));
    }
    let mut parts = Vec::new();
    for item in value.try_iter()? {
        let item = match &attribute {
            Some(a) => item.get_item(a)?,
            None => item,
        };
        parts.push(super::pyrepr::python_str(&item));
    }
    Ok(parts.join(d.unwrap_or("")))
}

/// `tojson` as transformers defines it: `json.dumps(value, ensure_ascii=False,
/// indent=indent, separators=separators, sort_keys=sort_keys)`; `ensure_ascii` may be
/// passed too. Written by [`python_json_with`], so floats come out as Python writes them.
fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<Value> = kwargs.get("indent")?;
    let separators: Option<Value> = kwargs.get("separators")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    kwargs.assert_all_used()?;
    let bad = |m: &str| Error::new(ErrorKind::InvalidOperation, m.to_string());
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) => match (v.as_i64(), v.as_str()) {
            // A negative indent indents by nothing, as in Python.
            (Some(n), _) => Some(" ".repeat(usize::try_from(n).unwrap_or(0))),
            (None, Some(s)) => Some(s.to_string()),
            _ => return Err(bad("tojson: indent must be an integer or a string")),
        },
    };
    let mut opts = DumpOptions {
        item_sep: if indent.is_some() { "," } else { ", " }.to_string(),
        key_sep: ": ".to_string(),
        indent,
        sort_keys: sort_keys.unwrap_or(false),
        ensure_ascii: ensure_ascii.unwrap_or(false),
    };
    if let Some(sep) = separators.filter(|v| !v.is_none() && !v.is_undefined()) {
        let pair: Vec<String> = sep
            .try_iter()
            .map_err(|_| bad("tojson: separators must be a pair of strings"))?
            .map(|s| s.as_str().map(str::to_string))
            .collect::<Option<_>>()
            .ok_or_else(|| bad("tojson: separators must be a pair of strings"))?;
        let [item, key]: [String; 2] = pair
            .try_into()
            .map_err(|_| bad("tojson: separators must be a pair of strings"))?;
        (opts.item_sep, opts.key_sep) = (item, key);
    }
    let json = serde_json::to_value(value)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
    Ok(Value::from(python_json_with(&json, &opts)))
}

/// How [`python_json_with`] writes, as `json.dumps`'s arguments of the same names.
#[derive(Debug, Clone)]
pub struct DumpOptions {
    /// Indentation per level; `None` writes everything on one line.
    pub indent: Option<String>,
    /// Between items (`", "`, or `","` with an indent).
    pub item_sep: String,
    /// Between a key and its value (`": "`).
    pub key_sep: String,
    /// Object keys sorted.
    pub sort_keys: bool,
    /// Everything outside ASCII written as `\uXXXX` escapes.
    pub ensure_ascii: bool,
}

/// JSON text the way Python's `json.dumps(value, ensure_ascii=False, indent=indent)`
/// writes it.
pub fn python_json(value: &serde_json::Value, indent: Option<usize>) -> String {
    python_json_with(
        value,
        &DumpOptions {
            item_sep: if indent.is_some() { "," } else { ", " }.to_string(),
            key_sep: ": ".to_string(),
            indent: indent.map(|n| " ".repeat(n)),
            sort_keys: false,
            ensure_ascii: false,
        },
    )
}

/// JSON text the way Python's `json.dumps` writes it with `opts`: its separators and
/// indentation, its escapes, and its floats (`repr`: the shortest digits that read back,
/// in exponent form below 1e-4 and from 1e16 on, e.g. `1e-07`, `1e+16`, `2.5`).
pub fn python_json_with(value: &serde_json::Value, opts: &DumpOptions) -> String {
    let mut out = String::new();
    dump(value, opts, 0, &mut out);
    out
}

fn dump(value: &serde_json::Value, opts: &DumpOptions, level: usize, out: &mut String) {
    use serde_json::Value as J;
    match value {
        J::Null => out.push_str("null"),
        J::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        J::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => out.push_str(&i.to_string()),
            (_, Some(u), _) => out.push_str(&u.to_string()),
            (_, _, Some(f)) => out.push_str(&python_float(f)),
            _ => out.push_str(&n.to_string()),
        },
        J::String(s) => dump_str(s, opts.ensure_ascii, out),
        J::Array(items) if items.is_empty() => out.push_str("[]"),
        J::Object(map) if map.is_empty() => out.push_str("{}"),
        J::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                separate(i, opts, level + 1, out);
                dump(item, opts, level + 1, out);
            }
            newline(opts, level, out);
            out.push(']');
        }
        J::Object(map) => {
            out.push('{');
            let mut entries: Vec<_> = map.iter().collect();
            if opts.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(b.0));
            }
            for (i, (k, v)) in entries.into_iter().enumerate() {
                separate(i, opts, level + 1, out);
                dump_str(k, opts.ensure_ascii, out);
                out.push_str(&opts.key_sep);
                dump(v, opts, level + 1, out);
            }
            newline(opts, level, out);
            out.push('}');
        }
    }
}

/// Before the `i`-th item of a container whose items are at `level`.
fn separate(i: usize, opts: &DumpOptions, level: usize, out: &mut String) {
    if i > 0 {
        out.push_str(&opts.item_sep);
    }
    newline(opts, level, out);
}

fn newline(opts: &DumpOptions, level: usize, out: &mut String) {
    if let Some(indent) = &opts.indent {
        out.push('\n');
        for _ in 0..level {
            out.push_str(indent);
        }
    }
}

/// A string as `json.dumps` quotes it.
fn dump_str(s: &str, ensure_ascii: bool, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c if ensure_ascii && !c.is_ascii() => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A float as Python's `json.dumps` writes it: `repr(f)` (see `pyrepr`), with `NaN`
/// and `Infinity` for the values JSON has no numbers for.
pub fn python_float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    super::pyrepr::float_repr(f)
}

/// `strftime_now(format)`: the current UTC time with the C `strftime` directives chat
/// templates use (`%Y %m %d %e %b %B %a %A %H %M %S %y %j %%`).
fn strftime_now(format: String) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0);
    strftime(&format, secs)
}

/// Formats `unix_secs` (UTC) with the directives of `strftime_now`.
pub fn strftime(format: &str, unix_secs: i64) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = [
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
        "Monday",
        "Tuesday",
        "Wednesday",
    ];
    let days = unix_secs.div_euclid(86_400);
    let rem = unix_secs.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let cumulative = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let month_index = usize::try_from(month - 1).expect("the month is in 1..=12");
    let yday = cumulative[month_index] + day + i64::from(leap && month > 2);
    let weekday = DAYS[usize::try_from(days.rem_euclid(7)).expect("a remainder of 7 is in 0..7")];
    let month_name = MONTHS[month_index];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&year.to_string()),
            Some('y') => out.push_str(&format!("{:02}", year % 100)),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('e') => out.push_str(&format!("{day:2}")),
            Some('j') => out.push_str(&format!("{yday:03}")),
            Some('b') => out.push_str(&month_name[..3]),
            Some('B') => out.push_str(month_name),
            Some('a') => out.push_str(&weekday[..3]),
            Some('A') => out.push_str(weekday),
            Some('H') => out.push_str(&format!("{:02}", rem / 3600)),
            Some('M') => out.push_str(&format!("{:02}", rem / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", rem % 60)),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_json_matches_json_dumps() {
        let v = serde_json::json!({"b": [1, 2.5, "é<&>'"], "a": {"x": null, "y": true}});
        assert_eq!(
            python_json(&v, None),
            r#"{"b": [1, 2.5, "é<&>'"], "a": {"x": null, "y": true}}"#
        );
        assert_eq!(
            python_json(&serde_json::json!({"a": [1]}), Some(2)),
            "{\n  \"a\": [\n    1\n  ]\n}"
        );
    }

    #[test]
    fn floats_and_options_as_python_writes_them() {
        // Each pair: a float and Python's `json.dumps` of it.
        for (f, py) in [
            (1e-7, "1e-07"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (2.5, "2.5"),
            (100.0, "100.0"),
            (1e16, "1e+16"),
            (1.5e300, "1.5e+300"),
            (123456789012345.6, "123456789012345.6"),
            (-0.0, "-0.0"),
            (0.1, "0.1"),
            (-3.25e-10, "-3.25e-10"),
        ] {
            assert_eq!(python_float(f), py, "{f}");
        }
        let v: serde_json::Value =
            serde_json::from_str(r#"{"b": "é☃😀", "a": [1.10, 1e-7]}"#).unwrap();
        let opts = DumpOptions {
            indent: None,
            item_sep: ",".into(),
            key_sep: ":".into(),
            sort_keys: true,
            ensure_ascii: true,
        };
        // json.dumps(v, separators=(",", ":"), sort_keys=True)
        assert_eq!(
            python_json_with(&v, &opts),
            r#"{"a":[1.1,1e-07],"b":"\u00e9\u2603\ud83d\ude00"}"#
        );
        let env = {
            let mut env = minijinja::Environment::new();
            env.add_filter("tojson", tojson);
            env
        };
        let out = env
            .render_str(
                "{{ v | tojson(separators=(',', ':'), sort_keys=true) }}|{{ v | tojson(ensure_ascii=true) }}|{{ [] | tojson(indent=2) }}",
                minijinja::context! { v => Value::from(Serde(v.clone())) },
            )
            .unwrap();
        assert_eq!(
            out,
            r#"{"a":[1.1,1e-07],"b":"é☃😀"}|{"b": "\u00e9\u2603\ud83d\ude00", "a": [1.1, 1e-07]}|[]"#
        );
    }

    #[test]
    fn strftime_formats_known_dates() {
        // 2024-02-29 13:05:09 UTC, a Thursday.
        let t = 1_709_211_909;
        assert_eq!(strftime("%d %b %Y", t), "29 Feb 2024");
        assert_eq!(
            strftime("%A %B %e, %H:%M:%S %j %y %%", t),
            "Thursday February 29, 13:05:09 060 24 %"
        );
        assert_eq!(strftime("%Y-%m-%d", 0), "1970-01-01");
    }

    #[test]
    fn templates_get_python_semantics() {
        let src = "{%- set ns = namespace(n=0) -%}\n\
            {% for m in messages %}{% if m.role == 'skip' %}{% continue %}{% endif %}\
            {% set ns.n = ns.n + 1 %}[{{ m.content.strip().split(' ')[-1] }}|{{ m.content[:3] }}]{% endfor %}\n\
            {{ ns.n }} {{ tools | tojson }}{{ bos_token }}";
        let t = ChatTemplate::new(src, "<s>", "</s>").unwrap();
        let messages = serde_json::json!([
            {"role": "user", "content": "  hello big world "},
            {"role": "skip", "content": "x"},
            {"role": "user", "content": "abcdef"}
        ]);
        let tools = [serde_json::json!({"name": "f", "description": "<b> & 'q'"})];
        let out = t
            .render(
                messages.as_array().unwrap(),
                Some(&tools[..]),
                false,
                &Default::default(),
            )
            .unwrap();
        assert_eq!(
            out,
            "[world|  h][abcdef|abc]2 [{\"name\": \"f\", \"description\": \"<b> & 'q'\"}]<s>"
        );
    }

    #[test]
    fn raise_exception_reports_the_templates_message() {
        let t = ChatTemplate::new("{{ raise_exception('roles must alternate') }}", "", "").unwrap();
        let err = t
            .render::<serde_json::Value, serde_json::Value>(&[], None, false, &Default::default())
            .unwrap_err();
        assert!(err.to_string().contains("roles must alternate"), "{err}");
    }
}

/// The project's own test templates (tests/fixtures/templates) against snapshots; that
/// transformers renders the same bytes is checked in `tests/templates.rs`.
#[cfg(test)]
mod snapshots {
    use super::*;

    const CHATML: &str = include_str!("../../../tests/fixtures/templates/chatml_tools.jinja");
    const LLAMA3: &str = include_str!("../../../tests/fixtures/templates/llama3_tools.jinja");

    fn tools() -> Vec<serde_json::Value> {
        // Key order as a trainer would send it; it must survive into the prompt.
        vec![serde_json::json!({
            "type": "function",
            "function": {
                "name": "bash",
                "description": "Run a command in the sandbox's shell & return <stdout>.",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "command": {"type": "string", "description": "The command."},
                        "timeout": {"type": "integer", "description": "Seconds."}
                    },
                    "required": ["command"]
                }
            }
        })]
    }

    fn conversation() -> Vec<serde_json::Value> {
        serde_json::json!([
            {"role": "system", "content": "You fix bugs. Be brief."},
            {"role": "user", "content": "  Which files are here?  "},
            {"role": "assistant", "content": "Let me look.", "tool_calls": [
                // Floats as a model writes them render as Python's json.dumps writes them.
                {"type": "function", "function": {"name": "bash", "arguments": {"command": "ls", "timeout": 5, "ratio": 1e-7, "scale": 2.50, "big": 1e16}}}
            ]},
            {"role": "tool", "content": "stats.py\ntest_stats.py"},
            {"role": "assistant", "content": "Two files: stats.py and test_stats.py — ünïcode ok."},
            {"role": "user", "content": "Run the tests."}
        ])
        .as_array()
        .unwrap()
        .clone()
    }

    #[test]
    fn chatml_with_tools() {
        let t = ChatTemplate::new(CHATML, "", "<|im_end|>").unwrap();
        let tools = tools();
        let msgs = conversation();
        let out = t
            .render(&msgs, Some(&tools[..]), true, &Default::default())
            .unwrap();
        insta::assert_snapshot!(out);
    }

    #[test]
    fn chatml_without_tools_and_thinking_off() {
        let t = ChatTemplate::new(CHATML, "", "<|im_end|>").unwrap();
        let mut extra = serde_json::Map::new();
        extra.insert("enable_thinking".into(), false.into());
        let msgs = &conversation()[..2];
        let out = t
            .render::<_, serde_json::Value>(msgs, None, true, &extra)
            .unwrap();
        insta::assert_snapshot!(out);
    }

    /// One context serves many renders: each equals a render made from scratch, and a
    /// caller's switch of the same name does not displace `add_generation_prompt`.
    #[test]
    fn a_context_is_reused_across_renders() {
        let t = ChatTemplate::new(CHATML, "", "<|im_end|>").unwrap();
        let tools = tools();
        let mut extra = serde_json::Map::new();
        extra.insert("enable_thinking".into(), false.into());
        extra.insert("add_generation_prompt".into(), false.into());
        let ctx = t.context(Some(&tools[..]), &extra).unwrap();
        let msgs = conversation();
        for n in 1..=msgs.len() {
            let prepared: Vec<PreparedMessage> = msgs[..n]
                .iter()
                .map(|m| PreparedMessage::new(m).unwrap())
                .collect();
            let fresh = t
                .render(&msgs[..n], Some(&tools[..]), true, &extra)
                .unwrap();
            assert_eq!(t.render_prepared(&ctx, &prepared, true).unwrap(), fresh);
            assert!(fresh.contains("<|im_start|>assistant\n<think>"), "{fresh}");
        }
    }

    #[test]
    fn chatml_rejects_unknown_roles() {
        let t = ChatTemplate::new(CHATML, "", "<|im_end|>").unwrap();
        let msgs = [serde_json::json!({"role": "narrator", "content": "x"})];
        let err = t
            .render::<_, serde_json::Value>(&msgs, None, false, &Default::default())
            .unwrap_err();
        assert!(err.to_string().contains("unknown role: narrator"), "{err}");
    }

    #[test]
    fn llama3_with_tools() {
        let t = ChatTemplate::new(LLAMA3, "<|begin_of_text|>", "<|eot_id|>").unwrap();
        let tools: Vec<serde_json::Value> =
            tools().into_iter().map(|t| t["function"].clone()).collect();
        let mut extra = serde_json::Map::new();
        extra.insert("date_string".into(), "26 Jul 2024".into());
        let msgs = conversation();
        let out = t.render(&msgs, Some(&tools[..]), true, &extra).unwrap();
        insta::assert_snapshot!(out);
    }

    #[test]
    fn llama3_dates_itself_when_not_told() {
        let t = ChatTemplate::new(LLAMA3, "<|begin_of_text|>", "<|eot_id|>").unwrap();
        let msgs = [serde_json::json!({"role": "user", "content": "hi"})];
        let out = t
            .render::<_, serde_json::Value>(&msgs, None, false, &Default::default())
            .unwrap();
        let today = strftime_now("%d %b %Y".into());
        assert!(out.contains(&format!("Today Date: {today}\n")), "{out}");
    }

    #[test]
    fn llama3_refuses_two_calls_in_a_turn() {
        let t = ChatTemplate::new(LLAMA3, "<|begin_of_text|>", "<|eot_id|>").unwrap();
        let call = serde_json::json!({"function": {"name": "f", "arguments": {}}});
        let msgs = [
            serde_json::json!({"role": "user", "content": "hi"}),
            serde_json::json!({"role": "assistant", "tool_calls": [call.clone(), call]}),
        ];
        let err = t
            .render::<_, serde_json::Value>(&msgs, None, false, &Default::default())
            .unwrap_err();
        assert!(err.to_string().contains("one tool call per turn"), "{err}");
    }
}
