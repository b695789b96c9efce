//! Finding the final answer in a model's response, the places a careful reader looks:
//! the last `\boxed{…}` or `\fbox{…}`; else the last "the (final) answer is …" or
//! "Answer: …"; else GSM8K's `#### N`; and for a multiple-choice question, a final
//! choice letter. A response that ends by boxing two different answers has not
//! committed to one, and gets none.

/// Where the answer was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// `\boxed{…}` / `\fbox{…}`.
    Boxed,
    /// "The answer is …", "Answer: …".
    Stated,
    /// `#### N`.
    Hashes,
    /// A final choice letter.
    Choice,
}

/// An answer found in a response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// The answer's text.
    pub text: String,
    /// Where it was.
    pub source: Source,
}

/// Why no answer was taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoAnswer {
    /// Nothing that states a final answer.
    #[error(
        "the response states no final answer (no \\boxed{{}}, \"the answer is\", #### or choice letter)"
    )]
    Missing,
    /// Several different final answers.
    #[error("the response gives several different final answers: {0:?}")]
    Hedged(Vec<String>),
}

/// The contents of every `\boxed{…}` / `\fbox{…}` in `text`, in order, with where each
/// ends. Braces inside balance; `\boxed 5` (no braces) takes the next word.
fn boxes(text: &str) -> Vec<(String, usize)> {
    let mut out = Vec::new();
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    let mut i = 0;
    while i < chars.len() {
        let rest = &text[chars[i].0..];
        let skip = if rest.starts_with("\\boxed") {
            6
        } else if rest.starts_with("\\fbox") {
            5
        } else {
            i += 1;
            continue;
        };
        let mut j = i + skip;
        while j < chars.len() && chars[j].1 == ' ' {
            j += 1;
        }
        if j < chars.len() && chars[j].1 == '{' {
            let mut depth = 0usize;
            let start = j + 1;
            let mut k = j;
            while k < chars.len() {
                match chars[k].1 {
                    '\\' => k += 1,
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    _ => {}
                }
                k += 1;
            }
            if k >= chars.len() {
                break; // unclosed: not an answer
            }
            let from = chars[start].0;
            let to = chars[k].0;
            out.push((text[from..to].trim().to_string(), to));
            i = k + 1;
        } else {
            let from = chars.get(j).map_or(text.len(), |c| c.0);
            let word: String = text[from..]
                .chars()
                .take_while(|c| !c.is_whitespace() && *c != '$')
                .collect();
            if !word.is_empty() {
                out.push((word.clone(), from + word.len()));
            }
            i = j + 1;
        }
    }
    out
}

/// Trims what surrounds a stated answer: spaces, `$`, `\(`/`\)`, bold markers, a
/// final period or colon.
fn tidy(s: &str) -> String {
    let mut s = s.trim();
    loop {
        let before = s;
        s = s
            .trim_matches(|c: char| c == '*' || c == '$' || c.is_whitespace())
            .trim_end_matches(['.', ':'])
            .trim_start_matches(':');
        for (open, close) in [("\\(", "\\)"), ("\\[", "\\]")] {
            if let Some(inner) = s.strip_prefix(open).and_then(|r| r.strip_suffix(close)) {
                s = inner;
            }
        }
        if s == before {
            return s.to_string();
        }
    }
}

/// What follows an answer phrase, up to where the answer ends: the math span if it
/// starts with one (`$8$. I hope it is correct.`), else the sentence (a period followed
/// by a space or the end of the line).
fn answer_span(rest: &str) -> &str {
    let line = rest.lines().next().unwrap_or("");
    let trimmed = line.trim_start_matches(|c: char| c.is_whitespace() || c == ':' || c == '*');
    if let Some(math) = trimmed.strip_prefix('$') {
        let math = math.strip_prefix('$').unwrap_or(math);
        if let Some(end) = math.find('$') {
            return &math[..end];
        }
    }
    match line.find(". ") {
        Some(end) => &line[..end],
        None => line,
    }
}

