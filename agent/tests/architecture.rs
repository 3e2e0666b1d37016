//! The one-way pipeline, checked: a module of the agent library may name only modules of its own
//! stage or of earlier ones, through `crate::` or through `super::` chains that reach the crate
//! root; lib.rs may not bring a stage's items into the root (`crate::X` would bypass the check).
//! Test code is exempt (items marked `#[cfg(test)]`, and files that are modules only through a
//! `#[cfg(test)] mod`): a test may drive any stage. Comments and string literals are stripped
//! before anything is read.
// A test: a source tree it cannot read is a failure, so it may panic.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::{
    collections::BTreeSet,
    fs,
    path::{Path, PathBuf},
};

/// The library's top-level modules, in the order data flows through them. Engines are plugins
/// that feed correlate: they may use capture and identity; correlate, diagnose and export may use
/// them. The model and the decoders come first of all; they are crates of their own
/// (`inferscope-model`, `inferscope-decode`), so Cargo already keeps them from naming the agent.
const STAGES: &[&str] = &[
    "capture",
    "identity",
    "engines",
    "correlate",
    "diagnose",
    "export",
    "pipeline",
    "daemon",
    "cli",
];

fn rank(module: &str) -> Option<usize> {
    STAGES.iter().position(|s| *s == module)
}

/// `text` without comments, and with string, byte-string and char literals emptied (`""`,
/// `' '`); newlines are kept.
fn strip_comments_and_strings(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    while i < b.len() {
        let c = b[i];
        let next = b.get(i + 1).copied();
        if c == b'/' && next == Some(b'/') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if c == b'/' && next == Some(b'*') {
            // Block comments nest.
            let mut depth = 0usize;
            while i < b.len() {
                if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                    depth += 1;
                    i += 2;
                } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    if b[i] == b'\n' {
                        out.push('\n');
                    }
                    i += 1;
                }
            }
            out.push(' ');
        } else if let Some(len) = raw_string_len(&b[i..]).filter(|_| i == 0 || !ident(b[i - 1])) {
            out.push_str(" \"\"");
            out.extend(b[i..i + len].iter().filter(|c| **c == b'\n').map(|_| '\n'));
            i += len;
        } else if c == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\n' {
                    out.push('\n');
                }
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if c == b'\'' {
            // A char literal ('x', '\n', '\u{..}'), else a lifetime or label ('a).
            let rest = &b[i + 1..];
            let len = if rest.first() == Some(&b'\\') {
                // The escaped character, then up to the closing quote (`\u{…}` is longer).
                rest.iter().skip(2).position(|c| *c == b'\'').map(|p| p + 2)
            } else {
                let ch = text[i + 1..].chars().next().map_or(1, char::len_utf8);
                (rest.get(ch) == Some(&b'\'')).then_some(ch)
            };
            match len {
                Some(len) => {
                    out.push_str("' '");
                    i += len + 2;
                }
                None => {
                    out.push('\'');
                    i += 1;
                }
            }
        } else {
            // Copied whole: a multi-byte character is never split.
            let ch = text[i..].chars().next().map_or(1, char::len_utf8);
            out.push_str(&text[i..i + ch]);
            i += ch;
        }
    }
    out
}

/// Length of a raw (byte) string literal at the start of `b`: `r"…"`, `r#"…"#`, `br"…"`.
fn raw_string_len(b: &[u8]) -> Option<usize> {
    let start = if b.starts_with(b"br") {
        2
    } else if b.starts_with(b"r") {
        1
    } else {
        return None;
    };
    let hashes = b[start..].iter().take_while(|c| **c == b'#').count();
    if b.get(start + hashes) != Some(&b'"') {
        return None;
    }
    let body = start + hashes + 1;
    let mut close = vec![b'"'];
    close.extend(std::iter::repeat_n(b'#', hashes));
    b[body..]
        .windows(close.len())
        .position(|w| w == close.as_slice())
        .map(|p| body + p + close.len())
}

