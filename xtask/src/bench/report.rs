//! docs/BENCHMARKS.md as the bench writes it: one path for every write, whole report or one
//! section, that keeps the notes people add by hand.
//!
//! A note is a block between `<!-- notes -->` and `<!-- /notes -->` lines. It belongs to the
//! heading above it (`## N. …` or `### …`). When the bench writes a section (or the whole
//! report), each note of what it replaces goes back at the end of the same heading's new text;
//! a note whose heading the new text no longer has goes to the end of its `## N.` section, and
//! failing that to the end of what was written. Nothing else of the old text survives: the
//! generated part is the bench's.

/// Opens a hand-written block the bench keeps.
pub const NOTES_OPEN: &str = "<!-- notes -->";
/// Closes it.
pub const NOTES_CLOSE: &str = "<!-- /notes -->";

/// `generated` written into `report`: a whole report (it starts with `# `) replaces it all; one
/// section (starting with its `## N.` or `### ` heading) replaces the part of `report` under the
/// same heading, or is added at the end. Either way the notes of what is replaced are kept.
pub fn splice(report: &str, generated: &str) -> String {
    let generated = generated.trim();
    if generated.starts_with("# ") {
        return tidy(&with_notes(generated, &notes(report)));
    }
    let Some(first) = generated.lines().next().and_then(heading) else {
        return tidy(&format!("{}\n\n{generated}", report.trim_end()));
    };
    let parts = parts(report);
    let Some(old) = parts.iter().find(|p| p.key == first.key) else {
        return tidy(&format!("{}\n\n{generated}", report.trim_end()));
    };
    let kept = notes(&report[old.start..old.end]);
    tidy(&format!(
        "{}{}\n\n{}",
        &report[..old.start],
        with_notes(generated, &kept).trim(),
        &report[old.end..]
    ))
}

/// A heading line's level (2 or 3) and key: `## 9.` for a numbered section (its words may
/// change from run to run), else the whole line.
#[derive(Clone, Debug, PartialEq)]
struct Heading {
    level: usize,
    key: String,
}

fn heading(line: &str) -> Option<Heading> {
    let level = if line.starts_with("### ") {
        3
    } else if line.starts_with("## ") {
        2
    } else {
        return None;
    };
    let rest = &line[level + 1..];
    let number = rest.split_once(". ").map(|(n, _)| n);
    let key = match number {
        Some(n) if !n.is_empty() && n.chars().all(|c| c.is_ascii_alphanumeric()) => {
            format!("{} {n}.", &line[..level])
        }
        _ => line.trim_end().to_string(),
    };
    Some(Heading { level, key })
}

/// One heading's text: from its line to the next heading of its level or above (`end`); its
/// own text, before any subsection, ends at the next heading of any level (`own_end`).
struct Part {
    key: String,
    start: usize,
    own_end: usize,
    end: usize,
}

/// Every heading of `text` with its extent, in order.
fn parts(text: &str) -> Vec<Part> {
    let mut heads: Vec<(usize, Heading)> = Vec::new();
    let mut at = 0;
    for line in text.split_inclusive('\n') {
        if let Some(h) = heading(line) {
            heads.push((at, h));
        }
        at += line.len();
    }
    heads
        .iter()
        .enumerate()
        .map(|(i, (start, h))| {
            let end = heads[i + 1..]
                .iter()
                .find(|(_, next)| next.level <= h.level)
                .map_or(text.len(), |(s, _)| *s);
            Part {
                key: h.key.clone(),
                start: *start,
                own_end: heads.get(i + 1).map_or(text.len(), |(s, _)| *s),
                end,
            }
        })
        .collect()
}

/// A note and where it was: the key of the heading right above it, and of its `## ` section.
#[derive(Debug, PartialEq)]
struct Note {
    under: Option<String>,
    section: Option<String>,
    text: String,
}

