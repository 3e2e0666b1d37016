//! The one-way pipeline, checked where Cargo cannot: the model and the decoders are crates of
//! their own, so Cargo keeps them from naming the agent; inside the agent library a module may
//! name only modules of its own stage or of earlier ones, through `crate::` or through `super::`
//! chains that reach the crate root, and lib.rs may not bring a stage's items into the root
//! (`crate::X` would bypass the check). Files are parsed with `syn`, so comments and strings
//! are never read as paths; paths inside macro invocations are read from their tokens. Test
//! code is exempt (items marked `#[cfg(test)]`, and files that are modules only through a
//! `#[cfg(test)] mod`): a test may drive any stage.
// A test: a source tree it cannot read is a failure, so it may panic.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::{
    collections::BTreeSet,
    fs,
    path::{Path, PathBuf},
};

use proc_macro2::{Delimiter, TokenStream, TokenTree};
use syn::{Attribute, ImplItem, Item, TraitItem, UseTree, visit::Visit};

/// The library's top-level modules, in the order data flows through them. Engines are plugins
/// that feed correlate: they may use capture and identity; correlate, diagnose and export may use
/// them.
const STAGES: &[&str] = &[
    "capture",
    "identity",
    "engines",
    "correlate",
    "join",
    "diagnose",
    "export",
    "pipeline",
    "daemon",
    "cli",
];

/// The library's narrow public surface for fuzz targets, benchmarks and integration tests
/// (`testing.rs`): no stage, ranked after every stage (it re-exports from them all), named by
/// none.
const SURFACE: &str = "testing";

fn rank(module: &str) -> Option<usize> {
    STAGES
        .iter()
        .position(|s| *s == module)
        .or((module == SURFACE).then_some(STAGES.len()))
}

/// What one file names and declares.
#[derive(Debug, Default, PartialEq)]
struct Scan {
    /// Top-level modules named by paths that reach the crate root (`*` for a glob of the root).
    named: Vec<String>,
    /// Out-of-line `mod x;` declarations, as paths of inline modules ending in the name.
    mods: Vec<Vec<String>>,
    /// Stages (or `*`) whose items lib.rs's own `use` declarations bring into the root.
    used_from_root: Vec<String>,
    /// Every path that starts at `crate`, `super` or `self`, made absolute (from the crate root),
    /// for the graph of which file names which.
    absolute: Vec<Vec<String>>,
}

/// Whether an item is test code: `#[cfg(test)]`.
fn is_test(attrs: &[Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.parse_args::<syn::Path>()
                .is_ok_and(|p| p.is_ident("test"))
    })
}

struct Scanner {
    /// The file's module path below the crate root (empty: lib.rs).
    module: Vec<String>,
    /// Inline `mod name { … }` blocks around the current item.
    inline: Vec<String>,
    /// Whether `#[cfg(test)]` items are read too.
    with_tests: bool,
    scan: Scan,
}

impl Scanner {
    /// A path that starts with `segments` (then, for a `use` group, its several `heads`) names
    /// a top-level module when its `crate`/`super` chain reaches the root.
    fn path(&mut self, segments: &[String], heads: Vec<String>) {
        let here = self.module.len() + self.inline.len();
        let mut up = 0usize;
        let mut root = false;
        let mut at = 0;
        while let Some(s) = segments.get(at) {
            match s.as_str() {
                "crate" if at == 0 => root = true,
                "super" => up += 1,
                "self" => {}
                _ => break,
            }
            at += 1;
        }
        if at == 0 {
            return;
        }
        if root || up <= here {
            let mut base: Vec<String> = if root {
                Vec::new()
            } else {
                self.module.iter().chain(&self.inline).cloned().collect()
            };
            base.truncate(base.len().saturating_sub(if root { 0 } else { up }));
            let rest = &segments[at..];
            if rest.is_empty() {
                for head in heads.iter().filter(|h| *h != "*") {
                    self.scan
                        .absolute
                        .push([base.clone(), vec![head.clone()]].concat());
                }
            } else {
                self.scan.absolute.push([base, rest.to_vec()].concat());
            }
        }
        if root || up >= here {
            let names = match segments.get(at) {
                Some(head) => vec![head.clone()],
                None => heads,
            };
            for name in names {
                if !self.scan.named.contains(&name) {
                    self.scan.named.push(name);
                }
            }
        }
    }

