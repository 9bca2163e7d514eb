//! Text in an incident's Markdown (a GitHub issue or comment), made inert. Much of what an
//! incident shows comes from outside the agent: peer addresses, host and container names,
//! process names and command lines, a database server's error text, all of which may hold a
//! backtick, a link, HTML, a line break that starts a heading, or an escape sequence. Each
//! lands through one of these, on one line, showing as written.

use crate::text::clean;

/// Prose on one line (a table cell, a list item): control characters and line breaks out,
/// and a backslash before every character Markdown acts on (code, emphasis, links, images,
/// HTML, headings, tables, entities), so what the text says shows as written.
pub fn cell(s: &str) -> String {
    let s = clean(s);
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if matches!(
            c,
            '\\' | '`' | '*' | '_' | '[' | ']' | '<' | '>' | '|' | '~' | '#' | '&' | '!'
        ) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Text from outside as inline code, so it cannot @-mention, link or format anything: on one
/// line, its backticks made `'` (a backtick would end the code span), and `|` escaped, which a
/// table cell needs even inside code.
pub fn code(s: &str) -> String {
    format!("`{}`", clean(s).replace('`', "'").replace('|', "\\|"))
}

/// `content` as a fenced code block of `lang`: the fence longer than any run of backticks in
/// it, since a line of three in the content would otherwise close the block and let the rest
/// be Markdown.
pub fn fenced(lang: &str, content: &str) -> String {
    let longest = content.split(|c| c != '`').map(str::len).max().unwrap_or(0);
    let fence = "`".repeat(longest.max(2) + 1);
    format!("{fence}{lang}\n{content}\n{fence}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hostile_peer_name_is_inert_inline_code_on_one_line() {
        let peer = "x`](http://evil)\n# hi";
        let c = code(peer);
        assert_eq!(c, "`x'](http://evil) # hi`");
        assert_eq!(c.matches('`').count(), 2, "one code span: {c}");
        assert!(!c.contains('\n'));
        assert_eq!(code("\x1b[2Jweb|1"), "`[2Jweb\\|1`");
    }

    #[test]
    fn prose_shows_as_written_on_one_line() {
        assert_eq!(
            cell("db said: **boom** [x](http://e) <img src=x>\n# hi | `rm`"),
            "db said: \\*\\*boom\\*\\* \\[x\\](http://e) \\<img src=x\\> \\# hi \\| \\`rm\\`"
        );
        assert_eq!(
            cell("1/1 peers (10.0.0.3:8080) fine"),
            "1/1 peers (10.0.0.3:8080) fine"
        );
        assert_eq!(cell("a\\b &amp; !x"), "a\\\\b \\&amp; \\!x");
    }

    #[test]
    fn a_fence_outlasts_the_backticks_inside() {
        assert_eq!(fenced("json", "{}"), "```json\n{}\n```");
        let f = fenced("json", "{\"name\": \"````\\n# owned\"}");
        assert!(
            f.starts_with("`````json\n") && f.ends_with("\n`````"),
            "{f}"
        );
    }
}
