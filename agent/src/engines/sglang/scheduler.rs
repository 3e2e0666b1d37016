//! Which process runs an SGLang server's GPU kernels: its scheduler, a child of the server
//! (`launch_server`, which runs the TokenizerManager) titled `sglang::scheduler…`. Outputs are
//! seen in the server, the detokenizer or the scheduler itself; the steps they time ran their
//! kernels in the scheduler, so the timeline joins its kernels to them.
use std::time::{Duration, Instant};

use inferscope_model::{Counter, Stats};
use rustc_hash::FxHashMap;

use crate::capture::process::procfs;

/// Processes whose lookups are remembered; beyond this the table starts over.
const MAX_PROCESSES: usize = 1024;
/// How often a process whose scheduler was not found is looked at again.
const LOOKUP_RETRY: Duration = Duration::from_secs(10);

/// Whether a process title is that of a scheduler which sends its batch's outputs: rank 0 of
/// its tensor, expert, context and MoE data parallel groups (`sglang::scheduler`,
/// `sglang::scheduler_DP1_TP0`, …). Data-parallel and pipeline ranks are kept: several such
/// schedulers make the answer ambiguous.
pub(super) fn is_output_scheduler(cmdline: &str) -> bool {
    let Some(title) = cmdline.split(['\0', ' ']).next() else {
        return false;
    };
    let Some(rest) = title.strip_prefix("sglang::scheduler") else {
        return false;
    };
    if rest.is_empty() {
        return true;
    }
    let Some(rest) = rest.strip_prefix('_') else {
        return false;
    };
    // Ranks are `_<NAME><n>`; ATTN_CP and MOE_DP contain an underscore themselves.
    let mut parts = rest.split('_').peekable();
    while let Some(part) = parts.next() {
        let part = if matches!(part, "ATTN" | "MOE") {
            match parts.next() {
                Some(next) => format!("{part}_{next}"),
                None => return false,
            }
        } else {
            part.to_owned()
        };
        let digits = part.trim_start_matches(|c: char| c.is_ascii_uppercase() || c == '_');
        let name = &part[..part.len() - digits.len()];
        let Ok(rank) = digits.parse::<u32>() else {
            return false;
        };
        match name {
            "DP" | "PP" => {}
            "TP" | "EP" | "ATTN_CP" | "MOE_DP" if rank == 0 => {}
            _ => return false,
        }
    }
    true
}

#[derive(Default)]
pub(super) struct Schedulers {
    /// Per process an output was seen in: when its scheduler was looked for, and what was found.
    found: FxHashMap<u32, (Instant, Option<u32>)>,
}

impl Schedulers {
    #[cfg(test)]
    pub(super) fn set(&mut self, seen_in: u32, scheduler: u32) {
        self.found
            .insert(seen_in, (Instant::now(), Some(scheduler)));
    }

    /// The scheduler of the server that process `tgid` belongs to: once, and again every
    /// [`LOOKUP_RETRY`] until found. None when not found or not one (data parallel).
    pub(super) fn of(&mut self, tgid: u32, stats: &mut Stats) -> Option<u32> {
        let now = Instant::now();
        if let Some(&(at, found)) = self.found.get(&tgid)
            && (found.is_some() || now.duration_since(at) < LOOKUP_RETRY)
        {
            return found;
        }
        if self.found.len() >= MAX_PROCESSES {
            self.found.clear();
        }
        let found = lookup(tgid, stats);
        self.found.insert(tgid, (now, found));
        found
    }

    pub(super) fn forget(&mut self, tgid: u32) {
        self.found.remove(&tgid);
        self.found.retain(|_, (_, s)| *s != Some(tgid));
    }
}

fn lookup(tgid: u32, stats: &mut Stats) -> Option<u32> {
    let title = procfs::cmdline(tgid)?;
    if is_output_scheduler(&title) {
        stats.bump(Counter::SglangSchedulerFound);
        return Some(tgid);
    }
    // A titled process (detokenizer, scheduler of another rank) belongs to its parent's server.
    let server = if title.starts_with("sglang::") {
        procfs::parent_pid(tgid)?
    } else {
        tgid
    };
    let mut candidates = Vec::new();
    let mut parents = vec![server];
    // Under data parallelism the schedulers are the controller's children.
    for depth in 0..2 {
        let Some(&parent) = parents.get(depth) else {
            break;
        };
        for pid in procfs::all_pids() {
            if procfs::parent_pid(pid) != Some(parent) {
                continue;
            }
            let Some(title) = procfs::cmdline(pid) else {
                continue;
            };
            if is_output_scheduler(&title) {
                candidates.push(pid);
            } else if title.starts_with("sglang::data_parallel_controller") {
                parents.push(pid);
            }
        }
    }
    match candidates[..] {
        [one] => {
            stats.bump(Counter::SglangSchedulerFound);
            Some(one)
        }
        [] => {
            stats.bump(Counter::SglangSchedulerNotFound);
            None
        }
        _ => {
            // Which one ran a step is not in its outputs.
            stats.bump(Counter::SglangSchedulerAmbiguous);
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::is_output_scheduler;

    #[test]
    fn output_schedulers_are_rank_zero_of_their_groups() {
        for title in [
            "sglang::scheduler",
            "sglang::scheduler   ",
            "sglang::scheduler_TP0",
            "sglang::scheduler_DP1_TP0",
            "sglang::scheduler_DP0_PP1_ATTN_CP0_MOE_DP0_TP0_EP0",
        ] {
            assert!(is_output_scheduler(title), "{title}");
        }
        for title in [
            "sglang::scheduler_TP1",
            "sglang::scheduler_DP0_TP0_EP2",
            "sglang::scheduler_MOE_DP1",
            "sglang::scheduler_TPx",
            "sglang::schedulerX",
            "sglang::detokenizer",
            "python -m sglang.launch_server",
        ] {
            assert!(!is_output_scheduler(title), "{title}");
        }
    }

    #[test]
    fn this_process_has_no_scheduler() {
        let mut stats = inferscope_model::Stats::default();
        assert_eq!(
            super::Schedulers::default().of(std::process::id(), &mut stats),
            None
        );
        assert_eq!(
            stats.get(inferscope_model::Counter::SglangSchedulerNotFound),
            1
        );
    }
}
