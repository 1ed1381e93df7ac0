//! The output: one table of every measured case, then one line per comparison, in one of
//! two shapes whose name says the direction:
//!
//! - `ratio CASE VALUE`: higher is better for idem. VALUE is idem's ops/s over the
//!   baseline's or peer's on the same workload, same run, or (`durable-vs-*`) the peer's
//!   time per workflow over idem's;
//! - `cost-ratio CASE VALUE`: lower is better. VALUE is idem's cost over the baseline's
//!   (the `steps-*` lines: a durable step's cost over a raw write's).
//!
//! Then the guarantee, footprint, steps and durable tables.
//!
//! The tables are Markdown, so the output pastes into docs/performance.md as it is.

use std::fmt::Write as _;
use std::time::Duration;

use crate::load::Outcome;

/// What a measured case comes to, from either load loop (`load::run` or the Redis
/// cases' `runner::run`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Summary {
    pub(crate) tasks: usize,
    pub(crate) ops_per_sec: f64,
    pub(crate) p50: Duration,
    pub(crate) p99: Duration,
    pub(crate) errors: u64,
}

impl From<&Outcome> for Summary {
    fn from(o: &Outcome) -> Summary {
        Summary {
            tasks: o.tasks,
            ops_per_sec: o.ops_per_sec(),
            p50: o.p50(),
            p99: o.p99(),
            errors: o.errors,
        }
    }
}

impl From<&crate::stats::Row> for Summary {
    fn from(r: &crate::stats::Row) -> Summary {
        Summary {
            tasks: r.tasks,
            ops_per_sec: r.ops_per_sec(),
            p50: r.p50,
            p99: r.p99,
            errors: 0,
        }
    }
}

/// One measured case.
#[derive(Debug, Clone)]
pub(crate) struct Row {
    /// Which group of cases (`redis`, `sql/postgres`, `peers/memory`, …).
    pub(crate) group: String,
    /// The case (`idem dedup new key`, `raw SET NX PX`, …).
    pub(crate) case: String,
    pub(crate) summary: Summary,
}

/// A comparison: `ratio NAME VALUE` or `cost-ratio NAME VALUE`.
#[derive(Debug, Clone)]
pub(crate) struct Ratio {
    pub(crate) name: String,
    pub(crate) value: f64,
    /// What was divided by what, for the reader of the table.
    pub(crate) what: String,
    pub(crate) better: Better,
}

/// Which way a ratio is good for idem, and so which word its line starts with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Better {
    /// `ratio`: idem's throughput over the other's, or the other's cost over idem's.
    Higher,
    /// `cost-ratio`: idem's cost over the other's.
    Lower,
}

impl Ratio {
    fn prefix(&self) -> &'static str {
        match self.better {
            Better::Higher => "ratio",
            Better::Lower => "cost-ratio",
        }
    }
}

/// One series of the throughput-vs-concurrency chart.
#[derive(Debug, Clone)]
pub struct Series {
    pub(crate) name: String,
    /// (tasks, ops/s)
    pub(crate) points: Vec<(usize, f64)>,
}

/// Everything a run found, printed at the end (and kept for the chart).
#[derive(Debug, Default)]
pub struct Report {
    pub(crate) rows: Vec<Row>,
    pub(crate) ratios: Vec<Ratio>,
    pub series: Vec<Series>,
    /// Extra Markdown tables (guarantees, footprint), already rendered.
    pub(crate) sections: Vec<(String, String)>,
    pub(crate) notes: Vec<String>,
}

impl Report {
    /// Records a case measured by `load::run` and prints a progress line to stderr
    /// (stdout holds the report).
    pub(crate) fn add(&mut self, group: &str, case: &str, outcome: Outcome) -> Summary {
        if let Some(e) = &outcome.first_error {
            self.note(format!(
                "{group} / {case} / {} tasks: {} errors, first: {e}",
                outcome.tasks, outcome.errors
            ));
        }
        self.add_summary(group, case, Summary::from(&outcome))
    }

    pub(crate) fn add_summary(&mut self, group: &str, case: &str, s: Summary) -> Summary {
        eprintln!(
            "  {group:<14} {case:<42} {:>4} tasks {:>10} ops/s  p50 {:>9}  p99 {:>9}{}",
            s.tasks,
            fmt_rate(s.ops_per_sec),
            fmt_dur(s.p50),
            fmt_dur(s.p99),
            if s.errors > 0 {
                format!("  ({} errors)", s.errors)
            } else {
                String::new()
            }
        );
        self.rows.push(Row {
            group: group.to_owned(),
            case: case.to_owned(),
            summary: s,
        });
        s
    }

