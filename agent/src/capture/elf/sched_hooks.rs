//! Attaches an engine's scheduler uprobes to one process: finds the mapped file that holds each
//! hooked function, resolves it by name, and attaches the engine's kernel program there. A hook
//! that cannot be found (stripped or unknown build, or a library not loaded yet) is reported with
//! what is lost without it; the socket layer keeps working either way, and hooks whose function
//! was not found are tried again when the process maps new engine objects (see `late_attach`).
use std::path::{Path, PathBuf};

use rustc_hash::FxHashMap;
use tracing::{debug, info, warn};

use crate::capture::{
    SocketProbes,
    elf::{dwarf, symbols::ElfSymbols},
    process::procfs,
};

/// What one attach pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct HookOutcome {
    pub live: usize,
    /// Indices (in the engine's hook list) of hooks whose function was not found: worth trying
    /// again once the process maps more of the engine.
    pub not_found: Vec<usize>,
}

/// A scheduler function to hook with one of the kernel's engine uprobe programs.
#[derive(Debug, Clone, Copy)]
pub struct SchedulerHook {
    /// eBPF program name (ebpf/probes/src/engines/).
    pub program: &'static str,
    /// Demangled name or full signature (see `capture::elf::symbols`).
    pub symbol: &'static str,
    /// What is lost without it, for the warning when it cannot be attached.
    pub gives: &'static str,
    /// Runs for every generated token: attached only when the user asks (`--token-hooks`),
    /// since each hit costs the engine thread a uprobe trap.
    pub per_token: bool,
}

/// A struct member the engine's hook programs read, whose offset depends on the build.
#[derive(Debug, Clone, Copy)]
pub struct StructMember {
    pub structure: &'static str,
    pub member: &'static str,
    /// Where the member sits when the build carries no DWARF to say (from the source).
    pub assumed_offset: u32,
}

/// The members the hook programs read, located in the build's DWARF and handed to the programs
/// in their attach cookie: member `i` in bits `32 * i` (two at most).
#[derive(Debug, Clone, Copy)]
pub struct HookLayout {
    pub members: &'static [StructMember],
    /// Only compilation units whose name contains this are searched (debug info is large).
    pub unit_hint: &'static str,
}

/// What an engine plugin asks capture to hook in its processes (see `engines::Engine`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct HookSet {
    pub hooks: &'static [SchedulerHook],
    /// Which mapped files (by file-name substring) hold those functions.
    pub objects: &'static [&'static str],
    /// Struct members the hook programs read, for engines whose programs read any.
    pub layout: Option<&'static HookLayout>,
}

