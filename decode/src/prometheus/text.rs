//! Line parser for the text exposition format.
use super::{Limits, ParseStats, Sample};

enum LineError {
    Syntax,
    TooManyLabels,
}

/// Parses `body`, calling `visit` for every sample line that parses. Comment lines (`# HELP`,
/// `# TYPE`, `# EOF`) carry nothing the agent uses: sample names already say what they are.
pub fn parse<'a>(body: &'a [u8], limits: &Limits, mut visit: impl FnMut(Sample<'a>)) -> ParseStats {
    let mut stats = ParseStats::default();
    let body = if body.len() > limits.max_bytes {
        stats.truncated = true;
        // Cut at the last complete line inside the limit, so no half line is read as a sample.
        let head = &body[..limits.max_bytes];
        match memchr::memrchr(b'\n', head) {
            Some(end) => &head[..end],
            None => &[],
        }
    } else {
        body
    };
    for raw in body.split(|&b| b == b'\n') {
        let raw = raw.strip_suffix(b"\r").unwrap_or(raw);
        if raw.len() > limits.max_line_bytes {
            stats.line_too_long += 1;
            continue;
        }
        let Ok(line) = std::str::from_utf8(raw) else {
            stats.not_utf8 += 1;
            continue;
        };
        let line = line.trim_matches(|c| c == ' ' || c == '\t');
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if stats.samples >= limits.max_samples as u64 {
            stats.samples_dropped += 1;
            continue;
        }
        match sample(line, limits.max_labels) {
            Ok(s) => {
                stats.samples += 1;
                visit(s);
            }
            Err(LineError::Syntax) => stats.bad_lines += 1,
            Err(LineError::TooManyLabels) => stats.too_many_labels += 1,
        }
    }
    stats
}

fn sample(line: &str, max_labels: usize) -> Result<Sample<'_>, LineError> {
    let name_end = line
        .char_indices()
        .find(|&(i, c)| !is_name_char(c, i == 0))
        .map_or(line.len(), |(i, _)| i);
    if name_end == 0 {
        return Err(LineError::Syntax);
    }
    let name = &line[..name_end];
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(after) = rest.strip_prefix('{') {
        rest = label_set(after, &mut labels, max_labels)?;
    }
    // Value, then an optional timestamp, then an optional OpenMetrics exemplar (` # {...} v`).
    let mut fields = rest.split_ascii_whitespace();
    let value = fields.next().ok_or(LineError::Syntax)?;
    let value = parse_value(value).ok_or(LineError::Syntax)?;
    match fields.next() {
        None | Some("#") => {}
        Some(ts) if ts.parse::<f64>().is_ok() => {
            if fields.next().is_some_and(|f| f != "#") {
                return Err(LineError::Syntax);
            }
        }
        Some(_) => return Err(LineError::Syntax),
    }
    Ok(Sample {
        name,
        labels,
        value,
    })
}

fn is_name_char(c: char, first: bool) -> bool {
    c.is_ascii_alphabetic() || c == '_' || c == ':' || (!first && c.is_ascii_digit())
}

/// Parses `a="x",b="y"}` (after the `{`) into `out`; returns what follows the `}`.
fn label_set<'a>(
    mut s: &'a str,
    out: &mut Vec<(&'a str, String)>,
    max_labels: usize,
) -> Result<&'a str, LineError> {
    loop {
        s = s.trim_start_matches(' ');
        if let Some(after) = s.strip_prefix('}') {
            return Ok(after);
        }
        let key_end = s
            .char_indices()
            .find(|&(i, c)| !(c.is_ascii_alphabetic() || c == '_' || (i > 0 && c.is_ascii_digit())))
            .map_or(s.len(), |(i, _)| i);
        if key_end == 0 {
            return Err(LineError::Syntax);
        }
        let key = &s[..key_end];
        s = s[key_end..].trim_start_matches(' ');
        s = s.strip_prefix('=').ok_or(LineError::Syntax)?;
        s = s.trim_start_matches(' ');
        s = s.strip_prefix('"').ok_or(LineError::Syntax)?;
        let (value, after) = quoted(s)?;
        if out.len() >= max_labels {
            return Err(LineError::TooManyLabels);
        }
        out.push((key, value));
        s = after.trim_start_matches(' ');
        if let Some(after) = s.strip_prefix(',') {
            s = after;
        } else if !s.starts_with('}') {
            return Err(LineError::Syntax);
        }
    }
}