    /// `ratio NAME a/b`. A case that had errors or no calls gives no ratio: a number made
    /// from a failing case would read as a measurement.
    pub(crate) fn ratio(
        &mut self,
        name: impl Into<String>,
        idem: &Summary,
        base: &Summary,
        what: &str,
    ) {
        let name = name.into();
        if self.no_ratio(
            &name,
            idem,
            base,
            idem.ops_per_sec <= 0.0 || base.ops_per_sec <= 0.0,
        ) {
            return;
        }
        self.ratios.push(Ratio {
            name,
            value: idem.ops_per_sec / base.ops_per_sec,
            what: what.to_owned(),
            better: Better::Higher,
        });
    }

    /// `ratio NAME median(per_round)`: for cases measured in rounds, each round's
    /// ratio taken from windows seconds apart. `idem` and `base` are the cases' summaries,
    /// checked for errors as in [`Report::ratio`]. The spread of the rounds goes into
    /// what the ratio divides, so a reader sees how far one round is to be trusted.
    pub(crate) fn ratio_of(
        &mut self,
        name: impl Into<String>,
        mut per_round: Vec<f64>,
        idem: &Summary,
        base: &Summary,
        what: &str,
    ) {
        let name = name.into();
        per_round.retain(|r| r.is_finite() && *r > 0.0);
        if self.no_ratio(&name, idem, base, per_round.is_empty()) {
            return;
        }
        per_round.sort_by(f64::total_cmp);
        let n = per_round.len();
        let median = if n % 2 == 1 {
            per_round[n / 2]
        } else {
            (per_round[n / 2 - 1] + per_round[n / 2]) / 2.0
        };
        self.ratios.push(Ratio {
            name,
            value: median,
            what: format!(
                "{what} ({n} rounds, {:.2} to {:.2})",
                per_round[0],
                per_round[n - 1]
            ),
            better: Better::Higher,
        });
    }

    /// `cost-ratio NAME VALUE` for a ratio of two costs (idem's time per call or per step
    /// over the other's), where lower is better, unlike [`Report::ratio`]'s ops/s. The
    /// caller gives no ratio for a case that had errors.
    ///
    /// Until release 0.2 the same value is also printed the old way, `ratio NAME VALUE`
    /// (the `steps` family printed its cost ratios under `ratio` before the two words
    /// were told apart), so scripts reading the old line keep working for one release.
    pub(crate) fn cost_ratio(&mut self, name: impl Into<String>, value: f64, what: &str) {
        self.ratios.push(Ratio {
            name: name.into(),
            value,
            what: what.to_owned(),
            better: Better::Lower,
        });
    }

    /// `ratio NAME VALUE` for a value the caller computed, where higher is better for idem
    /// (a peer's time per call over idem's). The caller gives no ratio for a case that
    /// had errors.
    pub(crate) fn gain_ratio(&mut self, name: impl Into<String>, value: f64, what: &str) {
        self.ratios.push(Ratio {
            name: name.into(),
            value,
            what: what.to_owned(),
            better: Better::Higher,
        });
    }

    /// Whether `name` gets no ratio because a case had errors or (`no_calls`) made no
    /// calls; if so, a note says why.
    fn no_ratio(&mut self, name: &str, idem: &Summary, base: &Summary, no_calls: bool) -> bool {
        if idem.errors == 0 && base.errors == 0 && !no_calls {
            return false;
        }
        self.notes.push(format!(
            "no ratio {name}: a case had errors ({} / {}) or no calls",
            idem.errors, base.errors
        ));
        true
    }

    pub(crate) fn note(&mut self, note: impl Into<String>) {
        let note = note.into();
        eprintln!("  note: {note}");
        self.notes.push(note);
    }

    pub(crate) fn section(&mut self, title: &str, markdown: String) {
        self.sections.push((title.to_owned(), markdown));
    }

