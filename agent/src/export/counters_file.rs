//! The agent's counters as one JSON object (`{"counters": {"name": value, …}}`), written whole
//! (a temporary file renamed over the target) so a reader never sees half of it: for scripts and
//! tests that check what the agent dropped or lost without scraping its log.
use std::{
    collections::BTreeMap,
    fs,
    io::{self, Write},
    path::Path,
};

use inferscope_model::Counter;

/// Writes `counters` by exported name, and every [`Counter`] they lack as 0: a reader can tell
/// a counter that stayed at zero from a name that does not exist.
pub(crate) fn write(path: &Path, counters: &[(Counter, u64)]) -> io::Result<()> {
    let mut by_name: BTreeMap<&str, u64> = Counter::ALL.iter().map(|c| (c.name(), 0)).collect();
    for (counter, value) in counters {
        *by_name.entry(counter.name()).or_default() += value;
    }
    let body = serde_json::to_vec_pretty(&serde_json::json!({ "counters": by_name }))?;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = Path::new(&tmp);
    let mut file = fs::File::create(tmp)?;
    file.write_all(&body)?;
    file.write_all(b"\n")?;
    file.sync_all()?;
    fs::rename(tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_every_counter_once_summed_by_name() {
        let dir = std::env::temp_dir().join(format!("inferscope-counters-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("counters.json");
        write(
            &path,
            &[
                (Counter::RequestsLost, 2),
                (Counter::KernelRingbufFullDrops, 0),
                (Counter::RequestsLost, 1),
            ],
        )
        .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
        assert_eq!(v["counters"]["requests_lost"], 3);
        assert_eq!(v["counters"]["kernel_ringbuf_full_drops"], 0);
        assert_eq!(
            v["counters"]["zmtp_desync"], 0,
            "an untouched counter is written as 0"
        );
        assert_eq!(v["counters"].as_object().unwrap().len(), Counter::ALL.len());
        fs::remove_dir_all(&dir).unwrap();
    }
}
