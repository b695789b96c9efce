//! Pythonic tool calls (Llama 3.2's and Llama 4's pythonic templates, ToolACE), as
//! vLLM's `pythonic` parser reads them: the whole turn is one Python list of calls
//! with keyword arguments, `[get_weather(city="Paris", days=3), finish(answer='ok')]`.
//!
//! As vLLM reads it (`ast.parse` of the turn): the turn must start with `[` and hold
//! nothing but that list; each argument's value a Python literal (a string, a number,
//! `True`/`False`/`None`, a list or a dict of them). Anything else is an answer with no
//! calls.

use serde_json::{Map, Number, Value};

use super::{ParsedTurn, ToolCall, outside_reasoning};

/// Parses a pythonic list of calls outside the model's reasoning.
pub fn parse_pythonic(text: &str, reasoning_open: bool) -> ParsedTurn {
    outside_reasoning(text, reasoning_open, calls)
}

/// The calls of `text` into `turn` when it is one list of calls; else all of it into
/// `content`.
fn calls(text: &str, turn: &mut ParsedTurn, content: &mut String) {
    // Reasoning before the list leaves a newline or two ahead of it.
    let body = text.trim_start_matches('\n');
    let mut p = Reader { s: body, at: 0 };
    match p.call_list() {
        Some(calls) if p.rest().trim().is_empty() && !calls.is_empty() => {
            turn.calls.extend(calls.into_iter().map(Ok));
        }
        _ => content.push_str(text),
    }
}

/// A cursor over the turn's text.
struct Reader<'a> {
    s: &'a str,
    at: usize,
}

