//! Exact joins for scheduler hooks: an engine task is posted on the thread that read its HTTP
//! request (llama.cpp's handler runs there), so (process, thread) → the request it just read →
//! the task id; deferral and admission then name the task id, and admission names the slot the
//! task got, which first-token, finish and release events name in turn.
use std::collections::VecDeque;

use inferscope_common::SchedKind;
use inferscope_model::Counter;
use rustc_hash::FxHashMap;

use super::Stats;
use crate::capture::{SchedEvent, kernel::records::UserJoin};

/// Entries per map; beyond it new joins are refused (counted).
const MAX_ENTRIES: usize = 65536;

/// Requests one thread may have read and not yet posted or answered: more than one only when a
/// client pipelines requests (several in one read); the oldest goes beyond it (counted).
const MAX_READ_PER_THREAD: usize = 16;

#[derive(Default)]
pub(super) struct SchedJoins {
    /// (tgid, tid) → the requests (connection, seq) that thread finished reading and has neither
    /// posted as a task nor begun answering, oldest first. A server handles one connection's
    /// requests in order, so the oldest is the one a post belongs to (pipelined requests
    /// arrive several to a read; requests answered without a task, such as a health check,
    /// leave when their answer begins).
    read_by_thread: FxHashMap<(u32, u32), VecDeque<(u64, u32)>>,
    /// (tgid, task id) → the request (connection, seq), until it is admitted.
    by_task: FxHashMap<(u32, i64), (u64, u32)>,
    /// (tgid, id) → the request (connection, seq) a user-defined probe linked the id to, until a
    /// `finish` probe (or the request's end) releases it.
    by_user_id: FxHashMap<(u32, i64), (u64, u32)>,
    /// (tgid, tid) → (start, batch tokens) of the step that thread is running.
    open_steps: FxHashMap<(u32, u32), (u64, i64)>,
    /// (tgid, slot) → the request (connection, seq) the slot is serving, from admission to release.
    by_slot: FxHashMap<(u32, u32), (u64, u32)>,
    /// Per process: when freed slots took parked tasks back, most recent last. The engine puts
    /// each such task at the front of its queue, so the next deferred task admitted is the one
    /// requeued last.
    requeues: FxHashMap<u32, Vec<u64>>,
}

/// Requeue times kept per process (more would mean tasks requeued and never admitted).
const MAX_REQUEUES: usize = 64;

impl SchedJoins {
    pub(super) fn request_read(
        &mut self,
        tgid: u32,
        tid: u32,
        conn: u64,
        seq: u32,
        stats: &mut Stats,
    ) {
        if self.read_by_thread.len() >= MAX_ENTRIES
            && !self.read_by_thread.contains_key(&(tgid, tid))
        {
            stats.bump(Counter::SchedJoinsOverLimit);
            return;
        }
        let queue = self.read_by_thread.entry((tgid, tid)).or_default();
        if queue.len() >= MAX_READ_PER_THREAD {
            queue.pop_front();
            stats.bump(Counter::SchedReadsOverLimit);
        }
        queue.push_back((conn, seq));
    }

    /// The answer to request `seq` of `conn` (read by `tid`) began: it and the requests read
    /// before it on that connection will post no task any more.
    pub(super) fn response_started(&mut self, tgid: u32, tid: u32, conn: u64, seq: u32) {
        let Some(queue) = self.read_by_thread.get_mut(&(tgid, tid)) else {
            return;
        };
        queue.retain(|&(c, s)| c != conn || s > seq);
        if queue.is_empty() {
            self.read_by_thread.remove(&(tgid, tid));
        }
    }

    /// Drops the requests at the front of `tid`'s queue that ended without an answer or a task
    /// (the client left first), so that the thread's next post joins the request it belongs to.
    pub(super) fn prune_reads(&mut self, tgid: u32, tid: u32, is_open: impl Fn(u64, u32) -> bool) {
        let Some(queue) = self.read_by_thread.get_mut(&(tgid, tid)) else {
            return;
        };
        while queue
            .front()
            .is_some_and(|&(conn, seq)| !is_open(conn, seq))
        {
            queue.pop_front();
        }
        if queue.is_empty() {
            self.read_by_thread.remove(&(tgid, tid));
        }
    }

    /// The oldest request `tid` read and has not posted or answered yet.
    fn take_read(&mut self, tgid: u32, tid: u32) -> Option<(u64, u32)> {
        let queue = self.read_by_thread.get_mut(&(tgid, tid))?;
        let request = queue.pop_front();
        if queue.is_empty() {
            self.read_by_thread.remove(&(tgid, tid));
        }
        request
    }

