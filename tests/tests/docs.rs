//! The README and the manual in docs/, checked as a reader meets them: the README fits a screen
//! of scrolling and links every page; every link and anchor leads somewhere; every TOML example
//! is a config the agent accepts; the install section's drop-in sets what it says, and secrets
//! go where the shipped unit reads them. The walk-through the README runs is in `first_day.rs`.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use health_agent_tests::{agent_binary, markdown::fenced, workspace};

fn read(rel: &str) -> String {
    std::fs::read_to_string(workspace().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// The manual's pages, as paths relative to the repository root ("docs/verdicts.md").
fn pages() -> Vec<String> {
    let mut pages: Vec<String> = std::fs::read_dir(workspace().join("docs"))
        .expect("docs/")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".md"))
        .map(|name| format!("docs/{name}"))
        .collect();
    pages.sort();
    pages
}

/// Lines outside fenced code blocks.
fn prose(text: &str) -> Vec<&str> {
    let mut fenced = false;
    text.lines()
        .filter(|line| {
            if line.trim_start().starts_with("```") {
                fenced = !fenced;
                return false;
            }
            !fenced
        })
        .collect()
}

/// The targets of the markdown links `[text](target)` in the prose of `text`.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in prose(text) {
        let mut rest = line;
        while let Some(i) = rest.find("](") {
            rest = &rest[i + 2..];
            if let Some(end) = rest.find(')') {
                out.push(rest[..end].to_string());
                rest = &rest[end..];
            }
        }
    }
    out
}

/// GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

fn anchors(text: &str) -> Vec<String> {
    prose(text)
        .into_iter()
        .filter_map(|l| l.strip_prefix('#'))
        .map(|l| slug(l.trim_start_matches('#')))
        .collect()
}

#[test]
fn the_readme_fits_a_screen_of_scrolling_and_links_every_page() {
    let readme = read("README.md");
    let lines = readme.lines().count();
    assert!(lines <= 300, "README.md has {lines} lines, at most 300");
    let pages = pages();
    assert!(pages.len() >= 6, "docs/ has only {pages:?}");
    let linked = links(&readme);
    for page in &pages {
        assert!(
            linked
                .iter()
                .any(|l| l.split('#').next() == Some(page.as_str())),
            "README.md does not link {page}"
        );
    }
}

#[test]
fn every_link_of_the_manual_leads_somewhere() {
    let mut files = vec!["README.md".to_string()];
    files.extend(pages());
    for file in &files {
        let dir = Path::new(file).parent().unwrap_or(Path::new(""));
        let text = read(file);
        for link in links(&text) {
            if link.starts_with("http://") || link.starts_with("https://") {
                continue;
            }
            let (path, anchor) = link.split_once('#').unwrap_or((&link, ""));
            let target = if path.is_empty() {
                PathBuf::from(file)
            } else {
                dir.join(path)
            };
            let full = workspace().join(&target);
            assert!(
                full.exists(),
                "{file}: link {link:?}: no {}",
                full.display()
            );
            if !anchor.is_empty() {
                let target_text = std::fs::read_to_string(&full).unwrap_or_default();
                assert!(
                    anchors(&target_text).iter().any(|a| a == anchor),
                    "{file}: link {link:?}: {} has no heading #{anchor}",
                    target.display()
                );
            }
        }
    }
}