/// The non-test code of stripped source: without the items marked `#[cfg(test)]`.
fn production_source(code: &str) -> String {
    let mut out = String::with_capacity(code.len());
    let mut rest = code;
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

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Ident(String),
    Path, // ::
    Punct(char),
}

fn tokens(code: &str) -> Vec<Token> {
    let mut out = Vec::new();
    let mut chars = code.char_indices().peekable();
    while let Some((_, c)) = chars.next() {
        if c.is_alphanumeric() || c == '_' {
            let mut name = c.to_string();
            while let Some((_, n)) = chars
                .peek()
                .copied()
                .filter(|(_, n)| n.is_alphanumeric() || *n == '_')
            {
                name.push(n);
                chars.next();
            }
            out.push(Token::Ident(name));
        } else if c == ':' && chars.peek().is_some_and(|(_, n)| *n == ':') {
            chars.next();
            out.push(Token::Path);
        } else if !c.is_whitespace() {
            out.push(Token::Punct(c));
        }
    }
    out
}

/// What one file's production code names and declares.
#[derive(Debug, Default, PartialEq)]
struct Scan {
    /// Top-level modules named by paths that reach the crate root (`*` for a glob of the root).
    named: Vec<String>,
    /// Out-of-line `mod x;` declarations, as paths of inline modules ending in the name.
    mods: Vec<Vec<String>>,
    /// Stages (or `*`) whose items lib.rs's own `use` declarations bring into the root.
    used_from_root: Vec<String>,
}

fn ident(t: Option<&Token>) -> Option<&str> {
    match t {
        Some(Token::Ident(s)) => Some(s),
        _ => None,
    }
}

/// The first segments of a path tail at `at`: one name, or the items of a `{…}` group.
fn heads(t: &[Token], at: usize) -> Vec<String> {
    match t.get(at) {
        Some(Token::Ident(name)) if name != "self" => vec![name.clone()],
        Some(Token::Punct('*')) => vec!["*".to_owned()],
        Some(Token::Punct('{')) => {
            let mut out = Vec::new();
            let mut depth = 0usize;
            let mut first = true;
            for token in &t[at + 1..] {
                match token {
                    Token::Punct('{') => depth += 1,
                    Token::Punct('}') if depth == 0 => break,
                    Token::Punct('}') => depth -= 1,
                    Token::Punct(',') if depth == 0 => first = true,
                    Token::Ident(name) if first && depth == 0 => {
                        if name != "self" {
                            out.push(name.clone());
                        }
                        first = false;
                    }
                    Token::Punct('*') if first && depth == 0 => {
                        out.push("*".to_owned());
                        first = false;
                    }
                    _ if depth == 0 => first = false,
                    _ => {}
                }
            }
            out
        }
        _ => Vec::new(),
    }
}

