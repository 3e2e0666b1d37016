//! P50/P99 summary over a set of records (the demo's closing table).
use std::fmt::Write as _;

use inferscope_model::{RequestRecord, quantile::percentile};

pub(crate) struct Distribution {
    pub name: &'static str,
    pub count: usize,
    pub p50: Option<f64>,
    pub p99: Option<f64>,
    pub max: Option<f64>,
}

fn distribution(
    name: &'static str,
    records: &[RequestRecord],
    field: impl Fn(&RequestRecord) -> Option<f64>,
) -> Distribution {
    let mut values: Vec<f64> = records.iter().filter_map(field).collect();
    values.sort_unstable_by(f64::total_cmp);
    Distribution {
        name,
        count: values.len(),
        p50: percentile(&values, 0.5),
        p99: percentile(&values, 0.99),
        max: values.last().copied(),
    }
}

pub(crate) fn distributions(records: &[RequestRecord]) -> Vec<Distribution> {
    let ok: Vec<RequestRecord> = records.iter().filter(|r| !r.aborted).cloned().collect();
    vec![
        distribution("ttft_ms", &ok, |r| r.ttft_ms),
        distribution("queue_wait_ms", &ok, |r| r.queue_wait_ms),
        distribution("prefill_ms", &ok, |r| r.prefill_ms),
        distribution("tpot_ms", &ok, |r| r.tpot_ms),
        distribution("itl_p99_ms", &ok, |r| r.itl_p99_ms),
        distribution("e2e_ms", &ok, |r| Some(r.e2e_ms)),
        distribution("read_delay_ms", &ok, |r| r.read_delay_ms),
    ]
}

pub(crate) fn render(records: &[RequestRecord]) -> String {
    let fmt = |v: Option<f64>| v.map_or_else(|| "-".into(), |v| format!("{v:.2}"));
    let mut out = String::new();
    let aborted = records.iter().filter(|r| r.aborted).count();
    let incomplete = records
        .iter()
        .filter(|r| !r.aborted && r.incomplete.is_some())
        .count();
    let incomplete = if incomplete > 0 {
        format!(", {incomplete} incomplete")
    } else {
        String::new()
    };
    let _ = writeln!(
        out,
        "{} requests ({} aborted{incomplete})\n{:<14} {:>6} {:>10} {:>10} {:>10}",
        records.len(),
        aborted,
        "metric",
        "n",
        "p50",
        "p99",
        "max"
    );
    for d in distributions(records) {
        let _ = writeln!(
            out,
            "{:<14} {:>6} {:>10} {:>10} {:>10}",
            d.name,
            d.count,
            fmt(d.p50),
            fmt(d.p99),
            fmt(d.max)
        );
    }
    out
}
