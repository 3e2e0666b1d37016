//! Named counters for everything the pipeline drops, truncates or fails to parse.
use std::collections::BTreeMap;

#[derive(Debug, Default, Clone)]
pub struct Stats {
    counters: BTreeMap<&'static str, u64>,
}

impl Stats {
    pub fn bump(&mut self, name: &'static str) {
        self.add(name, 1);
    }

    pub fn add(&mut self, name: &'static str, n: u64) {
        *self.counters.entry(name).or_default() += n;
    }

    pub fn get(&self, name: &str) -> u64 {
        self.counters.get(name).copied().unwrap_or(0)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        self.counters.iter().map(|(k, v)| (*k, *v))
    }
}
