//! Per-GPU telemetry from NVML, loaded at run time (nvml-wrapper dlopens libnvidia-ml.so.1): on a
//! host without it the sampler reports one clear error and the rest of the agent runs.
//!
//! GPM metrics (Hopper and newer) are rates between two samples, so they appear from the second
//! interval on.
use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::Duration,
};

use inferscope_model::clock::monotonic_now_ns;
use nvml_wrapper::{
    Device, Nvml,
    enum_wrappers::device::Clock,
    enums::gpm::GpmMetricId,
    gpm::{GpmSample, gpm_metrics_get},
};
use serde::Serialize;

use super::outliers::flag_outliers;

#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub(crate) struct GpuSample {
    pub index: u32,
    pub uuid: String,
    pub name: String,
    /// CLOCK_MONOTONIC when sampled.
    pub mono_ns: u64,
    pub gpu_util_pct: Option<u32>,
    /// NVML's "memory utilisation": % of time memory was read or written (not bandwidth).
    pub mem_util_pct: Option<u32>,
    pub mem_used_bytes: Option<u64>,
    pub mem_total_bytes: Option<u64>,
    pub sm_clock_mhz: Option<u32>,
    pub power_w: Option<f64>,
    pub throttle_reasons: Vec<String>,
    /// GPM (Hopper+): any tensor pipe active, % of time.
    pub tensor_util_pct: Option<f64>,
    /// GPM (Hopper+): DRAM bandwidth used, % of peak.
    pub dram_bw_util_pct: Option<f64>,
    /// GPM (Hopper+): SM occupancy, % of maximum warps.
    pub sm_occupancy_pct: Option<f64>,
    /// Metrics on which this GPU deviates from its peers (see `outliers`).
    pub outliers: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
#[error(
    "NVML is not available ({0}); GPU utilisation, memory, clocks, power and GPM metrics are not \
     sampled. Install the NVIDIA driver (libnvidia-ml.so.1) to get them; everything else runs."
)]
pub(crate) struct NvmlUnavailable(String);

pub(crate) struct NvmlSampler {
    latest: Arc<Mutex<Vec<GpuSample>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    pub gpus: u32,
}