/// Attaches the hooks in `set` (an engine's) to `tgid`: all of them (`only` None), or those listed, which
/// a retry does quietly (nothing is logged for what is still missing). Per-token hooks only with
/// `token_hooks`.
pub(crate) fn attach(
    probes: &mut SocketProbes,
    tgid: u32,
    set: Option<HookSet>,
    only: Option<&[usize]>,
    token_hooks: bool,
) -> HookOutcome {
    let mut outcome = HookOutcome::default();
    let Some(set) = set else {
        return outcome;
    };
    let hooks = set.hooks;
    if hooks.is_empty() {
        return outcome;
    }
    let retry = only.is_some();
    let objects = engine_objects(tgid, set.objects);
    let mut tables = Vec::new();
    for (path, readable) in &objects {
        match ElfSymbols::load(readable) {
            Ok(table) => {
                if !table.has_symtab() && !retry {
                    warn!(pid = tgid, object = %path, "stripped build: only exported functions can be hooked");
                }
                tables.push((readable.clone(), table));
            }
            Err(e) => warn!(pid = tgid, "cannot read symbols: {e}"),
        }
    }
    // One DWARF reading per object, not per hook.
    let mut cookies: FxHashMap<PathBuf, u64> = FxHashMap::default();
    for (index, hook) in hooks.iter().enumerate() {
        if only.is_some_and(|only| !only.contains(&index)) {
            continue;
        }
        if hook.per_token && !token_hooks {
            if !retry {
                info!(
                    pid = tgid,
                    symbol = hook.symbol,
                    "per-token hook off (--token-hooks turns it on): inferscope uses the socket for {}",
                    hook.gives
                );
            }
            continue;
        }
        let found = tables.iter().find_map(|(path, table)| {
            let symbols = table.resolve(hook.symbol);
            (symbols.len() == 1).then(|| (path, symbols[0].file_offset))
        });
        let Some((path, offset)) = found else {
            outcome.not_found.push(index);
            if retry {
                debug!(
                    pid = tgid,
                    symbol = hook.symbol,
                    "scheduler function still not found"
                );
                continue;
            }
            warn!(
                pid = tgid,
                symbol = hook.symbol,
                "scheduler function not found in {} (stripped or different build); without it inferscope loses {}",
                if objects.is_empty() {
                    "any mapped engine object".to_owned()
                } else {
                    objects
                        .iter()
                        .map(|(p, _)| p.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                },
                hook.gives
            );
            continue;
        };
        let cookie = *cookies
            .entry(path.clone())
            .or_insert_with(|| layout_cookie(set.layout, path, tgid));
        match probes.attach_uprobe(hook.program, path, offset, tgid, cookie) {
            Ok(()) => {
                outcome.live += 1;
                info!(
                    pid = tgid,
                    symbol = hook.symbol,
                    late = retry,
                    "scheduler hook attached"
                );
            }
            Err(e) => warn!(
                pid = tgid,
                symbol = hook.symbol,
                "attaching the scheduler hook failed: {e}; without it inferscope loses {}",
                hook.gives
            ),
        }
    }
    outcome
}

/// Where an engine's hooks would go in one process, without attaching anything (`inferscope
/// check`): the engine objects it maps, and for each hook whether its function resolves there.
#[derive(Debug, Clone, Default)]
pub(crate) struct HookResolution {
    /// Engine objects mapped by the process, as it maps them.
    pub objects: Vec<String>,
    /// Each hook the agent would attach (per-token ones only with `token_hooks`), resolved or not.
    pub hooks: Vec<(SchedulerHook, bool)>,
    /// Objects whose symbols could not be read, with why.
    pub unreadable: Vec<String>,
}

/// Resolves the hooks in `set` in process `tgid` as [`attach`] would, attaching nothing.
pub(crate) fn resolve(tgid: u32, set: HookSet, token_hooks: bool) -> HookResolution {
    let objects = engine_objects(tgid, set.objects);
    let mut resolution = HookResolution::default();
    let mut tables = Vec::new();
    for (path, readable) in &objects {
        match ElfSymbols::load(readable) {
            Ok(table) => tables.push(table),
            Err(e) => resolution.unreadable.push(e.to_string()),
        }
        resolution.objects.push(path.clone());
    }
    for hook in set.hooks.iter().filter(|h| token_hooks || !h.per_token) {
        let found = tables.iter().any(|t| t.resolve(hook.symbol).len() == 1);
        resolution.hooks.push((*hook, found));
    }
    resolution
}

/// Mapped files of `tgid` whose names contain one of `hints`: (path as mapped, path to read).
fn engine_objects(tgid: u32, hints: &[&str]) -> Vec<(String, PathBuf)> {
    procfs::mapped_files(tgid)
        .into_iter()
        .filter(|path| {
            let name = path.rsplit('/').next().unwrap_or(path);
            hints.iter().any(|hint| name.contains(hint))
        })
        .map(|path| {
            // Paths from /proc/PID/maps are in the process's mount namespace: reach them
            // through its root.
            let through_root = PathBuf::from(format!("/proc/{tgid}/root{path}"));
            (path, through_root)
        })
        .collect()
}

/// The attach cookie that tells the engine's programs where the members they read sit in the
/// build in `object`: from its DWARF where it has any, else where the source puts them.
fn layout_cookie(layout: Option<&HookLayout>, object: &Path, tgid: u32) -> u64 {
    let Some(layout) = layout else {
        return 0;
    };
    let offsets = member_offsets(layout, object, tgid);
    offsets
        .iter()
        .take(2)
        .enumerate()
        .fold(0, |cookie, (i, offset)| {
            cookie | (u64::from(*offset) << (32 * i))
        })
}

/// Each member's offset: from DWARF, else the layout's assumption (logged either way, since a
/// wrong offset makes the hooks read wrong ids).
fn member_offsets(layout: &HookLayout, object: &Path, tgid: u32) -> Vec<u32> {
    let wanted: Vec<(&str, &str)> = layout
        .members
        .iter()
        .map(|m| (m.structure, m.member))
        .collect();
    let found = match dwarf::member_offsets(object, &wanted, Some(layout.unit_hint)) {
        Ok(found) => found,
        Err(e) => {
            warn!(
                pid = tgid,
                "reading the engine's debug info failed: {e}; using the struct layout of the source"
            );
            vec![None; wanted.len()]
        }
    };
    layout
        .members
        .iter()
        .zip(found)
        .map(|(member, found)| {
            let from_dwarf = found.and_then(|offset| u32::try_from(offset).ok());
            match from_dwarf {
                Some(offset) => {
                    info!(
                        pid = tgid,
                        structure = member.structure,
                        member = member.member,
                        offset,
                        "struct offset from DWARF"
                    );
                    offset
                }
                None => {
                    info!(
                        pid = tgid,
                        structure = member.structure,
                        member = member.member,
                        offset = member.assumed_offset,
                        "struct offset assumed from the source (no DWARF for it in this build)"
                    );
                    member.assumed_offset
                }
            }
        })
        .collect()
}
