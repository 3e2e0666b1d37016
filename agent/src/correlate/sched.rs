//! Exact joins for scheduler hooks: an engine task is posted on the thread that read its HTTP
//! request (llama.cpp's handler runs there), so (process, thread) → the request it just read →
//! the task id; admission then names the task id.
use rustc_hash::FxHashMap;

use inferscope_common::SchedKind;

use super::Stats;
use crate::capture::{SchedEvent, records::UserJoin};

/// Entries per map; beyond it new joins are refused (counted).
const MAX_ENTRIES: usize = 65536;

#[derive(Default)]
pub struct SchedJoins {
    /// (tgid, tid) → the request (fd, seq) that thread finished reading last, not yet posted.
    read_by_thread: FxHashMap<(u32, u32), (i32, u32)>,
    /// (tgid, task id) → the request (fd, seq), until it is admitted.
    by_task: FxHashMap<(u32, i64), (i32, u32)>,
    /// (tgid, id) → the request (fd, seq) a user-defined probe linked the id to, until a
    /// `finish` probe (or the request's end) releases it.
    by_user_id: FxHashMap<(u32, i64), (i32, u32)>,
    /// (tgid, tid) → (start, batch tokens) of the step that thread is running.
    open_steps: FxHashMap<(u32, u32), (u64, i64)>,
}

impl SchedJoins {
    pub fn request_read(&mut self, tgid: u32, tid: u32, fd: i32, seq: u32) {
        if self.read_by_thread.len() < MAX_ENTRIES || self.read_by_thread.contains_key(&(tgid, tid))
        {
            self.read_by_thread.insert((tgid, tid), (fd, seq));
        }
    }

    /// Which request (fd, seq) `event` belongs to.
    pub fn locate(&mut self, event: &SchedEvent, stats: &mut Stats) -> Option<(i32, u32)> {
        match event.kind {
            SchedKind::TaskPosted => {
                let Some(request) = self.read_by_thread.remove(&(event.tgid, event.tid)) else {
                    // Posted by a thread that read no HTTP request: an internal task.
                    stats.bump("sched_post_without_request");
                    return None;
                };
                if self.by_task.len() >= MAX_ENTRIES {
                    stats.bump("sched_joins_over_limit");
                    return None;
                }
                self.by_task.insert((event.tgid, event.task_id), request);
                Some(request)
            }
            SchedKind::StepBegin
            | SchedKind::StepEnd
            | SchedKind::FirstToken
            | SchedKind::Finish
            | SchedKind::Preempt => None,
            SchedKind::TaskAdmitted => {
                let found = self.by_task.remove(&(event.tgid, event.task_id));
                if found.is_none() {
                    stats.bump("sched_admit_unknown_task");
                }
                found
            }
        }
    }

    /// Which request (fd, seq) a user-defined probe's `event` belongs to: the one its thread
    /// just read (linking the id read to it), or the one its id was linked to.
    pub fn locate_user(
        &mut self,
        event: &SchedEvent,
        join: UserJoin,
        stats: &mut Stats,
    ) -> Option<(i32, u32)> {
        let key = (event.tgid, event.task_id);
        if join.by_thread {
            let Some(request) = self.read_by_thread.remove(&(event.tgid, event.tid)) else {
                stats.bump("user_probe_thread_read_no_request");
                return None;
            };
            if join.has_id && event.kind != SchedKind::Finish {
                if self.by_user_id.len() >= MAX_ENTRIES && !self.by_user_id.contains_key(&key) {
                    stats.bump("sched_joins_over_limit");
                } else {
                    self.by_user_id.insert(key, request);
                }
            }
            return Some(request);
        }
        let found = if event.kind == SchedKind::Finish {
            self.by_user_id.remove(&key)
        } else {
            self.by_user_id.get(&key).copied()
        };
        if found.is_none() {
            stats.bump("user_probe_unknown_id");
        }
        found
    }

    /// The request an id was linked to is gone: the link goes too.
    pub fn forget_user_id(&mut self, tgid: u32, id: i64) {
        self.by_user_id.remove(&(tgid, id));
    }

    pub fn step_begin(&mut self, event: &SchedEvent) {
        let key = (event.tgid, event.tid);
        if self.open_steps.len() < MAX_ENTRIES || self.open_steps.contains_key(&key) {
            self.open_steps.insert(key, (event.ts_ns, event.task_id));
        }
    }

    /// The (start, batch tokens) of the step `event` ends.
    pub fn step_end(&mut self, event: &SchedEvent) -> Option<(u64, i64)> {
        self.open_steps.remove(&(event.tgid, event.tid))
    }

    pub fn forget_process(&mut self, tgid: u32) {
        self.open_steps.retain(|(t, _), _| *t != tgid);
        self.read_by_thread.retain(|(t, _), _| *t != tgid);
        self.by_task.retain(|(t, _), _| *t != tgid);
        self.by_user_id.retain(|(t, _), _| *t != tgid);
    }
}