    /// Each path of a `use` tree: its leading segments and, where it ends in a group or glob,
    /// the first names under it.
    fn use_tree(&mut self, tree: &UseTree, prefix: &mut Vec<String>) {
        match tree {
            UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(&p.tree, prefix);
                prefix.pop();
            }
            UseTree::Name(n) => self.use_leaf(prefix, n.ident.to_string()),
            UseTree::Rename(r) => self.use_leaf(prefix, r.ident.to_string()),
            UseTree::Glob(_) => self.use_leaf(prefix, "*".to_owned()),
            UseTree::Group(g) => {
                for tree in &g.items {
                    self.use_tree(tree, prefix);
                }
            }
        }
    }

    fn use_leaf(&mut self, prefix: &[String], leaf: String) {
        let mut segments = prefix.to_vec();
        if leaf != "self" {
            segments.push(leaf.clone());
        }
        self.path(&segments, Vec::new());
    }

    /// Paths in a macro's tokens: `crate`, `super` or `self` followed by `::`, not itself the
    /// tail of another path.
    fn tokens(&mut self, tokens: TokenStream) {
        let tokens: Vec<TokenTree> = tokens.into_iter().collect();
        let separator = |i: usize| {
            matches!((tokens.get(i), tokens.get(i + 1)),
                (Some(TokenTree::Punct(a)), Some(TokenTree::Punct(b)))
                    if a.as_char() == ':' && b.as_char() == ':')
        };
        let mut i = 0;
        while i < tokens.len() {
            match &tokens[i] {
                TokenTree::Group(g) => self.tokens(g.stream()),
                TokenTree::Ident(id)
                    if ["crate", "super", "self"].contains(&id.to_string().as_str())
                        && separator(i + 1)
                        && !(i >= 2 && separator(i - 2)) =>
                {
                    let mut segments = vec![id.to_string()];
                    let mut heads = Vec::new();
                    let mut at = i + 1;
                    while separator(at) {
                        let next = tokens.get(at + 2);
                        at += 3;
                        match next {
                            Some(TokenTree::Ident(next)) => segments.push(next.to_string()),
                            Some(TokenTree::Group(g)) if g.delimiter() == Delimiter::Brace => {
                                heads = group_heads(g.stream());
                                break;
                            }
                            Some(TokenTree::Punct(p)) if p.as_char() == '*' => {
                                heads = vec!["*".to_owned()];
                                break;
                            }
                            _ => {}
                        }
                    }
                    self.path(&segments, heads);
                    i = at;
                    continue;
                }
                _ => {}
            }
            i += 1;
        }
    }
}

impl<'ast> Visit<'ast> for Scanner {
    fn visit_item(&mut self, item: &'ast Item) {
        let attrs = match item {
            Item::Mod(m) => &m.attrs,
            Item::Use(u) => &u.attrs,
            Item::Fn(f) => &f.attrs,
            Item::Impl(i) => &i.attrs,
            Item::Const(c) => &c.attrs,
            Item::Static(s) => &s.attrs,
            Item::Struct(s) => &s.attrs,
            Item::Enum(e) => &e.attrs,
            Item::Trait(t) => &t.attrs,
            Item::Type(t) => &t.attrs,
            Item::Macro(m) => &m.attrs,
            _ => return syn::visit::visit_item(self, item),
        };
        if !self.with_tests && is_test(attrs) {
            return;
        }
        match item {
            Item::Mod(m) => {
                let name = m.ident.to_string();
                match &m.content {
                    None => {
                        let mut path = self.inline.clone();
                        path.push(name);
                        self.scan.mods.push(path);
                    }
                    Some((_, items)) => {
                        self.inline.push(name);
                        for item in items {
                            self.visit_item(item);
                        }
                        self.inline.pop();
                    }
                }
            }
            Item::Use(u) => self.use_tree(&u.tree, &mut Vec::new()),
            _ => syn::visit::visit_item(self, item),
        }
    }

