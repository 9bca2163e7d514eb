//! Reading the README and docs/ pages the way the tests that check them need: fenced blocks
//! by language. One reader, so every test sees the same blocks.

/// The body of every fenced block of `lang` in `text` ("" for a block without a language).
pub fn fenced(text: &str, lang: &str) -> Vec<String> {
    let mut out = Vec::new();
    // (the block's language, its body) while inside one.
    let mut cur: Option<(String, String)> = None;
    for line in text.lines() {
        let fence = line.trim_start().strip_prefix("```");
        match (&mut cur, fence) {
            (None, Some(l)) => cur = Some((l.trim().to_string(), String::new())),
            (Some(_), Some(_)) => {
                if let Some((l, body)) = cur.take() {
                    if l == lang {
                        out.push(body);
                    }
                }
            }
            (Some((_, body)), None) => {
                body.push_str(line);
                body.push('\n');
            }
            (None, None) => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::fenced;

    #[test]
    fn blocks_by_language_and_none() {
        let text = "a\n```toml\nx = 1\n```\n```\n{}\n```\n  ```sh\necho hi\n  ```\n";
        assert_eq!(fenced(text, "toml"), ["x = 1\n"]);
        assert_eq!(fenced(text, ""), ["{}\n"]);
        assert_eq!(fenced(text, "sh"), ["echo hi\n"]);
    }
}
