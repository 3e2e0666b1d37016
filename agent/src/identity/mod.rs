//! Which container and Kubernetes pod each traced engine process belongs to: the container id
//! from the process's cgroup ([`crate::identity::container`]), then the pod's name, namespace,
//! uid, container name, node and workload from the Kubernetes API ([`kube`] watches this
//! node's pods into a [`pods::PodStore`]). The pipeline stamps it on every request record;
//! the exporters turn it into OTel resource attributes and Prometheus labels.
//!
//! Lookups never wait for the API: a process whose pod the API has not described (yet, or
//! because it is down) gets its container id only, and the record is counted
//! (`kube_pod_unknown`). Without Kubernetes the agent names processes by container id and pid.
//!
//! Where this stage sits and what it may import: `docs/src/architecture.md`.
pub mod container;
pub(crate) mod kube;
pub(crate) mod pods;

use std::sync::Arc;

use container::ContainerId;
use inferscope_model::Counter;
use pods::PodStore;
use rustc_hash::FxHashMap;

/// Processes whose identity is kept at once (engines on one node: a few dozen).
const MAX_PROCESSES: usize = 4096;

pub(crate) use inferscope_model::ProcessIdentity;

struct Entry {
    container: Option<ContainerId>,
    identity: Option<ProcessIdentity>,
    /// The store's generation when the pod was last looked for (to look again only after a
    /// change).
    looked_at: u64,
    pod_found: bool,
}

/// Per-process identities, resolved on first use and refreshed when the pod cache changes.
#[derive(Default)]
pub(crate) struct Identities {
    pods: Option<Arc<PodStore>>,
    procs: FxHashMap<u32, Entry>,
    /// Records of a containerised process whose pod the API has not described.
    pod_unknown: u64,
    /// Processes resolved without being kept because the table was full.
    table_full: u64,
}

impl Identities {
    /// `pods`: the Kubernetes pod cache, where the agent runs in Kubernetes.
    pub(crate) fn new(pods: Option<Arc<PodStore>>) -> Self {
        Identities {
            pods,
            ..Default::default()
        }
    }

    /// The identity of `pid` for a record now finished; `None` for a process on the host.
    pub(crate) fn of(&mut self, pid: u32) -> Option<ProcessIdentity> {
        if !self.procs.contains_key(&pid) {
            let entry = Entry {
                container: container::of_process(pid),
                identity: None,
                looked_at: u64::MAX,
                pod_found: false,
            };
            if self.procs.len() >= MAX_PROCESSES {
                self.table_full += 1;
                let mut entry = entry;
                return self.resolve(&mut entry);
            }
            self.procs.insert(pid, entry);
        }
        let mut entry = self.procs.remove(&pid)?;
        let identity = self.resolve(&mut entry);
        self.procs.insert(pid, entry);
        identity
    }

    fn resolve(&mut self, entry: &mut Entry) -> Option<ProcessIdentity> {
        let container = entry.container.as_ref()?;
        if let Some(store) = &self.pods
            && !entry.pod_found
        {
            let generation = store.generation();
            if generation != entry.looked_at {
                entry.looked_at = generation;
                entry.identity = None;
                if let Some(pod) = store.find(&container.id, container.pod_uid.as_deref()) {
                    entry.pod_found = true;
                    let deployment = pod.deployment.clone();
                    let (owner_kind, owner_name) = match (&pod.owner, &deployment) {
                        (Some((kind, name)), None) => (Some(kind.clone()), Some(name.clone())),
                        _ => (None, None),
                    };
                    entry.identity = Some(ProcessIdentity {
                        container_id: Some(container.id.clone()),
                        container_runtime: Some(container.runtime),
                        k8s_pod_name: Some(pod.name.clone()),
                        k8s_namespace_name: Some(pod.namespace.clone()),
                        k8s_pod_uid: Some(pod.uid.clone()),
                        k8s_container_name: pod.container_name(&container.id).map(str::to_string),
                        k8s_node_name: pod.node_name.clone(),
                        k8s_deployment_name: deployment,
                        k8s_owner_kind: owner_kind,
                        k8s_owner_name: owner_name,
                    });
                }
            }
            if !entry.pod_found {
                self.pod_unknown += 1;
            }
        }
        let identity = entry.identity.get_or_insert_with(|| ProcessIdentity {
            container_id: Some(container.id.clone()),
            container_runtime: Some(container.runtime),
            k8s_pod_uid: container.pod_uid.clone(),
            ..Default::default()
        });
        Some(identity.clone())
    }

