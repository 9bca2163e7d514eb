//! The section's tables: the summary against the targets, and per program.

use super::*;
use crate::bench::stats::{interval95, mean, median};

/// Socket calls per request of `load` (index `li`), from the counted runs in which the
/// per-call programs were attached, of any variant: for runs where they were not.
pub(super) fn calls_per_request(cells: &[Cell]) -> Option<f64> {
    let (calls, requests) = cells
        .iter()
        .flat_map(|c| &c.counted)
        .filter_map(|r| r.socket_calls().map(|c| (c, r.requests)))
        .fold((0u64, 0u64), |(a, b), (c, r)| (a + c, b + r));
    (requests > 0).then(|| calls as f64 / requests as f64)
}

/// A cell's socket calls over its counted runs, and in how many of them they were derived.
pub(super) fn socket_calls(cell: &Cell, per_request: Option<f64>) -> Option<(f64, usize)> {
    let mut total = 0.0;
    let mut derived = 0;
    for r in &cell.counted {
        match r.socket_calls() {
            Some(c) => total += c as f64,
            None => {
                total += r.requests as f64 * per_request?;
                derived += 1;
            }
        }
    }
    (!cell.counted.is_empty()).then_some((total, derived))
}

pub(super) fn summary(loads: &[Load], variants: &[Variant], cells: &[Vec<Cell>]) -> String {
    let mut attached = Vec::new();
    let mut md = String::from("| load | agent | req/s (wall clock) | ratio to its paired runs without an agent | spread of the pairs | socket calls per request | all programs, ns per socket call | the agent process's own CPU during the load, % of a core | /health, `details.web.kernel` |\n|---|---|---|---|---|---|---|---|---|\n");
    let mut verdicts: Vec<Judged> = Vec::new();
    for (li, load) in loads.iter().enumerate() {
        let per_request = calls_per_request(&cells[li]);
        for (vi, variant) in variants.iter().enumerate() {
            let cell = &cells[li][vi];
            let rps = mean(&cell.rps);
            let ratio_of_means = rps / mean(&cell.paired_none);
            let mut ratios: Vec<f64> = cell
                .rps
                .iter()
                .zip(&cell.paired_none)
                .map(|(a, b)| a / b)
                .collect();
            let pairs = interval95(&ratios);
            let (ratio, spread) = if vi == 0 {
                ("—".to_string(), "—".to_string())
            } else {
                (
                    format!("**{ratio_of_means:.3}×**"),
                    format!(
                        "{:.3}–{:.3}, median {:.3}{}",
                        ratios.iter().cloned().fold(f64::MAX, f64::min),
                        ratios.iter().cloned().fold(0.0, f64::max),
                        median(&mut ratios),
                        pairs.map_or(String::new(), |(m, h)| format!(
                            "; mean {m:.3} ± {h:.3} (95 %)"
                        ))
                    ),
                )
            };
            let (calls, ns) = match socket_calls(cell, per_request) {
                Some((calls, derived)) => {
                    let requests: u64 = cell.counted.iter().map(|r| r.requests).sum();
                    let ns: u64 = cell
                        .counted
                        .iter()
                        .flat_map(|r| r.programs.values())
                        .map(|c| c.1)
                        .sum();
                    let per_call = ns as f64 / calls;
                    if variant.judged {
                        verdicts.push((
                            load.label,
                            Some(per_call),
                            ratio_of_means,
                            pairs,
                            cell.codes.iter().all(|&c| c == 200),
                        ));
                    }
                    (
                        format!(
                            "{:.2}{}",
                            calls / requests.max(1) as f64,
                            if derived > 0 {
                                format!(" (derived in {derived} of {} runs: their requests × this load's socket calls per request, counted with the per-call programs attached in this bench run)", cell.counted.len())
                            } else {
                                " (counted: run_cnt of sock_recv_length + sock_send_length)".into()
                            }
                        ),
                        format!("**{per_call:.1}**"),
                    )
                }
                None if vi == 0 => ("—".into(), "0 (nothing loaded)".into()),
                None => {
                    if variant.judged {
                        verdicts.push((
                            load.label,
                            None,
                            ratio_of_means,
                            pairs,
                            cell.codes.iter().all(|&c| c == 200),
                        ));
                    }
                    (
                        "not known: no run had the per-call programs attached".into(),
                        "—".into(),
                    )
                }
            };
            let health = if vi == 0 {
                "—".to_string()
            } else {
                format!(
                    "{} / {}",
                    cell.codes
                        .iter()
                        .map(u16::to_string)
                        .collect::<Vec<_>>()
                        .join(", "),
                    cell.kernel.iter().cloned().collect::<Vec<_>>().join("; ")
                )
            };
            let cpu = if cell.agent_cpu.is_empty() {
                "—".to_string()
            } else {
                format!("{:.2} %", mean(&cell.agent_cpu))
            };
            let _ = writeln!(
                md,
                "| {} | {} | {rps:.0} | {ratio} | {spread} | {calls} | {ns} | {cpu} | {health} |",
                load.label, variant.label
            );
            if variant.judged && !cell.attached.is_empty() {
                attached.push(format!("{}: {}", load.label, cell.attached.join("; ")));
            }
        }
    }
    md.push_str(&targets(&verdicts, &attached));

    md
}