    /// The whole report as text: the table, the ratio lines, the other sections, notes.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let mut table = vec![vec![
            "group".to_owned(),
            "case".to_owned(),
            "tasks".to_owned(),
            "ops/s".to_owned(),
            "p50".to_owned(),
            "p99".to_owned(),
            "errors".to_owned(),
        ]];
        for r in &self.rows {
            table.push(vec![
                r.group.clone(),
                r.case.clone(),
                r.summary.tasks.to_string(),
                fmt_rate(r.summary.ops_per_sec),
                fmt_latency(r.summary.p50),
                fmt_latency(r.summary.p99),
                r.summary.errors.to_string(),
            ]);
        }
        out.push_str(&markdown_table(
            &table,
            &[false, false, true, true, true, true, true],
        ));
        out.push('\n');
        for r in &self.ratios {
            let _ = writeln!(out, "{} {} {:.2}", r.prefix(), r.name, r.value);
        }
        // The old spelling of the cost ratios, kept for one release (until 0.2): see
        // [`Report::cost_ratio`].
        for r in self.ratios.iter().filter(|r| r.better == Better::Lower) {
            let _ = writeln!(out, "ratio {} {:.2}", r.name, r.value);
        }
        for (title, body) in &self.sections {
            let _ = write!(out, "\n## {title}\n\n{body}");
        }
        if !self.notes.is_empty() {
            out.push_str("\n## Notes\n\n");
            for n in &self.notes {
                let _ = writeln!(out, "- {n}");
            }
        }
        if !self.ratios.is_empty() {
            out.push_str("\n## What each ratio divides\n\n");
            for r in &self.ratios {
                let _ = writeln!(out, "- `{} {}`: {}", r.prefix(), r.name, r.what);
            }
            if self.ratios.iter().any(|r| r.better == Better::Lower) {
                out.push_str(
                    "\n`ratio` lines: higher is better for idem; `cost-ratio` lines: lower is \
                     better. Each `cost-ratio` is also printed as `ratio NAME VALUE`, its \
                     spelling before the two were told apart, until release 0.2.\n",
                );
            }
        }
        out
    }
}

/// A Markdown table with columns padded to line up in a terminal too.
pub(crate) fn markdown_table(rows: &[Vec<String>], right: &[bool]) -> String {
    let cols = rows.first().map_or(0, Vec::len);
    let width: Vec<usize> = (0..cols)
        .map(|c| {
            rows.iter()
                .map(|r| r.get(c).map_or(0, |s| s.chars().count()))
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for (i, row) in rows.iter().enumerate() {
        out.push('|');
        for (c, w) in width.iter().enumerate() {
            let cell = row.get(c).map_or("", String::as_str);
            let pad = w - cell.chars().count();
            if right.get(c).copied().unwrap_or(false) {
                let _ = write!(out, " {}{cell} |", " ".repeat(pad));
            } else {
                let _ = write!(out, " {cell}{} |", " ".repeat(pad));
            }
        }
        out.push('\n');
        if i == 0 {
            out.push('|');
            for (c, w) in width.iter().enumerate() {
                let dashes = "-".repeat((*w).max(3));
                if right.get(c).copied().unwrap_or(false) {
                    let _ = write!(out, " {}: |", &dashes[1..]);
                } else {
                    let _ = write!(out, " {dashes} |");
                }
            }
            out.push('\n');
        }
    }
    out
}

pub(crate) fn fmt_rate(ops: f64) -> String {
    if ops >= 1e6 {
        format!("{:.2} M", ops / 1e6)
    } else if ops >= 1e4 {
        format!("{:.1} k", ops / 1e3)
    } else {
        format!("{ops:.0}")
    }
}

pub(crate) fn fmt_dur(d: Duration) -> String {
    let ns = d.as_nanos();
    if ns >= 10_000_000 {
        format!("{:.1} ms", ns as f64 / 1e6)
    } else if ns >= 10_000 {
        format!("{:.1} µs", ns as f64 / 1e3)
    } else {
        format!("{ns} ns")
    }
}

/// A latency, or "n/a" for a case whose load loop does not keep them.
fn fmt_latency(d: Duration) -> String {
    if d.is_zero() {
        "n/a".to_owned()
    } else {
        fmt_dur(d)
    }
}

pub(crate) fn fmt_bytes(b: f64) -> String {
    if b >= 1024.0 * 1024.0 {
        format!("{:.1} MiB", b / (1024.0 * 1024.0))
    } else if b >= 1024.0 {
        format!("{:.1} KiB", b / 1024.0)
    } else {
        format!("{b:.0} B")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_ratio_line_names_its_direction_and_cost_ratios_keep_their_old_line() {
        let mut r = Report::default();
        r.gain_ratio("durable-vs-dbos@1", 2.5, "peer / idem");
        r.cost_ratio("steps-redis-step-vs-raw-write@50", 1.1, "idem / raw");
        let out = r.render();
        assert!(out.contains("\nratio durable-vs-dbos@1 2.50\n"), "{out}");
        assert!(
            out.contains("\ncost-ratio steps-redis-step-vs-raw-write@50 1.10\n"),
            "{out}"
        );
        // The old spelling, once, until 0.2; a gain ratio has no second line.
        assert_eq!(
            out.matches("ratio steps-redis-step-vs-raw-write@50 1.10")
                .count(),
            2
        );
        assert_eq!(out.matches("durable-vs-dbos@1 2.50").count(), 1);
        assert!(out.find("cost-ratio steps").unwrap() < out.rfind("\nratio steps").unwrap());
    }
}