/// The last "answer is …" / "Answer: …" in `text`, up to the end of its sentence.
fn stated(text: &str) -> Option<String> {
    // ASCII lowering keeps every byte where it was, so positions in `lower` are
    // positions in `text`.
    let lower = text.to_ascii_lowercase();
    let mut best: Option<(usize, usize)> = None;
    for pat in ["answer is:", "answer is", "answer:"] {
        if let Some(at) = lower.rfind(pat) {
            let start = at + pat.len();
            if best.is_none_or(|(b, _)| at > b) {
                best = Some((at, start));
            }
        }
    }
    let (_, start) = best?;
    let answer = tidy(answer_span(&text[start..]));
    (!answer.is_empty()).then_some(answer)
}

/// `#### N` (GSM8K's format): the last one.
fn hashes(text: &str) -> Option<String> {
    let at = text.rfind("####")?;
    let line = text[at + 4..].lines().next().unwrap_or("");
    let answer = tidy(line);
    (!answer.is_empty()).then_some(answer)
}

/// A final choice letter: the last `(X)`, `X)` or a lone `X` on the last line.
fn choice(text: &str) -> Option<String> {
    let last = text.trim_end().lines().last()?;
    let chars: Vec<char> = last.chars().collect();
    for i in (0..chars.len()).rev() {
        let c = chars[i];
        if !('A'..='J').contains(&c) {
            continue;
        }
        let before = i.checked_sub(1).map(|k| chars[k]);
        let after = chars.get(i + 1).copied();
        let alone_before = before.is_none_or(|b| !b.is_alphanumeric());
        let alone_after = after.is_none_or(|a| !a.is_alphanumeric());
        if alone_before && alone_after {
            return Some(c.to_string());
        }
    }
    None
}

/// The final answer of `response`. `choices` says the question is multiple choice, so
/// a final letter counts.
pub fn final_answer(response: &str, choices: bool) -> Result<Found, NoAnswer> {
    let boxed = boxes(response);
    if let Some((last, end)) = boxed.last() {
        // Boxes in the response's last paragraph must agree.
        let para_start = response[..*end].rfind("\n\n").unwrap_or(0);
        let mut finals: Vec<String> = boxed
            .iter()
            .filter(|(_, e)| *e >= para_start)
            .map(|(b, _)| b.split_whitespace().collect::<String>())
            .collect();
        finals.dedup();
        finals.sort();
        finals.dedup();
        if finals.len() > 1 {
            return Err(NoAnswer::Hedged(finals));
        }
        return Ok(Found {
            text: last.clone(),
            source: Source::Boxed,
        });
    }
    if let Some(text) = stated(response) {
        return Ok(Found {
            text,
            source: Source::Stated,
        });
    }
    if let Some(text) = hashes(response) {
        return Ok(Found {
            text,
            source: Source::Hashes,
        });
    }
    if choices && let Some(text) = choice(response) {
        return Ok(Found {
            text,
            source: Source::Choice,
        });
    }
    Err(NoAnswer::Missing)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(r: &str) -> String {
        final_answer(r, true).unwrap().text
    }

    #[test]
    fn the_last_box_wins_and_nested_braces_balance() {
        assert_eq!(
            text("So \\boxed{3}.\n\nFinally \\boxed{\\frac{1}{2}}"),
            "\\frac{1}{2}"
        );
        assert_eq!(text("\\fbox{x^{2}+1}"), "x^{2}+1");
        assert_eq!(text("$\\boxed 5$"), "5");
    }

    #[test]
    fn two_different_final_boxes_are_no_answer() {
        let e = final_answer("It is \\boxed{2} or \\boxed{3}.", false).unwrap_err();
        assert!(matches!(e, NoAnswer::Hedged(_)), "{e:?}");
        // The same box twice is one answer; an earlier paragraph's box is working.
        assert_eq!(text("\\boxed{2}, i.e. \\boxed{ 2 }"), "2");
        assert_eq!(text("Try \\boxed{4}?\n\nNo: \\boxed{5}"), "5");
    }

    #[test]
    fn stated_hashes_and_letters() {
        assert_eq!(text("Thus, the final answer is $42$."), "42");
        assert_eq!(text("Answer: 7 apples"), "7 apples");
        assert_eq!(text("...\n#### 1,200"), "1,200");
        assert_eq!(text("I pick (C)"), "C");
        assert_eq!(
            final_answer("no idea", false).unwrap_err(),
            NoAnswer::Missing
        );
    }
}