pub(super) fn per_program(loads: &[Load], variants: &[Variant], cells: &[Vec<Cell>]) -> String {
    let mut md = String::from("Per program, summed over the counted runs (runs per socket call: the program's run_cnt over the socket calls of the same runs):\n\n| load | agent | program | run_cnt | run_time_ns | ns per run | runs per socket call |\n|---|---|---|---|---|---|---|\n");
    for (li, load) in loads.iter().enumerate() {
        let per_request = calls_per_request(&cells[li]);
        for (vi, variant) in variants.iter().enumerate().skip(1) {
            let cell = &cells[li][vi];
            let mut sums: BTreeMap<&str, Counters> = BTreeMap::new();
            for r in &cell.counted {
                for (name, c) in &r.programs {
                    let s = sums.entry(name).or_default();
                    s.0 += c.0;
                    s.1 += c.1;
                }
            }
            let calls = socket_calls(cell, per_request).map(|c| c.0);
            let idle: Vec<&str> = sums
                .iter()
                .filter(|(_, c)| c.0 == 0)
                .map(|(n, _)| *n)
                .collect();
            if !idle.is_empty() {
                let _ = writeln!(
                    md,
                    "| {} | {} | {} | 0 | 0 | — (loaded, did not run) | 0 |",
                    load.label,
                    variant.label,
                    idle.join(", ")
                );
            }
            for (name, (cnt, ns)) in sums.into_iter().filter(|(_, c)| c.0 > 0) {
                let _ = writeln!(
                    md,
                    "| {} | {} | {name} | {cnt} | {ns} | {:.1} | {} |",
                    load.label,
                    variant.label,
                    ns as f64 / cnt as f64,
                    calls.map_or("—".into(), |c| format!("{:.3}", cnt as f64 / c)),
                );
            }
        }
    }
    md
}

/// One judged cell: the load, ns per socket call, the ratio to its paired runs and their 95 %
/// interval, and whether every `/health` was 200.
type Judged = (&'static str, Option<f64>, f64, Option<(f64, f64)>, bool);

/// The targets against the judged build's cells, and when its programs attached on a
/// suspicion.
fn targets(verdicts: &[Judged], attached: &[String]) -> String {
    let mut md = String::new();
    let mut ok = true;
    let mut lines = Vec::new();
    for &(label, per_call, ratio, pairs, all_200) in verdicts {
        let want = if label.contains("new connection") {
            Some(0.98)
        } else if label.starts_with("nginx") {
            Some(0.99)
        } else {
            None
        };
        let good =
            per_call.is_some_and(|n| n <= 20.0) && want.is_none_or(|w| ratio >= w) && all_200;
        ok &= good;
        lines.push(format!(
            "{label}: {}{}{} {}",
            per_call.map_or("ns per socket call not known".into(), |n| format!(
                "{n:.1} ns per socket call"
            )),
            want.map_or(String::new(), |w| format!(
                ", {ratio:.3}× (≥ {w}×{})",
                pairs.map_or(String::new(), |(m, h)| format!(
                    "; the pairs' mean {m:.3} ± {h:.3} {}",
                    if m - h >= w {
                        "resolves it"
                    } else if m + h < w {
                        "falls short"
                    } else {
                        "does not resolve it"
                    }
                ))
            )),
            if all_200 { "" } else { ", /health was not 200" },
            if good { "✓" } else { "✗" }
        ));
    }
    ok &= !verdicts.is_empty();
    let _ = writeln!(
        md,
        "\nTargets for this build (issue 21): ≤ 20 ns of the agent's programs per socket call on every load; nginx keeps ≥ 0.99× keep-alive and ≥ 0.98× new-connection throughput. {}: {}\n",
        if ok { "Met ✓" } else { "Not met ✗" },
        lines.join("; ")
    );
    println!("bench: bpf stats targets: {}", lines.join("; "));
    let _ = writeln!(
        md,
        "The programs of the judged build attached on a suspicion (not a counting window) during these runs: {}\n",
        if attached.is_empty() {
            "never".to_string()
        } else {
            attached.join("; ")
        }
    );
    md
}
