//! Time windows on CLOCK_MONOTONIC, and the forms people write them in.
use std::time::{Duration, UNIX_EPOCH};

/// `[start, end)` in CLOCK_MONOTONIC nanoseconds (the clock of every record).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct TimeWindow {
    pub start_mono_ns: u64,
    pub end_mono_ns: u64,
}

impl TimeWindow {
    pub fn contains(&self, t: u64) -> bool {
        t >= self.start_mono_ns && t < self.end_mono_ns
    }

    pub fn duration_s(&self) -> f64 {
        self.end_mono_ns.saturating_sub(self.start_mono_ns) as f64 / 1e9
    }

    /// Nanoseconds of `[a, b)` inside the window.
    pub fn overlap_ns(&self, a: u64, b: u64) -> u64 {
        b.min(self.end_mono_ns)
            .saturating_sub(a.max(self.start_mono_ns))
    }
}

/// One end of a window as written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bound {
    /// CLOCK_MONOTONIC nanoseconds.
    Mono(u64),
    /// Wall clock (from RFC 3339), nanoseconds since the Unix epoch.
    Unix(u64),
    /// `+30s`: after the recording's start.
    AfterStart(u64),
    /// `-5m`: before the recording's end.
    BeforeEnd(u64),
    /// Empty: the recording's start (as a start) or end (as an end).
    Open,
}

/// A window as written: `START..END`, or a bare duration (`5m`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowSpec {
    Range(Bound, Bound),
    /// The incident window: the last D of the recording. The baseline: the D just before the
    /// incident window.
    Last(u64),
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum WindowError {
    #[error(
        "cannot read the time {0:?}: use CLOCK_MONOTONIC nanoseconds, an RFC 3339 time (2026-11-30T06:00:00Z), +DURATION after the recording's start or -DURATION before its end"
    )]
    BadBound(String),
    #[error("cannot read the window {0:?}: write START..END or a duration such as 5m")]
    BadWindow(String),
    #[error(
        "an RFC 3339 time needs records with wall-clock arrival times (arrival_unix_ns) to map it onto the monotonic clock"
    )]
    NoWallClock,
    #[error("the window {0} is empty or reversed (it ends before it starts)")]
    Empty(String),
    #[error("there are no records to place a relative time against")]
    NoRecords,
}

fn parse_duration_ns(s: &str) -> Option<u64> {
    humantime::parse_duration(s.trim())
        .ok()
        .and_then(|d| u64::try_from(d.as_nanos()).ok())
}

fn parse_bound(s: &str) -> Result<Bound, WindowError> {
    let t = s.trim();
    let bad = || WindowError::BadBound(s.to_owned());
    if t.is_empty() {
        return Ok(Bound::Open);
    }
    if let Some(rest) = t.strip_prefix('+') {
        return parse_duration_ns(rest)
            .map(Bound::AfterStart)
            .ok_or_else(bad);
    }
    if let Some(rest) = t.strip_prefix('-') {
        return parse_duration_ns(rest)
            .map(Bound::BeforeEnd)
            .ok_or_else(bad);
    }
    if t.bytes().all(|b| b.is_ascii_digit()) {
        return t.parse().map(Bound::Mono).map_err(|_| bad());
    }
    let time = humantime::parse_rfc3339_weak(t).map_err(|_| bad())?;
    let since = time.duration_since(UNIX_EPOCH).map_err(|_| bad())?;
    u64::try_from(since.as_nanos())
        .map(Bound::Unix)
        .map_err(|_| bad())
}

pub fn parse_window(s: &str) -> Result<WindowSpec, WindowError> {
    match s.split_once("..") {
        Some((a, b)) => Ok(WindowSpec::Range(parse_bound(a)?, parse_bound(b)?)),
        None => parse_duration_ns(s)
            .filter(|d| *d > 0)
            .map(WindowSpec::Last)
            .ok_or_else(|| WindowError::BadWindow(s.to_owned())),
    }
}

/// Where the recording sits in time, to place relative and wall-clock bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeline {
    pub start_mono_ns: u64,
    pub end_mono_ns: u64,
    /// Wall clock minus monotonic clock, in ns (None without wall-clock times).
    pub unix_minus_mono_ns: Option<i128>,
}

impl Timeline {
    /// From the records: first arrival, last end, and the median wall-minus-monotonic offset.
    pub fn of(requests: &[super::RequestSample]) -> Option<Timeline> {
        let start = requests.iter().map(|r| r.arrival_mono_ns).min()?;
        let end = requests
            .iter()
            .map(|r| r.end_mono_ns.max(r.arrival_mono_ns))
            .max()?;
        let mut offsets: Vec<i128> = requests
            .iter()
            .filter(|r| r.arrival_unix_ns > 0)
            .map(|r| i128::from(r.arrival_unix_ns) - i128::from(r.arrival_mono_ns))
            .collect();
        offsets.sort_unstable();
        Some(Timeline {
            start_mono_ns: start,
            // The end is exclusive: keep the last arrival inside an open-ended window.
            end_mono_ns: end.saturating_add(1),
            unix_minus_mono_ns: offsets.get(offsets.len() / 2).copied(),
        })
    }

