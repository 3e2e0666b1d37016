//! Attaches an engine's scheduler uprobes to one process: finds the mapped file that holds each
//! hooked function, resolves it by name, and attaches the engine's kernel program there. A hook
//! that cannot be found (stripped or unknown build) is reported with what is lost without it;
//! the socket layer keeps working either way.
use std::path::PathBuf;

use tracing::{info, warn};

use super::{SocketProbes, TracedProcess, procfs, symbols::ElfSymbols};
use crate::engines;

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
            Some((path, offset)) => match probes.attach_uprobe(hook.program, path, offset, tgid) {
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
