//! The one-way pipeline, checked: a module of the agent library may name only modules of its own
//! stage or of earlier ones. Test code (items marked `#[cfg(test)]`, `*tests.rs` files) is exempt:
//! a test may drive any stage.
// A test: a source tree it cannot read is a failure, so it may panic.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::{fs, path::Path};

/// The library's top-level modules, in the order data flows through them. Engines are plugins
/// that feed correlate: they may use capture, decode and identity; correlate, diagnose and export
/// may use them.
const STAGES: &[&str] = &[
    "model",
    "capture",
    "decode",
    "identity",
    "engines",
    "correlate",
    "diagnose",
    "export",
    "pipeline",
    "daemon",
];

fn rank(module: &str) -> Option<usize> {
    STAGES.iter().position(|s| *s == module)
}

/// The non-test source of a file: without the items marked `#[cfg(test)]`.
fn production_source(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..i]);
        let item = &rest[i..];
        // The item ends at its first `;` outside braces, or where its braces close.
        let mut depth = 0usize;
        let mut end = item.len();
        for (at, ch) in item.char_indices() {
            match ch {
                '{' => depth += 1,
                '}' => {
                    depth = depth.saturating_sub(1);
                    if depth == 0 {
                        end = at + 1;
                        break;
                    }
                }
                ';' if depth == 0 => {
                    end = at + 1;
                    break;
                }
                _ => {}
            }
        }
        rest = &item[end..];
    }
    out.push_str(rest);
    out
}

/// Top-level modules named through `crate::`: `crate::x::…` and the groups of `use crate::{…}`.
fn crate_modules_named(source: &str) -> Vec<String> {
    let code: String = source
        .lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n");
    let mut named = Vec::new();
    let mut rest = code.as_str();
    while let Some(i) = rest.find("crate::") {
        let after = &rest[i + "crate::".len()..];
        if let Some(group) = after.strip_prefix('{') {
            // Top-level items of the group, at brace depth 0.
            let mut depth = 0;
            let mut item = String::new();
            for ch in group.chars() {
                match ch {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    _ => {}
                }
                if depth == 0 && (ch == ',' || ch == '{') {
                    if !item.trim().is_empty() {
                        named.push(item.trim().split("::").next().unwrap_or("").to_owned());
                    }
                    item.clear();
                } else if depth == 0 {
                    item.push(ch);
                }
            }
            if !item.trim().is_empty() {
                named.push(item.trim().split("::").next().unwrap_or("").to_owned());
            }
        } else {
            let name: String = after
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            named.push(name);
        }
        rest = after;
    }
    named
}

fn visit(dir: &Path, files: &mut Vec<std::path::PathBuf>) {
    for entry in fs::read_dir(dir).expect("reading agent/src") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            visit(&path, files);
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
}

#[test]
fn no_module_names_a_later_stage() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    visit(&src, &mut files);
    let mut violations = Vec::new();
    let mut checked = 0;
    for file in &files {
        let relative = file.strip_prefix(&src).expect("under src");
        let top = relative
            .components()
            .next()
            .and_then(|c| c.as_os_str().to_str())
            .unwrap_or("")
            .trim_end_matches(".rs");
        let Some(own) = rank(top) else {
            continue; // lib.rs, main.rs and the binary's cli/
        };
        let name = relative.to_string_lossy();
        if name.ends_with("tests.rs") || name.contains("/tests/") {
            continue;
        }
        let text = fs::read_to_string(file).expect("reading a source file");
        checked += 1;
        for module in crate_modules_named(&production_source(&text)) {
            if let Some(theirs) = rank(&module)
                && theirs > own
            {
                violations.push(format!("{name} ({top}) names crate::{module}"));
            }
        }
    }
    assert!(
        checked > 100,
        "only {checked} files checked: is src/ where it was?"
    );
    violations.sort();
    violations.dedup();
    assert!(
        violations.is_empty(),
        "modules naming a later stage:\n{}",
        violations.join("\n")
    );
}

#[test]
fn the_checker_sees_groups_and_paths() {
    let named = crate_modules_named(
        "use crate::{capture::x, model::{A, B}, export};\nlet a = crate::correlate::f(); // crate::diagnose\n",
    );
    assert_eq!(named, ["capture", "model", "export", "correlate"]);
    let source = "use crate::model;\n#[cfg(test)]\nmod tests {\n    use crate::export;\n}\n\
                  #[cfg(test)]\nfn helper() { let _ = crate::diagnose::f(); }\n#[cfg(test)]\nmod t;\n";
    assert_eq!(crate_modules_named(&production_source(source)), ["model"]);
}