    fn visit_impl_item(&mut self, item: &'ast ImplItem) {
        let test = match item {
            ImplItem::Fn(f) => is_test(&f.attrs),
            ImplItem::Const(c) => is_test(&c.attrs),
            ImplItem::Type(t) => is_test(&t.attrs),
            _ => false,
        };
        if self.with_tests || !test {
            syn::visit::visit_impl_item(self, item);
        }
    }

    fn visit_trait_item(&mut self, item: &'ast TraitItem) {
        let test = match item {
            TraitItem::Fn(f) => is_test(&f.attrs),
            _ => false,
        };
        if self.with_tests || !test {
            syn::visit::visit_trait_item(self, item);
        }
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        if path.leading_colon.is_none() {
            let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
            self.path(&segments, Vec::new());
        }
        syn::visit::visit_path(self, path);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        self.tokens(mac.tokens.clone());
        syn::visit::visit_macro(self, mac);
    }
}

/// The first names a `use` of lib.rs brings into the root: past a leading `crate::` or
/// `self::`, the path's first segment, or each of a group's.
fn root_uses(tree: &UseTree, out: &mut Vec<String>) {
    match tree {
        UseTree::Path(p) if p.ident == "crate" || p.ident == "self" => root_uses(&p.tree, out),
        UseTree::Group(g) => g.items.iter().for_each(|t| first_name(t, out)),
        tree => first_name(tree, out),
    }
}

fn first_name(tree: &UseTree, out: &mut Vec<String>) {
    match tree {
        UseTree::Path(p) => out.push(p.ident.to_string()),
        UseTree::Name(n) if n.ident != "self" => out.push(n.ident.to_string()),
        UseTree::Rename(r) => out.push(r.ident.to_string()),
        UseTree::Glob(_) => out.push("*".to_owned()),
        _ => {}
    }
}

/// The first name of each item of a `{…}` group in a macro's tokens (`*` for a glob).
fn group_heads(tokens: TokenStream) -> Vec<String> {
    let mut heads = Vec::new();
    let mut first = true;
    for token in tokens {
        match &token {
            TokenTree::Punct(p) if p.as_char() == ',' => first = true,
            TokenTree::Ident(name) if first => {
                if name != "self" {
                    heads.push(name.to_string());
                }
                first = false;
            }
            TokenTree::Punct(p) if first && p.as_char() == '*' => {
                heads.push("*".to_owned());
                first = false;
            }
            _ => first = false,
        }
    }
    heads
}

/// Scans the code of a module `depth` levels below the crate root (0: lib.rs): its production
/// code, or with `with_tests` its test code too.
fn scan(code: &str, depth: usize, with_tests: bool) -> Scan {
    scan_module(code, &vec![String::from("m"); depth], with_tests)
}

/// Scans the code of the module at `module` below the crate root.
fn scan_module(code: &str, module: &[String], with_tests: bool) -> Scan {
    let depth = module.len();
    let file = syn::parse_file(code).expect("a source file that parses");
    let mut scanner = Scanner {
        module: module.to_vec(),
        inline: Vec::new(),
        with_tests,
        scan: Scan::default(),
    };
    scanner.visit_file(&file);
    if depth == 0 {
        // lib.rs's own `use` declarations (not those inside its functions or modules).
        for item in &file.items {
            if let Item::Use(u) = item
                && (with_tests || !is_test(&u.attrs))
            {
                let mut leaves = Vec::new();
                root_uses(&u.tree, &mut leaves);
                scanner
                    .scan
                    .used_from_root
                    .extend(leaves.into_iter().filter(|m| m == "*" || rank(m).is_some()));
            }
        }
    }
    scanner.scan
}