fn notes(text: &str) -> Vec<Note> {
    let mut out = Vec::new();
    let (mut under, mut section) = (None, None);
    let mut open: Option<String> = None;
    for line in text.lines() {
        if let Some(block) = open.as_mut() {
            block.push_str(line);
            block.push('\n');
            if line.trim() == NOTES_CLOSE {
                out.push(Note {
                    under: under.clone(),
                    section: section.clone(),
                    text: open.take().unwrap_or_default(),
                });
            }
            continue;
        }
        if line.trim() == NOTES_OPEN {
            open = Some(format!("{line}\n"));
        } else if let Some(h) = heading(line) {
            if h.level == 2 {
                section = Some(h.key.clone());
            }
            under = Some(h.key);
        }
    }
    if let Some(unclosed) = open {
        // A note someone forgot to close is still theirs: keep it, closed.
        out.push(Note {
            under,
            section,
            text: format!("{unclosed}{NOTES_CLOSE}\n"),
        });
    }
    out
}

/// `text` with each note put back at the end of its heading's part (see the module doc).
fn with_notes(text: &str, notes: &[Note]) -> String {
    let mut text = text.trim_end().to_string() + "\n";
    for note in notes {
        let parts = parts(&text);
        let find = |key: &Option<String>| {
            key.as_ref()
                .and_then(|k| parts.iter().find(|p| &p.key == k))
        };
        // A note above the first heading stays above it (the report's preamble).
        let preamble = parts.first().map_or(text.len(), |p| p.start);
        let at = match &note.under {
            None => preamble,
            Some(_) => find(&note.under)
                .map(|p| p.own_end)
                .or_else(|| find(&note.section).map(|p| p.end))
                .unwrap_or(text.len()),
        };
        let (before, after) = text.split_at(at);
        text = format!("{}\n\n{}\n\n{}", before.trim_end(), note.text.trim(), after);
    }
    text
}

