//! The release a package says it is: the workspace's version, the package revision, and the
//! changelog, read from CHANGELOG.md (`## VERSION (YYYY-MM-DD)` headings, `- ` changes).

use std::fs;

use anyhow::{bail, ensure, Context, Result};

use crate::cmd;

/// Who the packages name as their maintainer and packager.
pub const MAINTAINER: &str = "health-agent maintainers <maintainers@health-agent.invalid>";

#[derive(Clone, Debug)]
pub struct Release {
    /// The upstream version, `health-agent --version`'s.
    pub version: String,
    /// The packaging revision of that version: Debian's `-1`, rpm's `Release: 1`.
    pub revision: u32,
    /// Newest first; the first is this version's.
    pub entries: Vec<Entry>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    pub version: String,
    pub date: Date,
    /// One paragraph each, unwrapped.
    pub changes: Vec<String>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Date {
    pub year: i64,
    pub month: u32,
    pub day: u32,
}

impl Release {
    /// The workspace's version with CHANGELOG.md's entries; its newest must be that version.
    pub fn current() -> Result<Self> {
        let path = cmd::root().join("CHANGELOG.md");
        let text =
            fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
        let entries = parse(&text).context("CHANGELOG.md")?;
        let version = env!("CARGO_PKG_VERSION");
        ensure!(
            entries.first().map(|e| e.version.as_str()) == Some(version),
            "CHANGELOG.md's newest section is not the workspace's version {version}: add \
             `## {version} (YYYY-MM-DD)` with a `- ` line per change"
        );
        Ok(Self {
            version: version.to_owned(),
            revision: 1,
            entries,
        })
    }

    /// `version-revision`, as both package managers print it.
    pub fn full(&self) -> String {
        format!("{}-{}", self.version, self.revision)
    }

    /// The same files released again one patch version later, a day after: what the upgrade
    /// check installs over this one.
    pub fn next_patch(&self) -> Result<Self> {
        let mut parts: Vec<u64> = self
            .version
            .split('.')
            .map(str::parse)
            .collect::<Result<_, _>>()
            .with_context(|| format!("version {} is not MAJOR.MINOR.PATCH", self.version))?;
        let patch = parts.last_mut().context("empty version")?;
        *patch += 1;
        let version = parts
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(".");
        let mut entries = self.entries.clone();
        let date = Date::from_days(entries[0].date.days() + 1);
        entries.insert(
            0,
            Entry {
                version: version.clone(),
                date,
                changes: vec!["The same files, released again to check upgrades.".into()],
            },
        );
        Ok(Self {
            version,
            revision: 1,
            entries,
        })
    }

    /// The newest entry's date at midnight UTC, in Unix seconds: the files' times inside the
    /// archives, so a rebuild of the same release packs the same bytes.
    pub fn epoch(&self) -> i64 {
        self.entries[0].date.days() * 86_400
    }
}

fn parse(text: &str) -> Result<Vec<Entry>> {
    let mut entries: Vec<Entry> = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let at = || format!("line {}: {line:?}", n + 1);
        if let Some(heading) = line.strip_prefix("## ") {
            let (version, date) = heading
                .split_once(" (")
                .and_then(|(v, d)| Some((v.trim(), d.strip_suffix(')')?)))
                .with_context(|| format!("{}: want `## VERSION (YYYY-MM-DD)`", at()))?;
            entries.push(Entry {
                version: version.to_owned(),
                date: Date::parse(date).with_context(at)?,
                changes: Vec::new(),
            });
        } else if let Some(entry) = entries.last_mut() {
            if let Some(change) = line.strip_prefix("- ") {
                entry.changes.push(change.trim().to_owned());
            } else if line.starts_with(' ') && !line.trim().is_empty() {
                let last = entry
                    .changes
                    .last_mut()
                    .with_context(|| format!("{}: a continuation before any change", at()))?;
                last.push(' ');
                last.push_str(line.trim());
            } else if !line.trim().is_empty() {
                bail!("{}: want a `- ` change or its indented continuation", at());
            }
        }
    }
    if let Some(empty) = entries.iter().find(|e| e.changes.is_empty()) {
        bail!("the section of {} lists no change", empty.version);
    }
    ensure!(!entries.is_empty(), "no `## VERSION (YYYY-MM-DD)` section");
    Ok(entries)
}

const MONTHS: [&str; 12] = [
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
];
const WEEKDAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];

impl Date {
    fn parse(text: &str) -> Result<Self> {
        let mut it = text.split('-').map(str::parse::<u32>);
        let (Some(Ok(year)), Some(Ok(month)), Some(Ok(day)), None) =
            (it.next(), it.next(), it.next(), it.next())
        else {
            bail!("{text:?} is not YYYY-MM-DD");
        };
        let date = Self {
            year: i64::from(year),
            month,
            day,
        };
        ensure!(
            (1..=12).contains(&month) && day >= 1 && Self::from_days(date.days()) == date,
            "{text:?} is not a date"
        );
        Ok(date)
    }

