//! Which parser reads a model's tool calls, found from the model's own chat template
//! (the `auto` parser, the default).
//!
//! A model is trained to write its calls the way its template writes them back. So the
//! template is asked to write one: a conversation whose assistant turn calls a probe
//! tool with a probe argument is rendered (the arguments as an object, and again as
//! the JSON string OpenAI clients send, since some templates concatenate them; the
//! call's id in Kimi-K2's shape, and again in Mistral's), and
//! every parser reads the text after the user's turn (and that text without what the
//! template writes around any assistant message, Llama's header and end-of-turn token,
//! which the model does not write). The parser that reads back
//! exactly that call is the model's; none, or more than one, and the model is refused
//! with what its template writes and the parsers there are.

use serde_json::{Value, json};

use super::{Parser, parse_turn};
use crate::agent::model::ModelFiles;

/// The probe tool's name, argument and value: words no template writes of itself.
const TOOL: &str = "probe_tool_rollout";
const ARG: &str = "probe_arg";
const VALUE: &str = "probe value 7";
/// The user's message, after which the template writes the assistant's turn.
const USER: &str = "PROBE-USER-TURN";
/// An assistant message's text, to find what the template writes around it.
const TEXT: &str = "PROBE-ASSISTANT-TEXT";

/// The parser settings or a spec name (`name`) for episodes of `model`, and why it is
/// that one: the one named, or for `auto` the one its template implies ([`detect`]).
pub fn choose(name: &str, model: &ModelFiles) -> Result<(Parser, String), String> {
    if let Some(p) = Parser::from_name(name) {
        return Ok((p, format!("named (`{name}`)")));
    }
    if name != Parser::AUTO {
        return Err(format!("parser `{name}` {}", Parser::expected()));
    }
    let (parser, why) = detect(model)?;
    tracing::debug!(?parser, why = %why, "tool-call parser chosen from the model's template");
    Ok((parser, why))
}