/// A label value up to its closing quote, with `\\`, `\"` and `\n` unescaped.
fn quoted(s: &str) -> Result<(String, &str), LineError> {
    let mut value = String::new();
    let mut chars = s.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return Ok((value, &s[i + 1..])),
            '\\' => match chars.next() {
                Some((_, 'n')) => value.push('\n'),
                Some((_, '\\')) => value.push('\\'),
                Some((_, '"')) => value.push('"'),
                // The format defines only those three; keep anything else as written.
                Some((_, other)) => {
                    value.push('\\');
                    value.push(other);
                }
                None => return Err(LineError::Syntax),
            },
            c => value.push(c),
        }
    }
    Err(LineError::Syntax)
}

/// Go-style floats as Prometheus writes them: `1`, `1.5e+09`, `+Inf`, `-Inf`, `NaN`.
fn parse_value(s: &str) -> Option<f64> {
    match s {
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        "NaN" => Some(f64::NAN),
        // Rust also accepts "inf", "infinity" and "nan" in any case; the format does not.
        _ if s
            .bytes()
            .any(|b| b.is_ascii_alphabetic() && !matches!(b, b'e' | b'E')) =>
        {
            None
        }
        _ => s.parse().ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Owned = (String, Vec<(String, String)>, f64);

    fn all(body: &str) -> (Vec<Owned>, ParseStats) {
        let mut out = Vec::new();
        let stats = parse(body.as_bytes(), &Limits::default(), |s| {
            out.push((
                s.name.to_string(),
                s.labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.clone()))
                    .collect(),
                s.value,
            ))
        });
        (out, stats)
    }

    #[test]
    fn parses_names_labels_values_and_timestamps() {
        let (s, stats) = all(concat!(
            "# HELP vllm:num_requests_running Number of requests.\n",
            "# TYPE vllm:num_requests_running gauge\n",
            "vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 3.0\n",
            "plain 1e+03 1700000000000\r\n",
            "  spaced{ a = \"x\" , } -Inf\n",
            "\n",
            "h_bucket{le=\"+Inf\"} 7\n",
            "esc{p=\"a\\\"b\\\\c\\nd\"} NaN\n",
            "om_total 5 # {trace_id=\"abc\"} 1.0\n",
            "# EOF\n",
        ));
        assert_eq!(stats.skipped(), 0, "{stats:?}");
        assert_eq!(s.len(), 6);
        assert_eq!(s[0].0, "vllm:num_requests_running");
        assert_eq!(
            s[0].1,
            vec![
                ("engine".into(), "0".into()),
                ("model_name".into(), "m".into())
            ]
        );
        assert_eq!(s[0].2, 3.0);
        assert_eq!((s[1].0.as_str(), s[1].2), ("plain", 1000.0));
        assert_eq!(s[2].1, vec![("a".into(), "x".into())]);
        assert_eq!(s[2].2, f64::NEG_INFINITY);
        assert_eq!(s[3].1[0].1, "+Inf");
        assert_eq!(s[4].1[0].1, "a\"b\\c\nd");
        assert!(s[4].2.is_nan());
        assert_eq!(s[5].2, 5.0);
    }

    #[test]
    fn counts_bad_lines_and_keeps_the_good_ones() {
        let (s, stats) = all(concat!(
            "good 1\n",
            "9bad 1\n",
            "noval\n",
            "x{a=\"unterminated} 1\n",
            "x{a=b} 1\n",
            "x{a=\"1\"\"} 1\n",
            "x 1 notatime\n",
            "x inf\n",
            "x 0x10\n",
            "also_good{} 2\n",
        ));
        assert_eq!(s.len(), 2);
        assert_eq!(stats.bad_lines, 8);
        assert_eq!((s[1].0.as_str(), s[1].2), ("also_good", 2.0));
    }

    #[test]
    fn bounds_are_counted() {
        let limits = Limits {
            max_bytes: 60,
            max_line_bytes: 20,
            max_labels: 1,
            max_samples: 2,
        };
        let body =
            b"a 1\nlong_line_name_xx_yy 1\nb{x=\"1\",y=\"2\"} 1\n\xff 1\nc 1\nd 1\ne 1\nf 1\n";
        let mut names = Vec::new();
        let stats = parse(body, &limits, |s| names.push(s.name.to_string()));
        assert_eq!(names, ["a", "c"]);
        assert_eq!(stats.line_too_long, 1);
        assert_eq!(stats.too_many_labels, 1);
        assert_eq!(stats.not_utf8, 1);
        assert!(stats.truncated);
        // d and e; f is past max_bytes.
        assert_eq!(stats.samples_dropped, 2);
    }
}
