//! `cargo xtask soak --minutes N`: the soak test binary (tests/tests/soak.rs) run for N minutes
//! instead of CI's 3, then the kill -9 runs (tests/tests/soak_kill.rs), their tables written to
//! `<target>/soak-report.md` and, with `--benchmarks`, into docs/BENCHMARKS.md as a section of
//! its own. Needs root, like the integration tests it is made of.

use std::{fs, path::Path};

use anyhow::{Context, Result};

use crate::{bench::report, cmd};

/// The section's title in docs/BENCHMARKS.md, found again by it on the next run.
const TITLE: &str = "A soak under churn and faults";

#[derive(clap::Args)]
pub struct Args {
    /// How long the churn runs, after which the verdict is taken (the first cycle of faults is
    /// the warm-up).
    #[arg(long, default_value_t = 3.0)]
    minutes: f64,
    /// Also write the tables into docs/BENCHMARKS.md (pass or fail, saying which).
    #[arg(long)]
    benchmarks: bool,
    /// Run nothing: write the tables of the last run (`<target>/soak-report.md`) into
    /// docs/BENCHMARKS.md, as a run with `--minutes` and `--benchmarks` would have.
    #[arg(long, requires = "benchmarks")]
    report_only: bool,
}

pub fn run(args: &Args) -> Result<()> {
    let report = cmd::target_dir().join("soak-report.md");
    if args.report_only {
        return publish(&report, args.minutes, "passed");
    }
    anyhow::ensure!(
        cmd::is_root(),
        "the soak needs root (it loads eBPF programs, mounts tmpfs, runs PostgreSQL)"
    );
    anyhow::ensure!(args.minutes > 0.0, "--minutes must be above 0");
    // The test binaries run the agent and the fixture backend: build them first.
    cmd::run(
        cmd::cargo()
            .current_dir(cmd::root())
            .args(["build", "--bins"]),
    )
    .context("building the binaries the soak runs")?;
    let _ = fs::remove_file(&report);
    let mut test = cmd::cargo();
    test.current_dir(cmd::root())
        .args(["test", "-p", "health-agent-tests"])
        .args(["--test", "soak", "--test", "soak_kill", "--"])
        .args(["--nocapture", "--test-threads=1"])
        .env("HEALTH_AGENT_SOAK_MINUTES", args.minutes.to_string())
        .env("HEALTH_AGENT_SOAK_REPORT", &report);
    let result = cmd::run(&mut test);
    if args.benchmarks {
        let outcome = if result.is_ok() { "passed" } else { "FAILED" };
        publish(&report, args.minutes, outcome)?;
    }
    result.context("the soak failed: its table and the reasons are above")?;
    println!("soak: the tables are in {}", report.display());
    Ok(())
}

/// The report as a section of docs/BENCHMARKS.md, numbered after the bench's own (or in the
/// place it had). All of it is a note: `cargo xtask bench` rewrites everything but notes, and
/// does not run the soak.
fn publish(report: &Path, minutes: f64, outcome: &str) -> Result<()> {
    let tables = fs::read_to_string(report)
        .with_context(|| format!("no soak report at {}: run the soak first", report.display()))?;
    let path = cmd::root().join("docs/BENCHMARKS.md");
    let before = fs::read_to_string(&path).context("reading docs/BENCHMARKS.md")?;
    let number = section_number(&before);
    let section = format!(
        "## {number}. {TITLE}: nothing grows, nothing wrong, nothing lost\n\n\
         {open}\n\
         Written by `cargo xtask soak --minutes {minutes} --benchmarks` (debug build, niced, on \
         the same 2-core machine as other work), not by `cargo xtask bench`, which keeps it as \
         a note. The run {outcome}. One agent (A) under churn: its backend restarted, hung, \
         made to answer 5xx and slow; the database stopped and its password changed; a peer \
         agent killed, killed mid-drain, and restarted as systemd does (SIGTERM); a container \
         it expects killed on the host's Docker daemon; its disk filled past warn and fail; \
         its state directory read-only; its alert receivers failing and stalling — then the same cycle \
         again until the time is up (tests/tests/soak.rs). The first cycle is the warm-up. \
         Then kill -9 of an agent at random moments (tests/tests/soak_kill.rs).\n\n\
         {tables}\n{close}\n",
        open = report::NOTES_OPEN,
        close = report::NOTES_CLOSE,
        tables = tables.trim()
    );
    // The splice keeps a section's notes, and all of this one is notes: its last run goes
    // first, or every run would pile up under the heading.
    let before = without_section(&before, number);
    fs::write(&path, report::splice(&before, &section)).context("writing docs/BENCHMARKS.md")?;
    println!("soak: section {number} of {}", path.display());
    Ok(())
}

/// `## 12. Title` as (12, "Title").
fn numbered(line: &str) -> Option<(u32, &str)> {
    let (n, title) = line.strip_prefix("## ")?.split_once(". ")?;
    Some((n.parse().ok()?, title))
}

/// The number of the soak's section if the file has one, else one past the highest.
fn section_number(text: &str) -> u32 {
    let mut highest = 0;
    for (n, title) in text.lines().filter_map(numbered) {
        if title.starts_with(TITLE) {
            return n;
        }
        highest = highest.max(n);
    }
    highest + 1
}

/// `text` with section `number`'s body cut (its heading stays, for the splice to find its
/// place): up to the next `## ` heading, or the end.
fn without_section(text: &str, number: u32) -> String {
    let mut out = String::new();
    let mut inside = false;
    for line in text.split_inclusive('\n') {
        if let Some((n, _)) = numbered(line.trim_end()) {
            if inside && n != number {
                inside = false;
            }
            if n == number {
                inside = true;
                out.push_str(line);
                out.push('\n');
                continue;
            }
        } else if inside && line.starts_with("## ") {
            inside = false;
        }
        if !inside {
            out.push_str(line);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_run_replaces_the_last_one() {
        let text = format!(
            "## 12. L\n\nl\n\n## 13. {TITLE}: x\n\n<!-- notes -->\nold run\n<!-- /notes -->\n\n\
             ## 14. M\n\nm\n"
        );
        let cut = without_section(&text, 13);
        assert!(!cut.contains("old run"), "{cut}");
        assert!(
            cut.contains("## 12. L\n\nl\n") && cut.contains("## 14. M\n\nm\n"),
            "{cut}"
        );
        assert!(cut.contains(&format!("## 13. {TITLE}: x\n")), "{cut}");
        let last =
            format!("## 12. L\n\n## 13. {TITLE}: x\n\n<!-- notes -->\nold\n<!-- /notes -->\n");
        assert!(!without_section(&last, 13).contains("old"));
    }

    #[test]
    fn the_section_keeps_its_number_or_comes_last() {
        assert_eq!(section_number("# B\n\n## 1. A\n\n## 12. L\n"), 13);
        assert_eq!(
            section_number(&format!("## 1. A\n\n## 13. {TITLE}: x\n\n## 14. M\n")),
            13
        );
    }
}