    /// The process exited.
    pub(crate) fn forget(&mut self, pid: u32) {
        self.procs.remove(&pid);
    }

    /// Whether `pid`'s identity is kept.
    #[cfg(test)]
    pub(crate) fn knows(&self, pid: u32) -> bool {
        self.procs.contains_key(&pid)
    }

    /// The agent's own counters for the identity layer (`inferscope_agent_events_total`).
    pub(crate) fn counters(&self) -> Vec<(Counter, u64)> {
        let mut out = vec![
            (Counter::IdentityPodUnknown, self.pod_unknown),
            (Counter::IdentityTableFull, self.table_full),
        ];
        if let Some(store) = &self.pods {
            let c = &store.counters;
            let load =
                |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
            out.extend([
                (Counter::KubeLists, load(&c.lists)),
                (Counter::KubeWatchEvents, load(&c.watch_events)),
                (Counter::KubeApiErrors, load(&c.api_errors)),
                (Counter::KubeGarbage, load(&c.garbage)),
                (Counter::KubePodsDropped, load(&c.pods_dropped)),
                (Counter::KubeWatchExpired, load(&c.watch_expired)),
            ]);
        }
        out
    }
}

impl inferscope_model::PerProcess for Identities {
    fn process_gone(&mut self, tgid: u32) {
        self.forget(tgid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_processes_have_no_identity_and_no_errors() {
        let mut ids = Identities::new(None);
        // This test process runs on the host, or in a container (CI): either way, no panic,
        // and a container id, where present, is 64 hex digits.
        if let Some(id) = ids.of(std::process::id()) {
            assert_eq!(id.container_id.map(|c| c.len()), Some(64));
        }
        assert_eq!(ids.of(u32::MAX - 1), None, "a pid that does not exist");
        assert!(ids.counters().iter().all(|(_, v)| *v == 0));
    }

    #[test]
    fn a_pod_known_later_is_picked_up_and_a_deleted_one_is_kept() {
        let store = Arc::new(PodStore::default());
        let mut ids = Identities::new(Some(store.clone()));
        let cid = "3e8b0d1c2a4f5e6d7c8b9a0f1e2d3c4b5a6978877665544332211ffeeddccbba";
        ids.procs.insert(
            7,
            Entry {
                container: container::parse(&format!(
                    "0::/kubepods/burstable/pod8c1f0a4e-6b2d-4f3a-9e7c-1d2b3c4d5e6f/{cid}\n"
                )),
                identity: None,
                looked_at: u64::MAX,
                pod_found: false,
            },
        );
        // The API has not answered: container id and the pod uid from the cgroup.
        let early = ids.of(7).unwrap();
        assert_eq!(early.container_id.as_deref(), Some(cid));
        assert_eq!(
            early.k8s_pod_uid.as_deref(),
            Some("8c1f0a4e-6b2d-4f3a-9e7c-1d2b3c4d5e6f")
        );
        assert_eq!(early.k8s_pod_name, None);
        assert_eq!(ids.pod_unknown, 1);

        let pod = pods::Pod::from_json(&pods::tests::vllm_pod(
            "8c1f0a4e-6b2d-4f3a-9e7c-1d2b3c4d5e6f",
            cid,
        ))
        .unwrap();
        store.replace(vec![pod]);
        let known = ids.of(7).unwrap();
        assert_eq!(known.k8s_pod_name.as_deref(), Some("vllm-7d9f8c6b5-x2k4p"));
        assert_eq!(known.k8s_namespace_name.as_deref(), Some("inference"));
        assert_eq!(known.k8s_container_name.as_deref(), Some("engine"));
        assert_eq!(known.k8s_deployment_name.as_deref(), Some("vllm"));
        assert_eq!(known.k8s_node_name.as_deref(), Some("gpu-node-1"));
        let attrs = known.attributes();
        for key in [
            "container.id",
            "k8s.pod.name",
            "k8s.namespace.name",
            "k8s.pod.uid",
            "k8s.container.name",
            "k8s.node.name",
            "k8s.deployment.name",
        ] {
            assert!(attrs.iter().any(|(k, _)| *k == key), "{key}: {attrs:?}");
        }
        // Deleted while its last requests finish: they keep the pod they ran in.
        store.remove("8c1f0a4e-6b2d-4f3a-9e7c-1d2b3c4d5e6f");
        assert_eq!(ids.of(7).unwrap(), known);
        assert_eq!(ids.pod_unknown, 1);
        ids.forget(7);
        assert!(ids.procs.is_empty());
    }
}