/// One blank line between blocks, a newline at the end.
fn tidy(text: &str) -> String {
    let mut out = String::new();
    let mut blank = 0;
    for line in text.trim().lines() {
        if line.trim().is_empty() {
            blank += 1;
            continue;
        }
        if blank > 0 && !out.is_empty() {
            out.push('\n');
        }
        blank = 0;
        out.push_str(line);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const REPORT: &str = "# Benchmarks\n\nrun on a box\n\n\
        ## 8. Flood\n\nold flood\n\n\
        ## 9. Scaling\n\nold table\n\n<!-- notes -->\nAdded by hand: the outage run.\n<!-- /notes -->\n\n\
        ### I/O-bound — capacity 77.3\n\nold rows\n\n<!-- notes -->\nThe I/O note.\n<!-- /notes -->\n\n\
        ## 10. CloudWatch\n\nold cw\n";

    #[test]
    fn one_section_keeps_its_notes_and_leaves_the_others_alone() {
        let out = splice(
            REPORT,
            "\n## 9. Scaling, renamed\n\nnew table\n\n### I/O-bound — capacity 80.1\n\nnew rows\n",
        );
        assert_eq!(
            out,
            "# Benchmarks\n\nrun on a box\n\n## 8. Flood\n\nold flood\n\n\
             ## 9. Scaling, renamed\n\nnew table\n\n<!-- notes -->\nAdded by hand: the outage run.\n<!-- /notes -->\n\n\
             ### I/O-bound — capacity 80.1\n\nnew rows\n\n<!-- notes -->\nThe I/O note.\n<!-- /notes -->\n\n\
             ## 10. CloudWatch\n\nold cw\n"
        );
    }

    #[test]
    fn a_whole_report_keeps_every_note() {
        let out = splice(
            REPORT,
            "# Benchmarks\n\nrun again\n\n## 8. Flood\n\nnew flood\n\n## 9. Scaling\n\nnew table\n\n\
             ### I/O-bound — capacity 79\n\nnew rows\n\n## 10. CloudWatch\n\nnew cw\n",
        );
        assert!(!out.contains("old"), "{out}");
        assert_eq!(out.matches(NOTES_OPEN).count(), 2, "{out}");
        let outage = out.find("the outage run").unwrap();
        let io = out.find("The I/O note").unwrap();
        assert!(out.find("new table").unwrap() < outage && outage < out.find("### I/O").unwrap());
        assert!(out.find("new rows").unwrap() < io && io < out.find("## 10.").unwrap());
    }

    #[test]
    fn a_note_whose_heading_is_gone_goes_to_its_section() {
        let out = splice(REPORT, "## 9. Scaling\n\nnew table, no subsection\n");
        assert!(
            out.contains("new table, no subsection\n\n<!-- notes -->\nAdded by hand: the outage run.\n<!-- /notes -->\n\n<!-- notes -->\nThe I/O note.\n<!-- /notes -->\n\n## 10."),
            "{out}"
        );
    }

    #[test]
    fn a_subsection_alone_replaces_only_itself() {
        let report = "# B\n\n## 3. Throughput\n\nthe table\n\n### Cost per socket call\n\nold\n\n\
                      <!-- notes -->\nmine\n<!-- /notes -->\n\n## 4. Saturation\n\ns\n";
        let out = splice(report, "\n### Cost per socket call\n\nnew\n");
        assert_eq!(
            out,
            "# B\n\n## 3. Throughput\n\nthe table\n\n### Cost per socket call\n\nnew\n\n\
             <!-- notes -->\nmine\n<!-- /notes -->\n\n## 4. Saturation\n\ns\n"
        );
    }

    #[test]
    fn a_note_above_the_first_section_stays_there() {
        let report = "# B\n\nold header\n\n<!-- notes -->\nRead this first.\n<!-- /notes -->\n\n## 1. A\n\na\n";
        assert_eq!(
            splice(report, "# B\n\nnew header\n\n## 1. A\n\nb\n"),
            "# B\n\nnew header\n\n<!-- notes -->\nRead this first.\n<!-- /notes -->\n\n## 1. A\n\nb\n"
        );
    }

    /// docs/BENCHMARKS.md itself: a section run alone changes that section only, and every
    /// note in the file survives it and a whole run.
    #[test]
    fn the_real_report_keeps_its_notes() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/BENCHMARKS.md");
        let real = std::fs::read_to_string(path).expect("docs/BENCHMARKS.md");
        assert_eq!(
            tidy(&real),
            real,
            "docs/BENCHMARKS.md is as the bench writes it"
        );
        let before = notes(&real);
        assert!(before.len() >= 4, "{before:?}");
        let out = splice(&real, "\n## 12. Rerun\n\nnew figures\n");
        let twelve = real.find("\n## 12. ").expect("a section 12");
        assert_eq!(out[..twelve], real[..twelve]);
        assert!(out.contains("new figures"));
        assert_eq!(notes(&out).len(), before.len());
        let whole: String = parts(&real)
            .iter()
            .filter(|p| p.key.starts_with("## "))
            .map(|p| {
                format!(
                    "{}\n\nrerun\n\n",
                    real[p.start..].lines().next().unwrap_or("")
                )
            })
            .collect();
        let out = splice(&real, &format!("# Benchmarks\n\nagain\n\n{whole}"));
        let texts = |n: &[Note]| n.iter().map(|n| n.text.clone()).collect::<Vec<_>>();
        assert_eq!(texts(&notes(&out)), texts(&before));
    }

    #[test]
    fn a_new_section_or_file_is_added_at_the_end() {
        assert_eq!(
            splice("# B\n\n## 8. Flood\n\nx\n", "\n## 9. Publishing\n\nnew\n"),
            "# B\n\n## 8. Flood\n\nx\n\n## 9. Publishing\n\nnew\n"
        );
        assert_eq!(
            splice("", "\n## 9. Publishing\n\nnew\n"),
            "## 9. Publishing\n\nnew\n"
        );
    }
}
