//! What SGLang sends, per version. Its IPC objects are msgspec structs (`io_struct`), which
//! pickle as `msgspec._utils.rebuild(cls, {field: value})`: fields are found by name, so a
//! layout is the classes and field names a version uses, read from that version's
//! sglang/srt/managers/io_struct.py and observability/req_time_stats.py. Only versions whose
//! messages were checked against their own code (tests/fixtures/sglang/<version>/) are pinned.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Layout {
    /// The exact release this layout was read from.
    pub version: &'static str,
    /// How a struct pickles: this function applied to (class, field dict).
    pub rebuild: (&'static str, &'static str),
    /// The module of the IPC classes.
    pub io_struct: &'static str,
    /// TokenizerManager → Scheduler: one tokenized request (`rid`, `input_ids`).
    pub request: &'static str,
    /// Several of them in `batch`.
    pub batch_request: &'static str,
    /// Scheduler → Detokenizer (`BatchTokenIDOutput`) and Detokenizer → TokenizerManager
    /// (`BatchStrOutput`): per-request parallel lists.
    pub outputs: &'static [&'static str],
    /// The one of them only the scheduler sends: its write is the scheduler's own send of a
    /// step's outputs.
    pub scheduler_output: &'static str,
    pub abort: &'static str,
    /// The per-request times the scheduler ships in `time_stats` (perf_counter seconds).
    pub time_stats: (&'static str, &'static str),
}

/// SGLang 0.5.23 (the PyPI wheel). BatchTokenIDOutput and BatchStrOutput carry rids,
/// finished_reasons, prompt_tokens, completion_tokens, cached_tokens, retraction_counts and
/// time_stats (SchedulerReqTimeStats: wait_queue_entry_time, forward_entry_time,
/// prefill_finished_time, queue_duration_s, shipped only with --enable-metrics).
pub(super) const V0_5_23: Layout = Layout {
    version: "0.5.23",
    rebuild: ("msgspec._utils", "rebuild"),
    io_struct: "sglang.srt.managers.io_struct",
    request: "TokenizedGenerateReqInput",
    batch_request: "BatchTokenizedGenerateReqInput",
    outputs: &["BatchTokenIDOutput", "BatchStrOutput"],
    scheduler_output: "BatchTokenIDOutput",
    abort: "AbortReq",
    time_stats: (
        "sglang.srt.observability.req_time_stats",
        "SchedulerReqTimeStats",
    ),
};

static LAYOUTS: &[Layout] = &[V0_5_23];

/// The versions with a pinned layout, for messages.
pub(super) const SUPPORTED: &str = "0.5.23";

/// Used, with every class and field checked, when the engine's version is not known.
pub(super) const NEWEST: Layout = V0_5_23;

/// The layout for an installed version ("0.5.23", "0.5.23+cu129"), if it is pinned. Patch
/// releases change io_struct, so the match is exact (a local `+…` tag aside).
pub(super) fn for_version(version: &str) -> Option<&'static Layout> {
    let release = version.split('+').next()?;
    LAYOUTS.iter().find(|l| l.version == release)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_checked_releases_are_pinned() {
        assert_eq!(for_version("0.5.23"), Some(&V0_5_23));
        assert_eq!(for_version("0.5.23+cu129"), Some(&V0_5_23));
        assert_eq!(for_version("0.5.22"), None);
        assert_eq!(for_version("0.5.23.post1"), None);
        assert_eq!(for_version(""), None);
    }
}