/// Scans production code of a module `depth` levels below the crate root (0: lib.rs).
fn scan(code: &str, depth: usize) -> Scan {
    let t = tokens(code);
    let mut scan = Scan::default();
    // Open braces: Some(name) for an inline `mod name {`.
    let mut braces: Vec<Option<String>> = Vec::new();
    let mut i = 0;
    while i < t.len() {
        let inline: Vec<String> = braces.iter().flatten().cloned().collect();
        let here = depth + inline.len();
        let prev = i.checked_sub(1).and_then(|p| t.get(p));
        match &t[i] {
            Token::Punct('{') => braces.push(None),
            Token::Punct('}') => {
                braces.pop();
            }
            Token::Ident(kw) if kw == "mod" => {
                if let Some(name) = ident(t.get(i + 1)) {
                    match t.get(i + 2) {
                        Some(Token::Punct(';')) => {
                            let mut path = inline.clone();
                            path.push(name.to_owned());
                            scan.mods.push(path);
                            i += 3;
                            continue;
                        }
                        Some(Token::Punct('{')) => {
                            braces.push(Some(name.to_owned()));
                            i += 3;
                            continue;
                        }
                        _ => {}
                    }
                }
            }
            // A path's start: not the tail of another path.
            Token::Ident(kw)
                if (kw == "crate" || kw == "super" || kw == "self")
                    && t.get(i + 1) == Some(&Token::Path)
                    && prev != Some(&Token::Path) =>
            {
                let mut at = i;
                let mut up = 0usize;
                let mut root = false;
                loop {
                    match ident(t.get(at)) {
                        Some("crate") if at == i => root = true,
                        Some("super") => up += 1,
                        Some("self") => {}
                        _ => break,
                    }
                    if t.get(at + 1) != Some(&Token::Path) {
                        break;
                    }
                    at += 2;
                }
                if root || up >= here {
                    scan.named.extend(heads(&t, at));
                }
                i = at;
                continue;
            }
            Token::Ident(kw) if kw == "use" && depth == 0 && braces.is_empty() => {
                let at = i + 1;
                let at = if t.get(at) == Some(&Token::Path) {
                    at + 1
                } else {
                    at
                };
                let at = match ident(t.get(at)) {
                    Some("crate" | "self") if t.get(at + 1) == Some(&Token::Path) => at + 2,
                    _ => at,
                };
                scan.used_from_root.extend(
                    heads(&t, at)
                        .into_iter()
                        .filter(|m| m == "*" || rank(m).is_some()),
                );
            }
            _ => {}
        }
        i += 1;
    }
    scan
}

/// The stripped production code of a file.
fn production(text: &str) -> String {
    production_source(&strip_comments_and_strings(text))
}

/// Where `mod path;` declared in `file` lives: next to lib.rs and mod.rs, else in the folder named
/// after the file.
fn module_file(file: &Path, path: &[String]) -> Option<PathBuf> {
    let stem = file.file_stem()?.to_str()?;
    let mut dir = file.parent()?.to_path_buf();
    if stem != "lib" && stem != "mod" {
        dir.push(stem);
    }
    let (name, inline) = path.split_last()?;
    for m in inline {
        dir.push(m);
    }
    [
        dir.join(format!("{name}.rs")),
        dir.join(name).join("mod.rs"),
    ]
    .into_iter()
    .find(|p| p.is_file())
}

/// What the library's production modules name that they may not; every library file found from
/// lib.rs through its non-test `mod` declarations. `src` holds lib.rs.
fn violations(src: &Path) -> (Vec<String>, BTreeSet<PathBuf>) {
    let mut found = Vec::new();
    let mut reached = BTreeSet::new();
    let mut queue = vec![(src.join("lib.rs"), 0usize, None::<usize>)];
    while let Some((file, depth, own)) = queue.pop() {
        if !reached.insert(file.clone()) {
            continue;
        }
        let name = file
            .strip_prefix(src)
            .unwrap_or(&file)
            .to_string_lossy()
            .into_owned();
        let text = fs::read_to_string(&file).expect("reading a source file");
        let scan = scan(&production(&text), depth);
        for module in &scan.named {
            if module == "*" {
                found.push(format!("{name} globs the crate root"));
            } else if let (Some(own), Some(theirs)) = (own, rank(module))
                && theirs > own
            {
                found.push(format!("{name} ({}) names crate::{module}", STAGES[own]));
            }
        }
        if depth == 0 {
            for module in &scan.used_from_root {
                if module == "*" || rank(module).is_some() {
                    found.push(format!(
                        "{name} brings {module}'s items into the crate root"
                    ));
                }
            }
        }
        for path in &scan.mods {
            match module_file(&file, path) {
                Some(child) => {
                    let stage = if depth == 0 { rank(&path[0]) } else { own };
                    if depth == 0 && stage.is_none() {
                        found.push(format!("{name} declares mod {}, not a stage", path[0]));
                    }
                    queue.push((child, depth + path.len(), stage));
                }
                None => found.push(format!("{name}: no file for mod {}", path.join("::"))),
            }
        }
    }
    found.sort();
    found.dedup();
    (found, reached)
}