impl NvmlSampler {
    pub(crate) fn start(interval: Duration) -> Result<Self, NvmlUnavailable> {
        let nvml = Nvml::init().map_err(|e| NvmlUnavailable(e.to_string()))?;
        let gpus = nvml
            .device_count()
            .map_err(|e| NvmlUnavailable(e.to_string()))?;
        let latest = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (l, s) = (latest.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("nvml-sampler".into())
            .spawn(move || sample_loop(nvml, interval, l, s))
            .map_err(|e| NvmlUnavailable(e.to_string()))?;
        Ok(NvmlSampler {
            latest,
            stop,
            thread: Some(thread),
            gpus,
        })
    }

    /// The most recent sample of every GPU (empty until the first interval has run).
    pub(crate) fn latest(&self) -> Vec<GpuSample> {
        self.latest.lock().map(|v| v.clone()).unwrap_or_default()
    }
}

impl Drop for NvmlSampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

const GPM_METRICS: [GpmMetricId; 3] = [
    GpmMetricId::AnyTensorUtil,
    GpmMetricId::DramBwUtil,
    GpmMetricId::SmOccupancy,
];

fn sample_loop(
    nvml: Nvml,
    interval: Duration,
    latest: Arc<Mutex<Vec<GpuSample>>>,
    stop: Arc<AtomicBool>,
) {
    let count = nvml.device_count().unwrap_or(0);
    let devices: Vec<(u32, Device<'_>)> = (0..count)
        .filter_map(|i| nvml.device_by_index(i).ok().map(|d| (i, d)))
        .collect();
    let mut previous: Vec<Option<GpmSample<'_>>> = devices.iter().map(|_| None).collect();
    while !stop.load(Ordering::Acquire) {
        let mut samples = Vec::with_capacity(devices.len());
        for (slot, (index, dev)) in devices.iter().enumerate() {
            let mut s = basic_sample(*index, dev);
            if dev.gpm_support().unwrap_or(false)
                && let Ok(now) = dev.gpm_sample()
            {
                if let Some(prev) = previous[slot].as_ref()
                    && let Ok(results) = gpm_metrics_get(&nvml, prev, &now, &GPM_METRICS)
                {
                    for r in results.into_iter().flatten() {
                        match r.metric_id {
                            GpmMetricId::AnyTensorUtil => s.tensor_util_pct = Some(r.value),
                            GpmMetricId::DramBwUtil => s.dram_bw_util_pct = Some(r.value),
                            GpmMetricId::SmOccupancy => s.sm_occupancy_pct = Some(r.value),
                            _ => {}
                        }
                    }
                }
                previous[slot] = Some(now);
            }
            samples.push(s);
        }
        mark_outliers(&mut samples);
        if let Ok(mut l) = latest.lock() {
            *l = samples;
        }
        // Sleep in short steps so Drop does not wait a whole interval.
        let mut left = interval;
        while !left.is_zero() && !stop.load(Ordering::Acquire) {
            let step = left.min(Duration::from_millis(50));
            std::thread::sleep(step);
            left -= step;
        }
    }
}

fn basic_sample(index: u32, dev: &Device<'_>) -> GpuSample {
    let util = dev.utilization_rates().ok();
    let mem = dev.memory_info().ok();
    GpuSample {
        index,
        uuid: dev.uuid().unwrap_or_default(),
        name: dev.name().unwrap_or_default(),
        mono_ns: monotonic_now_ns(),
        gpu_util_pct: util.as_ref().map(|u| u.gpu),
        mem_util_pct: util.as_ref().map(|u| u.memory),
        mem_used_bytes: mem.as_ref().map(|m| m.used),
        mem_total_bytes: mem.as_ref().map(|m| m.total),
        sm_clock_mhz: dev.clock_info(Clock::SM).ok(),
        power_w: dev.power_usage().ok().map(|mw| f64::from(mw) / 1000.0),
        throttle_reasons: dev
            .current_throttle_reasons()
            .map(|r| {
                r.iter_names()
                    .map(|(n, _)| n.to_ascii_lowercase())
                    .collect()
            })
            .unwrap_or_default(),
        ..Default::default()
    }
}

/// Sets `outliers` on each sample from the peer comparison of every numeric metric.
pub(super) fn mark_outliers(samples: &mut [GpuSample]) {
    type Get = fn(&GpuSample) -> Option<f64>;
    let metrics: [(&str, Get); 7] = [
        ("gpu_util_pct", |s| s.gpu_util_pct.map(f64::from)),
        ("mem_util_pct", |s| s.mem_util_pct.map(f64::from)),
        ("sm_clock_mhz", |s| s.sm_clock_mhz.map(f64::from)),
        ("power_w", |s| s.power_w),
        ("tensor_util_pct", |s| s.tensor_util_pct),
        ("dram_bw_util_pct", |s| s.dram_bw_util_pct),
        ("sm_occupancy_pct", |s| s.sm_occupancy_pct),
    ];
    for s in samples.iter_mut() {
        s.outliers.clear();
    }
    for (name, get) in metrics {
        let values: Vec<Option<f64>> = samples.iter().map(get).collect();
        for (s, flagged) in samples.iter_mut().zip(flag_outliers(&values)) {
            if flagged {
                s.outliers.push(name.to_string());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_the_slow_card() {
        let mut v: Vec<GpuSample> = (0..4)
            .map(|i| GpuSample {
                index: i,
                sm_clock_mhz: Some(1980),
                dram_bw_util_pct: Some(if i == 2 { 20.0 } else { 70.0 }),
                ..Default::default()
            })
            .collect();
        mark_outliers(&mut v);
        assert_eq!(v[2].outliers, vec!["dram_bw_util_pct".to_string()]);
        assert!(v[0].outliers.is_empty());
    }

    #[test]
    fn absent_nvml_is_a_clear_error() {
        // This CI host has no NVIDIA driver; on a GPU host the sampler must start instead.
        if std::path::Path::new("/dev/nvidiactl").exists() {
            let s = NvmlSampler::start(Duration::from_millis(100)).expect("NVML on a GPU host");
            assert!(s.gpus > 0);
        } else {
            let e = NvmlSampler::start(Duration::from_millis(100))
                .err()
                .expect("no NVML here");
            assert!(e.to_string().contains("NVML is not available"));
        }
    }
}