    /// Which request (connection, seq) `event` belongs to.
    pub(super) fn locate(&mut self, event: &SchedEvent, stats: &mut Stats) -> Option<(u64, u32)> {
        match event.kind {
            SchedKind::TaskPosted => {
                let Some(request) = self.take_read(event.tgid, event.tid) else {
                    // Posted by a thread that read no HTTP request: an internal task.
                    stats.bump(Counter::SchedPostWithoutRequest);
                    return None;
                };
                if self.by_task.len() >= MAX_ENTRIES {
                    stats.bump(Counter::SchedJoinsOverLimit);
                    return None;
                }
                self.by_task.insert((event.tgid, event.task_id), request);
                Some(request)
            }
            SchedKind::TaskDeferred => {
                let found = self.by_task.get(&(event.tgid, event.task_id)).copied();
                if found.is_none() {
                    stats.bump(Counter::SchedDeferUnknownTask);
                }
                found
            }
            SchedKind::TaskAdmitted => {
                let found = self.by_task.remove(&(event.tgid, event.task_id));
                match (found, event.slot) {
                    (None, _) => stats.bump(Counter::SchedAdmitUnknownTask),
                    (Some(request), Some(slot)) => {
                        if self.by_slot.len() < MAX_ENTRIES
                            || self.by_slot.contains_key(&(event.tgid, slot))
                        {
                            self.by_slot.insert((event.tgid, slot), request);
                        } else {
                            stats.bump(Counter::SchedJoinsOverLimit);
                        }
                    }
                    (Some(_), None) => {}
                }
                found
            }
            SchedKind::FirstToken | SchedKind::Finish => {
                let slot = event.slot?;
                let found = self.by_slot.get(&(event.tgid, slot)).copied();
                if found.is_none() {
                    stats.bump(Counter::SchedSlotUnknown);
                }
                found
            }
            SchedKind::SlotReleased => {
                // Idle slots are released too (the engine resets them): not an error.
                self.by_slot.remove(&(event.tgid, event.slot?))
            }
            SchedKind::DeferredRequeued => {
                let stack = self.requeues.entry(event.tgid).or_default();
                if stack.len() >= MAX_REQUEUES {
                    stack.remove(0);
                    stats.bump(Counter::SchedRequeuesDropped);
                }
                stack.push(event.ts_ns);
                None
            }
            SchedKind::StepBegin | SchedKind::StepEnd | SchedKind::Preempt => None,
        }
    }

    /// When the engine took the deferred task now being admitted back from its parking list.
    pub(super) fn take_requeue(&mut self, tgid: u32) -> Option<u64> {
        self.requeues.get_mut(&tgid).and_then(Vec::pop)
    }