/// The parser that reads back the call `model`'s template writes (with tools offered),
/// and why; or why none can be chosen.
pub fn detect(model: &ModelFiles) -> Result<(Parser, String), String> {
    let schema = json!({"type": "function", "function": {
        "name": TOOL, "description": "A probe.",
        "parameters": {"type": "object", "properties": {ARG: {"type": "string"}}, "required": [ARG]}
    }});
    let template = model.template_for(true);
    let tools = Some(std::slice::from_ref(&schema));
    let no_args = serde_json::Map::new();
    // What the template writes around an assistant message's text (Llama's header
    // before it, its end-of-turn token after): the model writes neither, and parsers
    // that read a whole turn as calls (`pythonic`) are shown the turn without them too.
    let plain = [
        json!({"role": "user", "content": USER}),
        json!({"role": "assistant", "content": TEXT}),
    ];
    let frame = template
        .render(&plain, tools, false, &no_args)
        .ok()
        .and_then(|text| {
            let after = &text[text.rfind(USER)? + USER.len()..];
            let (head, tail) = after.split_once(TEXT)?;
            Some((head.to_string(), tail.to_string()))
        });
    let mut written = Vec::new();
    let mut errors = Vec::new();
    let forms = [
        json!({ARG: VALUE}),
        Value::String(json!({ARG: VALUE}).to_string()),
    ];
    // Ids in the shapes templates insist on: Kimi-K2's names the tool (its parser reads
    // the name from it), Mistral's are nine letters or digits.
    let ids = [format!("functions.{TOOL}:0"), "call00000".to_string()];
    for (arguments, id) in forms.iter().flat_map(|a| ids.iter().map(move |i| (a, i))) {
        let messages = [
            json!({"role": "user", "content": USER}),
            json!({"role": "assistant", "content": "", "tool_calls": [
                {"id": id, "type": "function", "function": {"name": TOOL, "arguments": arguments}}
            ]}),
        ];
        match template.render(&messages, tools, false, &no_args) {
            Ok(text) => {
                let after = text
                    .rfind(USER)
                    .map_or(&text[..], |at| &text[at + USER.len()..]);
                written.push(after.to_string());
                if let Some((head, tail)) = &frame
                    && let Some(turn) = after
                        .strip_prefix(head.as_str())
                        .and_then(|t| t.strip_suffix(tail.as_str()))
                {
                    written.push(turn.to_string());
                }
            }
            Err(e) => errors.push(e.to_string()),
        }
    }
    let reads = |p: Parser| {
        written.iter().any(|text| {
            let turn = parse_turn(p, text, false);
            matches!(&turn.calls[..], [Ok(c)] if c.name == TOOL && c.arguments == json!({ARG: VALUE}))
        })
    };
    // The parsers that look for their own markup first; `llama3_json` reads any JSON
    // object with a name (a Hermes call's inside too), so it is the model's only when
    // none of those reads the call. `bash_block` reads no template's calls.
    let mut found: Vec<&str> = Parser::ALL
        .iter()
        .filter(|(_, p)| !matches!(p, Parser::BashBlock | Parser::Llama3Json) && reads(*p))
        .map(|(n, _)| *n)
        .collect();
    if found.is_empty() && reads(Parser::Llama3Json) {
        found.push("llama3_json");
    }
    match found[..] {
        [name] => {
            let parser = Parser::from_name(name).unwrap_or_default();
            Ok((
                parser,
                format!("its chat template writes a tool call the `{name}` parser reads back"),
            ))
        }
        [] => {
            let shown = written
                .first()
                .map(|t| t.chars().take(300).collect::<String>())
                .unwrap_or_else(|| errors.join("; "));
            Err(format!(
                "no parser here reads the tool calls its chat template writes ({shown:?}); set `parser` to one of {}",
                Parser::expected_names()
            ))
        }
        _ => Err(format!(
            "several parsers read the tool calls its chat template writes ({}); set `parser` to the right one",
            found.join(", ")
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scripted::demo;

    /// Each template the project has a parser for is recognised; a template that
    /// writes calls in another format is refused, naming the parsers.
    #[test]
    fn the_template_names_its_parser() {
        let fixtures = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/templates/");
        for (file, want) in [
            ("chatml_tools.jinja", Parser::Hermes),
            ("qwen3_like.jinja", Parser::Hermes),
            ("qwen3_coder.jinja", Parser::Qwen3Coder),
            // Its template concatenates the arguments: only the JSON string renders.
            ("deepseek_r1.jinja", Parser::DeepseekR1),
            ("deepseek_v31.jinja", Parser::DeepseekR1),
            // Ids of nine characters, or it refuses the conversation.
            ("mistral_v3_tools.jinja", Parser::Mistral),
            ("mistral_v11_tools.jinja", Parser::Mistral),
            ("mistral_small31.jinja", Parser::Mistral),
            // The tool's name is read from the call's id.
            ("kimi_k2.jinja", Parser::KimiK2),
            ("kimi_k2_thinking.jinja", Parser::KimiK2),
            ("glm46.jinja", Parser::Glm45),
            ("gpt_oss.jinja", Parser::GptOss),
            ("llama4_pythonic.jinja", Parser::Pythonic),
            ("llama32_json.jinja", Parser::Llama3Json),
        ] {
            let source = std::fs::read_to_string(format!("{fixtures}{file}")).unwrap();
            let m = demo::model_files(&source, &demo::DEEPSEEK_R1_TOKENS).unwrap();
            let (got, why) = detect(&m).unwrap();
            assert_eq!(got, want, "{file}: {why}");
        }
        // GLM-4.5's shape of call, written by a small template of the test's own.
        let glm = "{% for m in messages %}{% if m.role == 'user' %}<|user|>{{ m.content }}\
            {% elif m.tool_calls %}<|assistant|>{% for c in m.tool_calls %}<tool_call>{{ c.function.name }}\
            {% for k, v in c.function.arguments.items() %}\n<arg_key>{{ k }}</arg_key>\n<arg_value>{{ v }}</arg_value>{% endfor %}\
            \n</tool_call>{% endfor %}{% endif %}{% endfor %}";
        let m = demo::model_files(glm, &[]).unwrap();
        assert_eq!(detect(&m).unwrap().0, Parser::Glm45);
        let llama = std::fs::read_to_string(format!("{fixtures}llama3_tools.jinja")).unwrap();
        let m = demo::model_files(&llama, &[]).unwrap();
        assert_eq!(detect(&m).unwrap().0, Parser::Llama3Json);
        // Llama 4's pythonic shape, written by a small template of the test's own.
        let pythonic = "{% for m in messages %}{% if m.tool_calls %}[{% for c in m.tool_calls %}\
            {{ c.function.name }}({% for k, v in c.function.arguments.items() %}{{ k }}={{ v | tojson }}\
            {% endfor %}){% endfor %}]{% else %}{{ m.content }}{% endif %}{% endfor %}";
        let m = demo::model_files(pythonic, &[]).unwrap();
        assert_eq!(detect(&m).unwrap().0, Parser::Pythonic);
        // Calls written in a shape no parser here reads.
        let other = "{% for m in messages %}{% if m.tool_calls %}{% for c in m.tool_calls %}\
            CALL {{ c.function.name }}({{ c.function.arguments }}){% endfor %}\
            {% else %}{{ m.content }}{% endif %}{% endfor %}";
        let m = demo::model_files(other, &[]).unwrap();
        let e = detect(&m).unwrap_err();
        assert!(e.contains("`qwen3_coder`") && e.contains(TOOL), "{e}");
    }
}