impl Reader<'_> {
    fn rest(&self) -> &str {
        &self.s[self.at..]
    }

    fn skip_space(&mut self) {
        let rest = self.rest();
        self.at += rest.len() - rest.trim_start().len();
    }

    fn eat(&mut self, c: char) -> bool {
        self.skip_space();
        if self.rest().starts_with(c) {
            self.at += c.len_utf8();
            true
        } else {
            false
        }
    }

    fn ident(&mut self) -> Option<String> {
        self.skip_space();
        let rest = self.rest();
        let end = rest
            .char_indices()
            .find(|&(i, c)| !(c == '_' || c.is_alphanumeric()) || (i == 0 && c.is_numeric()))
            .map_or(rest.len(), |(i, _)| i);
        let word = rest[..end].to_string();
        (end > 0).then(|| {
            self.at += end;
            word
        })
    }

    /// `[call, call, …]`, the list starting right at the cursor (no indent).
    fn call_list(&mut self) -> Option<Vec<ToolCall>> {
        if !self.rest().starts_with('[') {
            return None;
        }
        self.at += 1;
        let mut out = Vec::new();
        loop {
            if self.eat(']') {
                return Some(out);
            }
            out.push(self.call()?);
            if !self.eat(',') {
                return self.eat(']').then_some(out);
            }
        }
    }

    /// `name(key=value, …)`.
    fn call(&mut self) -> Option<ToolCall> {
        let name = self.ident()?;
        if !self.eat('(') {
            return None;
        }
        let mut arguments = Map::new();
        loop {
            if self.eat(')') {
                break;
            }
            let key = self.ident()?;
            if !self.eat('=') {
                return None;
            }
            arguments.insert(key, self.value()?);
            if !self.eat(',') {
                if !self.eat(')') {
                    return None;
                }
                break;
            }
        }
        Some(ToolCall {
            name,
            arguments: Value::Object(arguments),
            raw_arguments: None,
            id: None,
        })
    }

    /// A Python literal as JSON.
    fn value(&mut self) -> Option<Value> {
        self.skip_space();
        let c = self.rest().chars().next()?;
        match c {
            '\'' | '"' => self.string().map(Value::String),
            '[' => {
                self.at += 1;
                let mut items = Vec::new();
                loop {
                    if self.eat(']') {
                        return Some(Value::Array(items));
                    }
                    items.push(self.value()?);
                    if !self.eat(',') {
                        return self.eat(']').then_some(Value::Array(items));
                    }
                }
            }
            '{' => {
                self.at += 1;
                let mut map = Map::new();
                loop {
                    if self.eat('}') {
                        return Some(Value::Object(map));
                    }
                    self.skip_space();
                    let key = self.string()?;
                    if !self.eat(':') {
                        return None;
                    }
                    map.insert(key, self.value()?);
                    if !self.eat(',') {
                        return self.eat('}').then_some(Value::Object(map));
                    }
                }
            }
            _ => {
                if let Some(word) = self.ident() {
                    return match word.as_str() {
                        "True" => Some(Value::Bool(true)),
                        "False" => Some(Value::Bool(false)),
                        "None" => Some(Value::Null),
                        _ => None,
                    };
                }
                self.number()
            }
        }
    }

    /// A quoted string (single or double quotes) with Python's common escapes.
    fn string(&mut self) -> Option<String> {
        let rest = self.rest();
        let quote = rest.chars().next().filter(|c| *c == '\'' || *c == '"')?;
        let mut out = String::new();
        let mut chars = rest[1..].char_indices();
        while let Some((i, c)) = chars.next() {
            match c {
                c if c == quote => {
                    self.at += 1 + i + 1;
                    return Some(out);
                }
                '\n' => return None,
                '\\' => match chars.next()?.1 {
                    'n' => out.push('\n'),
                    't' => out.push('\t'),
                    'r' => out.push('\r'),
                    '0' => out.push('\0'),
                    '\\' => out.push('\\'),
                    '\'' => out.push('\''),
                    '"' => out.push('"'),
                    'u' => {
                        let hex: String = (0..4)
                            .filter_map(|_| chars.next().map(|(_, c)| c))
                            .collect();
                        out.push(char::from_u32(u32::from_str_radix(&hex, 16).ok()?)?);
                    }
                    other => {
                        out.push('\\');
                        out.push(other);
                    }
                },
                c => out.push(c),
            }
        }
        None
    }

    /// An integer or a float (`-3`, `2.5`, `1e-7`).
    fn number(&mut self) -> Option<Value> {
        let rest = self.rest();
        let end = rest
            .char_indices()
            .find(|&(i, c)| {
                !(c.is_ascii_digit()
                    || c == '.'
                    || c == 'e'
                    || c == 'E'
                    || c == '_'
                    || ((c == '-' || c == '+') && (i == 0 || rest[..i].ends_with(['e', 'E']))))
            })
            .map_or(rest.len(), |(i, _)| i);
        let text = rest[..end].replace('_', "");
        if text.is_empty() {
            return None;
        }
        let value = match text.parse::<i64>() {
            Ok(n) => Value::Number(n.into()),
            Err(_) => Value::Number(Number::from_f64(text.parse::<f64>().ok()?)?),
        };
        self.at += end;
        Some(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_list_of_calls_with_python_literals() {
        let t = parse_pythonic(
            "[get_weather(city=\"Paris\", days=3, units='c'), run(cmd=\"ls -la\\n\", opts={'all': True, 'depth': None}, xs=[1, -2.5, 1e-7]), finish()]",
            false,
        );
        assert_eq!(t.content, "");
        let calls: Vec<ToolCall> = t.calls.into_iter().map(Result::unwrap).collect();
        assert_eq!(calls[0].name, "get_weather");
        assert_eq!(
            calls[0].arguments,
            json!({"city": "Paris", "days": 3, "units": "c"})
        );
        assert_eq!(
            calls[1].arguments,
            json!({"cmd": "ls -la\n", "opts": {"all": true, "depth": null}, "xs": [1, -2.5, 1e-7]})
        );
        assert_eq!(calls[2].arguments, json!({}));
    }

    /// As vLLM: what is not one list of keyword calls, alone in the turn, is an answer.
    #[test]
    fn what_is_not_a_list_of_calls() {
        for text in [
            "The answer is [1, 2].",
            "[f(1)]",
            "[f(x=y)]",
            "[f(x=1)] and more",
            " [f(x=1)]",
            "[]",
            "[f(x='unclosed)]",
        ] {
            let t = parse_pythonic(text, false);
            assert!(t.calls.is_empty(), "{text}: {t:?}");
            assert_eq!(t.content, text.trim());
        }
    }
}