/// `health-agent ARGS`, its exit code and what it printed.
fn agent(args: &[&str]) -> (i32, String) {
    let out = Command::new(agent_binary())
        .args(args)
        .output()
        .expect("running health-agent");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

#[test]
fn every_toml_example_is_a_config_the_agent_accepts() {
    let mut files = vec!["README.md".to_string()];
    files.extend(pages());
    let dir = tempfile::tempdir().unwrap();
    let mut checked = 0;
    for file in &files {
        for (i, block) in fenced(&read(file), "toml").iter().enumerate() {
            let path = dir.path().join(format!("example-{checked}.toml"));
            std::fs::write(&path, block).unwrap();
            let (code, out) = agent(&["config", "--validate", &path.to_string_lossy()]);
            assert_eq!(code, 0, "{file}, TOML example {}:\n{block}\n{out}", i + 1);
            checked += 1;
        }
    }
    assert!(checked >= 3, "only {checked} TOML examples found");
}

/// The README's install section: the drop-in it shows, at the path it names, sets `web.port`
/// in the configuration the agent runs with.
#[test]
fn the_install_drop_in_sets_the_web_port() {
    let readme = read("README.md");
    let start = readme
        .find("\n## Install")
        .expect("README.md has ## Install");
    let install = &readme[start..];
    let install = &install[..install[1..].find("\n## ").map_or(install.len(), |i| i + 1)];
    assert!(
        install.contains("`/etc/health-agent/conf.d/10-web.toml`"),
        "the install section names the drop-in's path"
    );
    let drop_in = fenced(install, "toml")
        .into_iter()
        .find(|b| b.contains("port ="))
        .expect("a ```toml block setting port");
    let port: u16 = drop_in
        .lines()
        .find_map(|l| l.trim().strip_prefix("port = "))
        .and_then(|p| p.trim().parse().ok())
        .expect("port = N");
    let dir = tempfile::tempdir().unwrap();
    let main = dir.path().join("health-agent.toml");
    std::fs::write(&main, "").unwrap();
    std::fs::create_dir(dir.path().join("conf.d")).unwrap();
    std::fs::write(dir.path().join("conf.d/10-web.toml"), &drop_in).unwrap();
    let main = main.to_string_lossy();
    let (code, out) = agent(&["config", "--validate", &main]);
    assert_eq!(code, 0, "{out}");
    let (code, out) = agent(&["--config", &main, "config", "--effective"]);
    assert_eq!(code, 0, "{out}");
    let web = out
        .split("\n[web]\n")
        .nth(1)
        .unwrap_or_else(|| panic!("no [web] in config --effective:\n{out}"));
    let web = web.split("\n[").next().unwrap_or(web);
    assert!(
        web.lines().any(|l| l.trim() == format!("port = {port}")),
        "the drop-in's port is not in effect:\n{out}"
    );
}

/// Secrets: the README's environment file is the one the shipped unit reads.
#[test]
fn secrets_go_where_the_unit_reads_them() {
    let readme = read("README.md");
    let unit = read("deploy/systemd/health-agent.service");
    let file = unit
        .lines()
        .find_map(|l| l.strip_prefix("EnvironmentFile="))
        .expect("the unit has an EnvironmentFile=");
    let file = file.trim_start_matches('-');
    assert!(
        readme.contains(&format!("`{file}`")),
        "README.md does not name the unit's environment file {file}"
    );
    assert!(readme.contains("PGPASSWORD"), "README.md names PGPASSWORD");
}

/// Every section `cargo xtask bench --only SECTION` runs alone (the variants of its `Section`)
/// is in the manual's table.
#[test]
fn the_manual_lists_every_bench_flag() {
    let bench = read("xtask/src/bench/mod.rs");
    let page = read("docs/architecture.md");
    let at = bench
        .find("enum Section {")
        .expect("bench/mod.rs has enum Section");
    let body = &bench[at..at + bench[at..].find("\n}").expect("the enum ends")];
    let flags: Vec<String> = body
        .lines()
        .map(str::trim)
        .filter_map(|l| l.strip_suffix(','))
        .filter(|l| !l.is_empty() && l.chars().all(char::is_alphanumeric))
        .map(|variant| {
            let mut kebab = String::new();
            for (i, c) in variant.chars().enumerate() {
                if c.is_uppercase() && i > 0 {
                    kebab.push('-');
                }
                kebab.push(c.to_ascii_lowercase());
            }
            format!("`--only {kebab}`")
        })
        .collect();
    assert!(flags.len() >= 7, "{flags:?}");
    for flag in &flags {
        assert!(
            page.contains(flag.as_str()),
            "docs/architecture.md lacks {flag}"
        );
    }
}