    /// Which request (connection, seq) a user-defined probe's `event` belongs to: the one its thread
    /// just read (linking the id read to it), or the one its id was linked to.
    pub(super) fn locate_user(
        &mut self,
        event: &SchedEvent,
        join: UserJoin,
        stats: &mut Stats,
    ) -> Option<(u64, u32)> {
        let key = (event.tgid, event.task_id);
        if join.by_thread {
            let Some(request) = self.take_read(event.tgid, event.tid) else {
                stats.bump(Counter::UserProbeThreadReadNoRequest);
                return None;
            };
            if join.has_id && event.kind != SchedKind::Finish {
                if self.by_user_id.len() >= MAX_ENTRIES && !self.by_user_id.contains_key(&key) {
                    stats.bump(Counter::SchedJoinsOverLimit);
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
            stats.bump(Counter::UserProbeUnknownId);
        }
        found
    }

    /// The request an id was linked to is gone: the link goes too.
    pub(super) fn forget_user_id(&mut self, tgid: u32, id: i64) {
        self.by_user_id.remove(&(tgid, id));
    }

    pub(super) fn step_begin(&mut self, event: &SchedEvent) {
        let key = (event.tgid, event.tid);
        if self.open_steps.len() < MAX_ENTRIES || self.open_steps.contains_key(&key) {
            self.open_steps.insert(key, (event.ts_ns, event.task_id));
        }
    }

    /// The (start, batch tokens) of the step `event` ends.
    pub(super) fn step_end(&mut self, event: &SchedEvent) -> Option<(u64, i64)> {
        self.open_steps.remove(&(event.tgid, event.tid))
    }

    pub(super) fn forget_process(&mut self, tgid: u32) {
        self.open_steps.retain(|(t, _), _| *t != tgid);
        self.read_by_thread.retain(|(t, _), _| *t != tgid);
        self.by_task.retain(|(t, _), _| *t != tgid);
        self.by_user_id.retain(|(t, _), _| *t != tgid);
        self.by_slot.retain(|(t, _), _| *t != tgid);
        self.requeues.remove(&tgid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(kind: SchedKind, ts_ns: u64, task_id: i64, slot: Option<u32>) -> SchedEvent {
        SchedEvent {
            kind,
            tgid: 7,
            tid: if kind == SchedKind::TaskPosted {
                100
            } else {
                1
            },
            ts_ns,
            task_id,
            slot,
            user: None,
        }
    }

    #[test]
    fn a_request_is_followed_from_post_through_its_slot_to_release() {
        let mut joins = SchedJoins::default();
        let mut stats = Stats::default();
        let request = (5, 0);
        joins.request_read(7, 100, request.0, request.1, &mut stats);
        let mut at = |joins: &mut SchedJoins, kind, task, slot| {
            joins.locate(&event(kind, 1, task, slot), &mut stats)
        };
        assert_eq!(
            at(&mut joins, SchedKind::TaskPosted, 42, None),
            Some(request)
        );
        assert_eq!(
            at(&mut joins, SchedKind::TaskDeferred, 42, None),
            Some(request)
        );
        assert_eq!(
            at(&mut joins, SchedKind::TaskAdmitted, 42, Some(1)),
            Some(request)
        );
        assert_eq!(
            at(&mut joins, SchedKind::FirstToken, -1, Some(1)),
            Some(request)
        );
        assert_eq!(
            at(&mut joins, SchedKind::Finish, -1, Some(1)),
            Some(request)
        );
        assert_eq!(
            at(&mut joins, SchedKind::SlotReleased, -1, Some(1)),
            Some(request)
        );
        // The slot is free: a late event for it finds nothing, and says so.
        assert_eq!(at(&mut joins, SchedKind::FirstToken, -1, Some(1)), None);
        // Releasing an idle slot is routine, not an error.
        assert_eq!(at(&mut joins, SchedKind::SlotReleased, -1, Some(0)), None);
        assert_eq!(stats.get(Counter::SchedSlotUnknown), 1);
        assert_eq!(stats.get(Counter::SchedAdmitUnknownTask), 0);
    }

    #[test]
    fn the_task_requeued_last_is_admitted_first() {
        let mut joins = SchedJoins::default();
        let mut stats = Stats::default();
        for ts in [10, 20] {
            let requeue = event(SchedKind::DeferredRequeued, ts, -1, Some(0));
            assert_eq!(joins.locate(&requeue, &mut stats), None);
        }
        // The engine puts each requeued task at the front of its queue.
        assert_eq!(joins.take_requeue(7), Some(20));
        assert_eq!(joins.take_requeue(7), Some(10));
        assert_eq!(joins.take_requeue(7), None);
    }

    #[test]
    fn requeues_that_are_never_admitted_stay_bounded() {
        let mut joins = SchedJoins::default();
        let mut stats = Stats::default();
        for ts in 0..(MAX_REQUEUES as u64 + 5) {
            joins.locate(
                &event(SchedKind::DeferredRequeued, ts, -1, Some(0)),
                &mut stats,
            );
        }
        assert_eq!(stats.get(Counter::SchedRequeuesDropped), 5);
        assert_eq!(joins.take_requeue(7), Some(MAX_REQUEUES as u64 + 4));
        joins.forget_process(7);
        assert_eq!(joins.take_requeue(7), None);
    }

    #[test]
    fn pipelined_requests_join_their_own_tasks_in_order() {
        let mut joins = SchedJoins::default();
        let mut stats = Stats::default();
        // Three requests in one read: the thread posts their tasks one at a time, answering each
        // before the next (a server handles a connection's requests in order).
        for seq in 0..3 {
            joins.request_read(7, 100, 5, seq, &mut stats);
        }
        for seq in 0..3 {
            let posted = joins.locate(
                &event(SchedKind::TaskPosted, 1, seq.into(), None),
                &mut stats,
            );
            assert_eq!(posted, Some((5, seq)));
            joins.response_started(7, 100, 5, seq);
        }
        assert_eq!(stats.get(Counter::SchedPostWithoutRequest), 0);
    }

    #[test]
    fn a_request_answered_without_a_task_does_not_take_the_next_post() {
        let mut joins = SchedJoins::default();
        let mut stats = Stats::default();
        // A health check read and answered, then a completion read and posted.
        joins.request_read(7, 100, 5, 0, &mut stats);
        joins.response_started(7, 100, 5, 0);
        joins.request_read(7, 100, 5, 1, &mut stats);
        let posted = joins.locate(&event(SchedKind::TaskPosted, 1, 9, None), &mut stats);
        assert_eq!(posted, Some((5, 1)));
        // A request whose client left before any answer or task is pruned, not joined.
        joins.request_read(7, 100, 6, 0, &mut stats);
        joins.request_read(7, 100, 7, 0, &mut stats);
        joins.prune_reads(7, 100, |conn, _| conn != 6);
        let posted = joins.locate(&event(SchedKind::TaskPosted, 1, 10, None), &mut stats);
        assert_eq!(posted, Some((7, 0)));
    }
}