fn visit(dir: &Path, files: &mut Vec<PathBuf>) {
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
    let (violations, reached) = violations(&src);
    assert!(
        reached.len() > 100,
        "only {} files checked: is src/ where it was?",
        reached.len()
    );
    assert!(
        violations.is_empty(),
        "modules naming a later stage:\n{}",
        violations.join("\n")
    );
    // Every library file is checked, or is test code: a module only behind `#[cfg(test)] mod`
    // (or under one). main.rs is the binary.
    let mut files = Vec::new();
    visit(&src, &mut files);
    let mut tests = BTreeSet::new();
    for file in &reached {
        let text = fs::read_to_string(file).expect("reading a source file");
        let all = scan(&strip_comments_and_strings(&text), 1).mods;
        let production = scan(&production(&text), 1).mods;
        for path in all.iter().filter(|p| !production.contains(p)) {
            if let Some(child) = module_file(file, path) {
                tests.insert(child);
            }
        }
    }
    let unchecked: Vec<String> = files
        .iter()
        .filter(|f| !reached.contains(*f))
        .filter(|f| !tests.iter().any(|t| *f == t || under_module_of(f, t)))
        .map(|f| {
            f.strip_prefix(&src)
                .unwrap_or(f)
                .to_string_lossy()
                .into_owned()
        })
        .filter(|n| n != "main.rs")
        .collect();
    assert!(
        unchecked.is_empty(),
        "library files neither checked nor test-only:\n{}",
        unchecked.join("\n")
    );
}

/// Whether `file` is a submodule of the module file `module` (in its folder).
fn under_module_of(file: &Path, module: &Path) -> bool {
    let dir = match module.file_name().and_then(|n| n.to_str()) {
        Some("mod.rs") => module.parent().map(Path::to_path_buf),
        _ => module
            .parent()
            .zip(module.file_stem())
            .map(|(p, s)| p.join(s)),
    };
    dir.is_some_and(|d| file.starts_with(d))
}

// The checker's own checks: snippets it must flag, and snippets it must pass.

fn named(source: &str, depth: usize) -> Vec<String> {
    scan(&production(source), depth).named
}

#[test]
fn the_checker_sees_groups_and_paths() {
    let got = named(
        "use crate::{capture::x, model::{A, B}, export};\nlet a = crate::correlate::f(); // crate::diagnose\n",
        2,
    );
    assert_eq!(got, ["capture", "model", "export", "correlate"]);
    let source = "use crate::model;\n#[cfg(test)]\nmod tests {\n    use crate::export;\n}\n\
                  #[cfg(test)]\nfn helper() { let _ = crate::diagnose::f(); }\n#[cfg(test)]\nmod t;\n";
    assert_eq!(named(source, 1), ["model"]);
    // `crate` inside another path or a visibility is no path to the root.
    assert!(
        named(
            "pub(crate) fn f() { other_crate::export::g(); x::crate_y(); }",
            1
        )
        .is_empty()
    );
}

#[test]
fn the_checker_resolves_super_chains_that_reach_the_root() {
    // capture/gpu/x.rs is three levels down: three `super`s reach the root.
    assert_eq!(named("use super::super::super::export::Y;", 3), ["export"]);
    assert_eq!(
        named("use super::super::super::{export, model};", 3),
        ["export", "model"]
    );
    // Two stay inside capture.
    assert!(named("use super::super::export;", 3).is_empty());
    // capture/mod.rs is one level down.
    assert_eq!(named("use super::daemon::Observer;", 1), ["daemon"]);
    assert_eq!(named("use super::*;", 1), ["*"]);
    // An inline module is one level more.
    assert!(named("mod inner { use super::export; }", 1).is_empty());
    assert_eq!(
        named("mod inner { use super::super::export; }", 1),
        ["export"]
    );
}

