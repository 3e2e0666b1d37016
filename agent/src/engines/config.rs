//! The scheduler settings an engine process was started with, read from its command line: what
//! `diagnose` shows next to a setting's observable effect (fewer slots, prefills split over more
//! steps). Each engine names its own flags; only those are kept (never the rest of the command
//! line, which may carry paths or secrets).
use std::collections::BTreeMap;

/// One scheduler setting and the command-line flags that set it.
#[derive(Debug, Clone, Copy)]
pub struct ConfigFlag {
    /// The name the setting is reported under (the engine's own config name).
    pub setting: &'static str,
    /// Every spelling of the flag (`-np`, `--parallel`).
    pub flags: &'static [&'static str],
    /// The flag takes a value; without one it is a switch, reported as "true".
    pub takes_value: bool,
}

/// Settings kept per process at most, and characters per value (the rest is cut).
pub(crate) const MAX_SETTINGS: usize = 16;
pub(crate) const MAX_VALUE_CHARS: usize = 64;

/// The settings `flags` names, from a process's arguments (`--flag value` and `--flag=value`;
/// the last occurrence wins, as in the engines' own parsers).
pub(crate) fn parse<S: AsRef<str>>(flags: &[ConfigFlag], args: &[S]) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut i = 0;
    while i < args.len() {
        let arg = args[i].as_ref();
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) if n.starts_with('-') => (n, Some(v)),
            _ => (arg, None),
        };
        i += 1;
        let Some(flag) = flags.iter().find(|f| f.flags.contains(&name)) else {
            continue;
        };
        let value = if !flag.takes_value {
            inline.unwrap_or("true").to_owned()
        } else if let Some(v) = inline {
            v.to_owned()
        } else if let Some(v) = args.get(i) {
            i += 1;
            v.as_ref().to_owned()
        } else {
            continue;
        };
        if out.len() >= MAX_SETTINGS && !out.contains_key(flag.setting) {
            continue;
        }
        out.insert(
            flag.setting.to_owned(),
            value.chars().take(MAX_VALUE_CHARS).collect(),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const FLAGS: &[ConfigFlag] = &[
        ConfigFlag {
            setting: "n_parallel",
            flags: &["-np", "--parallel"],
            takes_value: true,
        },
        ConfigFlag {
            setting: "cont_batching",
            flags: &["-cb", "--cont-batching"],
            takes_value: false,
        },
    ];

    #[test]
    fn reads_both_value_forms_and_switches() {
        let args = [
            "llama-server",
            "-m",
            "/secret/path.gguf",
            "--parallel=4",
            "-cb",
            "-np",
            "2",
        ];
        let got = parse(FLAGS, &args);
        assert_eq!(got.get("n_parallel").map(String::as_str), Some("2"));
        assert_eq!(got.get("cont_batching").map(String::as_str), Some("true"));
        assert_eq!(got.len(), 2, "only the named settings: {got:?}");
    }

    #[test]
    fn a_flag_without_its_value_is_skipped_and_values_are_cut() {
        assert!(parse(FLAGS, &["x", "--parallel"]).is_empty());
        let long = "9".repeat(500);
        let got = parse(FLAGS, &["--parallel", long.as_str()]);
        assert_eq!(got["n_parallel"].len(), MAX_VALUE_CHARS);
    }
}