/// Where `mod path;` declared in `file` lives: next to lib.rs and mod.rs, else in the folder named
/// after the file.
fn module_file(file: &Path, path: &[String]) -> Option<PathBuf> {
    let stem = file.file_stem()?.to_str()?;
    let mut dir = file.parent()?.to_path_buf();
    if !["lib", "main", "mod"].contains(&stem) {
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
        let scan = scan(&text, depth, false);
        for module in &scan.named {
            if module == "*" {
                found.push(format!("{name} globs the crate root"));
            } else if let (Some(own), Some(theirs)) = (own, rank(module))
                && theirs > own
            {
                let stage = STAGES.get(own).copied().unwrap_or(SURFACE);
                found.push(format!("{name} ({stage}) names crate::{module}"));
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

/// The production modules of a crate, found from its root file (lib.rs or main.rs) through
/// non-test `mod` declarations: each module path with its file and what it names.
fn crate_modules(root: &Path) -> Vec<(Vec<String>, Scan)> {
    let mut modules = Vec::new();
    let mut queue = vec![(root.to_path_buf(), Vec::<String>::new())];
    while let Some((file, module)) = queue.pop() {
        let text = fs::read_to_string(&file).expect("reading a source file");
        let scan = scan_module(&text, &module, false);
        for path in &scan.mods {
            if let Some(child) = module_file(&file, path) {
                queue.push((child, [module.clone(), path.clone()].concat()));
            }
        }
        modules.push((module, scan));
    }
    modules
}

/// The circles of the graph of which module names which: each named path goes to the deepest
/// module file it reaches; naming a module's own ancestors (its room's front door, `super::X`)
/// is no edge, since a parent holds its children. Each circle as `a → b → … → a`.
fn circles(modules: &[(Vec<String>, Scan)]) -> Vec<String> {
    let names: Vec<String> = modules
        .iter()
        .map(|(m, _)| {
            if m.is_empty() {
                "(root)".into()
            } else {
                m.join("::")
            }
        })
        .collect();
    let index = |path: &[String]| {
        (0..=path.len())
            .rev()
            .find_map(|n| modules.iter().position(|(m, _)| m.as_slice() == &path[..n]))
    };
    let edges: Vec<BTreeSet<usize>> = modules
        .iter()
        .map(|(module, scan)| {
            scan.absolute
                .iter()
                .filter_map(|path| index(path))
                .filter(|&to| !module.starts_with(&modules[to].0))
                .collect()
        })
        .collect();
    // Tarjan's strongly connected components; a component of two or more modules is a circle.
    struct Walk<'a> {
        edges: &'a [BTreeSet<usize>],
        order: Vec<Option<usize>>,
        low: Vec<usize>,
        stack: Vec<usize>,
        on_stack: Vec<bool>,
        next: usize,
        found: Vec<Vec<usize>>,
    }
    fn strong(w: &mut Walk<'_>, v: usize) {
        w.order[v] = Some(w.next);
        w.low[v] = w.next;
        w.next += 1;
        w.stack.push(v);
        w.on_stack[v] = true;
        for &to in &w.edges[v] {
            match w.order[to] {
                None => {
                    strong(w, to);
                    w.low[v] = w.low[v].min(w.low[to]);
                }
                Some(order) if w.on_stack[to] => w.low[v] = w.low[v].min(order),
                Some(_) => {}
            }
        }
        if Some(w.low[v]) == w.order[v] {
            let mut component = Vec::new();
            while let Some(top) = w.stack.pop() {
                w.on_stack[top] = false;
                component.push(top);
                if top == v {
                    break;
                }
            }
            if component.len() > 1 {
                w.found.push(component);
            }
        }
    }
    let mut walk = Walk {
        edges: &edges,
        order: vec![None; modules.len()],
        low: vec![0; modules.len()],
        stack: Vec::new(),
        on_stack: vec![false; modules.len()],
        next: 0,
        found: Vec::new(),
    };
    for v in 0..modules.len() {
        if walk.order[v].is_none() {
            strong(&mut walk, v);
        }
    }
    let mut found: Vec<String> = walk
        .found
        .iter()
        .map(|component| {
            let mut members: Vec<&str> = component.iter().map(|&i| names[i].as_str()).collect();
            members.sort_unstable();
            format!("{{{}}}", members.join(", "))
        })
        .collect();
    found.sort();
    found
}

#[test]
fn no_module_circles_in_any_crate() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut found = Vec::new();
    for root in [
        "agent/src/lib.rs",
        "model/src/lib.rs",
        "decode/src/lib.rs",
        "ebpf/common/src/lib.rs",
        "ebpf/probes/src/main.rs",
        "cupti-shim/src/lib.rs",
    ] {
        let modules = crate_modules(&workspace.join(root));
        assert!(!modules.is_empty(), "{root}: no modules found");
        for circle in circles(&modules) {
            found.push(format!("{root}: {circle}"));
        }
    }
    assert!(
        found.is_empty(),
        "modules that name each other in a circle (move the shared types down a level):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_checker_finds_circles_but_not_parents() {
    let module = |path: &str, code: &str| {
        let path: Vec<String> = path
            .split('/')
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect();
        let scan = scan_module(code, &path, false);
        (path, scan)
    };
    let modules = [
        module("", "mod capture;"),
        module("capture", "pub use kernel::X; mod kernel; mod gpu;"),
        module("capture/kernel", "use super::gpu::L; use super::Config;"),
        module("capture/gpu", "use crate::capture::{kernel::records, Y};"),
    ];
    assert_eq!(circles(&modules), ["{capture::gpu, capture::kernel}"]);
    // Naming the parent (the room's door) is no circle.
    let modules = [
        module("", "mod capture;"),
        module("capture", "pub use kernel::X; mod kernel;"),
        module(
            "capture/kernel",
            "use super::Config; use crate::capture::Y;",
        ),
    ];
    assert!(circles(&modules).is_empty());
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
        let all = scan(&text, 1, true).mods;
        let production = scan(&text, 1, false).mods;
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
    scan(source, depth, false).named
}

#[test]
fn the_checker_sees_groups_and_paths() {
    let got = named(
        "use crate::{capture::x, model::{A, B}, export};\nfn f() { let a = crate::correlate::f(); } // crate::diagnose\n",
        2,
    );
    assert_eq!(got, ["capture", "model", "export", "correlate"]);
    let source = "use crate::model;\n#[cfg(test)]\nmod tests {\n    use crate::export;\n}\n\
                  #[cfg(test)]\nfn helper() { let _ = crate::diagnose::f(); }\n#[cfg(test)]\nmod t;\n\
                  struct S;\nimpl S {\n    #[cfg(test)]\n    fn probe() { crate::daemon::g(); }\n}\n";
    assert_eq!(named(source, 1), ["model"]);
    // Types, patterns and macro arguments are paths too.
    assert_eq!(
        named(
            "fn f(x: crate::export::X) { tracing::info!(\"{}\", crate::daemon::NAME); }",
            1
        ),
        ["export", "daemon"]
    );
    assert_eq!(
        named(
            "fn f() { m!(crate::{export::X, daemon}); m!(super::*); }",
            1
        ),
        ["export", "daemon", "*"]
    );
    // `crate` inside another path or a visibility is no path to the root.
    assert!(
        named(
            "pub(crate) fn f() { other_crate::export::g(); x::crate_y(); m!(a::crate::export); }",
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
fn the_checker_reads_code_not_comments_or_strings() {
    assert!(
        named(
            "const S: &str = \"crate::export\"; const R: &str = r#\"crate::daemon \" \"#; /* crate::export /* nested */ crate::daemon */",
            1
        )
        .is_empty()
    );
    // `#[cfg(test)]` in a comment or a string exempts nothing.
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
}

#[test]
fn the_checker_rejects_stage_items_brought_into_the_root() {
    let root = |s: &str| scan(s, 0, false).used_from_root;
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
    assert!(root("fn f() { use export::X; mod m { use export::Y; } }").is_empty());
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

/// The stages the architecture page's two pictures name, in their order: the stage list under
/// "Crates and stages" (every `name/` line of the agent crate's block), and the record's path
/// (the first line of the block after the `record-path` marker: the stage names on it, left to
/// right).
fn drawn_stages(page: &str) -> (Vec<String>, Vec<String>) {
    let list: Vec<String> = page
        .lines()
        .skip_while(|l| !l.contains("crate inferscope (agent/src/)"))
        .skip(1)
        .take_while(|l| !l.starts_with("```"))
        .filter_map(|l| {
            let word = l.trim_start_matches([' ', '│']).split_whitespace().next()?;
            let name = word.strip_suffix('/')?;
            name.chars()
                .all(|c| c.is_ascii_lowercase() || c == '_')
                .then(|| name.to_string())
        })
        .collect();
    let path_line = page
        .lines()
        .skip_while(|l| !l.contains("<!-- record-path"))
        .skip_while(|l| !l.starts_with("```"))
        .nth(1)
        .unwrap_or_default();
    let path: Vec<String> = path_line
        .split(|c: char| !c.is_ascii_lowercase())
        .filter(|w| rank(w).is_some())
        .map(str::to_string)
        .collect();
    (list, path)
}

/// Backticked paths of the page's record-path section that name a source file or folder
/// (`pipeline/ring.rs`, `daemon/sinks/`): relative to agent/src, or to the workspace.
fn drawn_files(page: &str) -> Vec<String> {
    let section: String = page
        .lines()
        .skip_while(|l| !l.starts_with("## One record's path"))
        .skip(1)
        .take_while(|l| !l.starts_with("## "))
        .collect::<Vec<_>>()
        .join("\n");
    section
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|s| (s.ends_with(".rs") || s.ends_with('/')) && !s.contains(' '))
        .map(str::to_string)
        .collect()
}

#[test]
fn the_architecture_page_draws_the_stages_that_exist_in_order() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let page = fs::read_to_string(workspace.join("docs/src/architecture.md")).unwrap();
    let (list, path) = drawn_stages(&page);
    assert_eq!(
        list, STAGES,
        "docs/src/architecture.md's stage list must name the agent's stages in the order data flows (tests/architecture.rs STAGES)"
    );
    let src = workspace.join("agent/src");
    let lib = fs::read_to_string(src.join("lib.rs")).unwrap();
    for stage in STAGES {
        assert!(
            src.join(stage).join("mod.rs").is_file() || src.join(format!("{stage}.rs")).is_file(),
            "stage {stage} has no module"
        );
        assert!(
            lib.lines()
                .any(|l| l.trim_end_matches(';').ends_with(&format!("mod {stage}"))),
            "lib.rs does not declare stage {stage}"
        );
    }
    assert!(
        path.len() >= 4,
        "the record's path names too few stages: {path:?}"
    );
    let ranks: Vec<usize> = path.iter().filter_map(|s| rank(s)).collect();
    assert!(
        ranks.windows(2).all(|w| w[0] < w[1]),
        "the record's path must name each stage once, in STAGES order: {path:?}"
    );
    for file in drawn_files(&page) {
        assert!(
            src.join(&file).exists() || workspace.join(&file).exists(),
            "docs/src/architecture.md names {file}, which does not exist"
        );
    }
}

#[test]
fn the_page_checker_reads_both_pictures() {
    let page = "## Crates and stages\n```\n  crate inferscope (agent/src/), stages:\n        capture/    a\n        │           · b\n        join/       c\n```\n## One record's path\n<!-- record-path -->\n```text\n kernel ──▶ capture ──X──▶ join ──▶ export\n (ebpf/)\n```\nsee `pipeline/ring.rs` and `not a path.rs`\n## Next\n`ignored.rs`\n";
    let (list, path) = drawn_stages(page);
    assert_eq!(list, ["capture", "join"]);
    assert_eq!(path, ["capture", "join", "export"]);
    assert_eq!(drawn_files(page), ["pipeline/ring.rs"]);
}