#[test]
fn the_checker_ignores_comments_and_strings_only() {
    // A `//` inside a string does not cut the line.
    assert_eq!(
        named("let u = \"http://x\"; let m = crate::export::f();", 1),
        ["export"]
    );
    // Paths inside strings, raw strings, chars and comments are no paths.
    assert!(
        named(
            "let s = \"crate::export\"; let r = r#\"crate::daemon \" \"#; let c = '\"'; /* crate::export /* nested */ crate::daemon */",
            1
        )
        .is_empty()
    );
    assert_eq!(named("let c = '\"'; use crate::export;", 1), ["export"]);
    assert_eq!(
        named(
            "let c = ['\\\\', '\\'', '\\u{1F600}']; use crate::export;",
            1
        ),
        ["export"]
    );
    assert_eq!(
        named("fn f<'a>(x: &'a str) { crate::export::g(x) }", 1),
        ["export"]
    );
    // `#[cfg(test)]` in a comment or a string removes nothing after it.
    assert_eq!(
        named("// #[cfg(test)]\nuse crate::export;\nfn f() {}", 1),
        ["export"]
    );
    assert_eq!(
        named(
            "const S: &str = \"#[cfg(test)]\"; use crate::export; fn f() {}",
            1
        ),
        ["export"]
    );
    // Nor does a brace in a string end a test item early.
    assert!(
        named(
            "#[cfg(test)]\nmod tests { const B: &str = \"}\"; use crate::export; }",
            1
        )
        .is_empty()
    );
}

#[test]
fn the_checker_rejects_stage_items_brought_into_the_root() {
    let root = |s: &str| scan(&production(s), 0).used_from_root;
    assert_eq!(
        root("pub mod export;\npub use export::Exporter;"),
        ["export"]
    );
    assert_eq!(
        root("pub(crate) use crate::{daemon::D, identity};"),
        ["daemon", "identity"]
    );
    assert_eq!(root("use self::pipeline::*;"), ["pipeline"]);
    assert!(root("pub mod export;\npub use std::io;\n#[cfg(test)]\nuse export::X;").is_empty());
    // A `use` inside a function of lib.rs is not at the root.
    assert!(root("fn f() { mod m { use export::X; } }").is_empty());
}

#[test]
fn the_checker_finds_files_through_mod_declarations_only() {
    let dir = std::env::temp_dir().join(format!("inferscope-architecture-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    let write = |path: &str, text: &str| {
        let path = dir.join(path);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, text).unwrap();
    };
    write(
        "lib.rs",
        "pub mod identity;\npub mod capture;\npub mod export;\n",
    );
    write("identity.rs", "");
    write("export/mod.rs", "use crate::capture::X;\nmod otlp;\n");
    write("export/otlp.rs", "");
    // capture/gpu/shim.rs reaches the root with three `super`s and names a later stage.
    write(
        "capture/mod.rs",
        "pub mod gpu;\n#[cfg(test)]\nmod checks;\n",
    );
    write("capture/gpu/mod.rs", "mod shim;\n");
    write(
        "capture/gpu/shim.rs",
        "use super::super::super::export::Y;\n",
    );
    // Test-only by its declaration, whatever its name: not checked.
    write("capture/checks.rs", "use crate::export::Z;\n");
    let (found, reached) = violations(&dir);
    assert_eq!(found, ["capture/gpu/shim.rs (capture) names crate::export"]);
    assert_eq!(reached.len(), 7);
    assert!(!reached.contains(&dir.join("capture/checks.rs")));
    // A file named like a test but declared as production is checked.
    write("capture/mod.rs", "pub mod gpu;\nmod checks_tests;\n");
    write("capture/checks_tests.rs", "use crate::export::Z;\n");
    let (found, _) = violations(&dir);
    assert_eq!(
        found,
        [
            "capture/checks_tests.rs (capture) names crate::export",
            "capture/gpu/shim.rs (capture) names crate::export",
        ]
    );
    let _ = fs::remove_dir_all(&dir);
}