    /// Days since 1970-01-01 (Howard Hinnant's days_from_civil).
    pub fn days(self) -> i64 {
        let (m, d) = (i64::from(self.month), i64::from(self.day));
        let y = if m <= 2 { self.year - 1 } else { self.year };
        let era = y.div_euclid(400);
        let yoe = y - era * 400;
        let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d - 1;
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
        era * 146_097 + doe - 719_468
    }

    /// The inverse of [`Date::days`] (civil_from_days).
    fn from_days(days: i64) -> Self {
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z - era * 146_097;
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
        let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
        let year = yoe + era * 400 + i64::from(month <= 2);
        Self { year, month, day }
    }

    fn weekday(self) -> &'static str {
        WEEKDAYS[self.days().rem_euclid(7) as usize]
    }

    fn month_name(self) -> &'static str {
        MONTHS[self.month as usize - 1]
    }

    /// RFC 2822 at midnight UTC, as a Debian changelog's trailer wants it.
    pub fn rfc2822(self) -> String {
        format!(
            "{}, {:02} {} {} 00:00:00 +0000",
            self.weekday(),
            self.day,
            self.month_name(),
            self.year
        )
    }

    /// `Fri Dec 04 2026`, as an rpm %changelog entry starts.
    pub fn rpm(self) -> String {
        format!(
            "{} {} {:02} {}",
            self.weekday(),
            self.month_name(),
            self.day,
            self.year
        )
    }
}

/// Unix seconds as RFC 3339 in UTC (`2026-12-04T10:20:30Z`), as an OCI image config's
/// `created` wants them.
pub fn rfc3339(unix: i64) -> String {
    let date = Date::from_days(unix.div_euclid(86_400));
    let secs = unix.rem_euclid(86_400);
    format!(
        "{}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
        date.year,
        date.month,
        date.day,
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

/// `text` wrapped at `width` columns: the first line after `first`, the rest after `rest`.
pub fn wrap(text: &str, width: usize, first: &str, rest: &str) -> String {
    let mut out = String::from(first);
    let mut col = first.len();
    let mut line_start = true;
    for word in text.split_whitespace() {
        if !line_start && col + 1 + word.len() > width {
            out.push('\n');
            out.push_str(rest);
            col = rest.len();
            line_start = true;
        }
        if !line_start {
            out.push(' ');
            col += 1;
        }
        out.push_str(word);
        col += word.len();
        line_start = false;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_are_named_as_the_calendar_names_them() {
        let date = Date::parse("2026-12-04").unwrap();
        assert_eq!(date.rfc2822(), "Fri, 04 Dec 2026 00:00:00 +0000");
        assert_eq!(date.rpm(), "Fri Dec 04 2026");
        assert_eq!(Date::parse("1970-01-01").unwrap().days(), 0);
        assert_eq!(Date::parse("2024-02-29").unwrap().rpm(), "Thu Feb 29 2024");
        assert_eq!(Date::from_days(date.days() + 28).rpm(), "Fri Jan 01 2027");
        assert!(Date::parse("2026-02-30").is_err());
        assert!(Date::parse("2026-13-01").is_err());
        assert!(Date::parse("04.12.2026").is_err());
    }

    #[test]
    fn times_are_written_as_rfc_3339() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_796_386_230), "2026-12-04T12:10:30Z");
    }

    #[test]
    fn the_changelog_is_read_section_by_section_with_wrapped_changes() {
        let text = "# Changelog\n\nIntro text.\n\n## 0.2.0 (2027-01-02)\n\n- One\n  continued.\n- Two.\n\n## 0.1.0 (2026-12-04)\n\n- First.\n";
        let entries = parse(text).unwrap();
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[0].version, "0.2.0");
        assert_eq!(entries[0].changes, ["One continued.", "Two."]);
        assert_eq!(entries[1].date, Date::parse("2026-12-04").unwrap());
    }

    #[test]
    fn a_malformed_changelog_says_which_line() {
        let err = parse("## 0.1.0 2026-12-04\n- x\n").unwrap_err();
        assert!(format!("{err:#}").contains("line 1"), "{err:#}");
        let err = parse("## 0.1.0 (2026-12-04)\nstray text\n").unwrap_err();
        assert!(format!("{err:#}").contains("line 2"), "{err:#}");
        assert!(parse("## 0.1.0 (2026-12-04)\n").is_err());
        assert!(parse("no sections\n").is_err());
    }

    #[test]
    fn the_repository_changelog_names_this_version() {
        let release = Release::current().unwrap();
        assert_eq!(release.version, env!("CARGO_PKG_VERSION"));
        let next = release.next_patch().unwrap();
        assert_ne!(next.version, release.version);
        assert_eq!(next.entries.len(), release.entries.len() + 1);
        assert_eq!(
            next.entries[0].date.days(),
            release.entries[0].date.days() + 1
        );
    }

    #[test]
    fn long_changes_wrap_under_their_indent() {
        let text = "aaaa bbbb cccc dddd";
        assert_eq!(
            wrap(text, 12, "  * ", "    "),
            "  * aaaa\n    bbbb\n    cccc\n    dddd"
        );
        assert_eq!(wrap(text, 80, "- ", "  "), "- aaaa bbbb cccc dddd");
    }
}