    fn resolve(&self, b: Bound, open: u64) -> Result<u64, WindowError> {
        Ok(match b {
            Bound::Mono(t) => t,
            Bound::Unix(t) => {
                let off = self.unix_minus_mono_ns.ok_or(WindowError::NoWallClock)?;
                u64::try_from((i128::from(t) - off).max(0)).unwrap_or(u64::MAX)
            }
            Bound::AfterStart(d) => self.start_mono_ns.saturating_add(d),
            Bound::BeforeEnd(d) => self.end_mono_ns.saturating_sub(d),
            Bound::Open => open,
        })
    }

    fn range(&self, a: Bound, b: Bound, text: &str) -> Result<TimeWindow, WindowError> {
        let w = TimeWindow {
            start_mono_ns: self.resolve(a, self.start_mono_ns)?,
            end_mono_ns: self.resolve(b, self.end_mono_ns)?,
        };
        if w.end_mono_ns <= w.start_mono_ns {
            return Err(WindowError::Empty(text.to_owned()));
        }
        Ok(w)
    }

    /// Resolves the baseline and incident windows. A bare duration for the incident window
    /// means the recording's last D; for the baseline, the D before the incident window.
    pub fn windows(
        &self,
        baseline: WindowSpec,
        incident: WindowSpec,
    ) -> Result<(TimeWindow, TimeWindow), WindowError> {
        let window = match incident {
            WindowSpec::Range(a, b) => self.range(a, b, "--window")?,
            WindowSpec::Last(d) => TimeWindow {
                start_mono_ns: self.end_mono_ns.saturating_sub(d).max(self.start_mono_ns),
                end_mono_ns: self.end_mono_ns,
            },
        };
        let base = match baseline {
            WindowSpec::Range(a, b) => self.range(a, b, "--baseline")?,
            WindowSpec::Last(d) => TimeWindow {
                start_mono_ns: window.start_mono_ns.saturating_sub(d),
                end_mono_ns: window.start_mono_ns,
            },
        };
        if base.end_mono_ns <= base.start_mono_ns {
            return Err(WindowError::Empty("--baseline".to_owned()));
        }
        Ok((base, window))
    }
}

/// Formats a duration in ns for people (`2.5s`, `300ms`).
pub(crate) fn human_ns(ns: u64) -> String {
    humantime::format_duration(Duration::from_millis(ns / 1_000_000)).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diagnose::RequestSample;

    fn timeline() -> Timeline {
        let r = |mono: u64| RequestSample {
            arrival_mono_ns: mono,
            arrival_unix_ns: mono + 1_700_000_000_000_000_000,
            end_mono_ns: mono + 1_000,
            ..Default::default()
        };
        Timeline::of(&[r(10_000_000_000), r(70_000_000_000)]).unwrap()
    }

    #[test]
    fn parses_every_bound_form() {
        assert_eq!(parse_bound("123").unwrap(), Bound::Mono(123));
        assert_eq!(
            parse_bound("+30s").unwrap(),
            Bound::AfterStart(30_000_000_000)
        );
        assert_eq!(
            parse_bound("-1m").unwrap(),
            Bound::BeforeEnd(60_000_000_000)
        );
        assert_eq!(parse_bound("").unwrap(), Bound::Open);
        assert_eq!(
            parse_bound("1970-01-01T00:00:01.5Z").unwrap(),
            Bound::Unix(1_500_000_000)
        );
        assert!(parse_bound("yesterday").is_err());
        assert_eq!(
            parse_window("5m").unwrap(),
            WindowSpec::Last(300_000_000_000)
        );
        assert!(parse_window("soon").is_err());
    }

    #[test]
    fn resolves_relative_wall_clock_and_last_forms() {
        let t = timeline();
        let (b, w) = t
            .windows(
                parse_window("..+20s").unwrap(),
                parse_window("-20s..").unwrap(),
            )
            .unwrap();
        assert_eq!(b.start_mono_ns, 10_000_000_000);
        assert_eq!(b.end_mono_ns, 30_000_000_000);
        assert_eq!(w.end_mono_ns, 70_000_001_001);
        // Wall clock 1_700_000_000 s + 40 s is monotonic 40 s.
        let (_, w) = t
            .windows(
                parse_window("..").unwrap(),
                parse_window("2023-11-14T22:14:00Z..2023-11-14T22:14:10Z").unwrap(),
            )
            .unwrap();
        assert_eq!(
            w.start_mono_ns,
            1_700_000_040_000_000_000 - 1_700_000_000_000_000_000
        );
        let (b, w) = t
            .windows(parse_window("30s").unwrap(), parse_window("10s").unwrap())
            .unwrap();
        assert_eq!(w.end_mono_ns - w.start_mono_ns, 10_000_000_000);
        assert_eq!(b.end_mono_ns, w.start_mono_ns);
        assert!(
            t.windows(
                parse_window("+50s..+40s").unwrap(),
                parse_window("1s").unwrap()
            )
            .is_err()
        );
    }
}
