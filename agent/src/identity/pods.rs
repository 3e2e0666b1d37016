//! The pods of this node as the Kubernetes API last described them: a bounded cache the API
//! watcher writes and the pipeline reads (a short read lock per lookup; the watcher builds
//! whole lists outside the lock). Pod JSON is untrusted input: a field that is missing or of the
//! wrong type leaves that field unknown; an object without a uid is skipped and counted.
use std::{
    collections::HashMap,
    sync::{
        RwLock,
        atomic::{AtomicU64, Ordering},
    },
};

use serde_json::Value;

/// Pods kept at most (the kubelet's default limit is 110 per node).
pub const MAX_PODS: usize = 2048;
/// Containers kept per pod at most (init and sidecar containers included).
const MAX_CONTAINERS: usize = 64;

/// One pod's identity, as the API reports it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Pod {
    pub uid: String,
    pub name: String,
    pub namespace: String,
    pub node_name: Option<String>,
    /// The controller that owns the pod: (kind, name), e.g. ("ReplicaSet", "vllm-7d9f8c6b5").
    pub owner: Option<(String, String)>,
    /// The Deployment behind the owning ReplicaSet (its name less the pod-template-hash).
    pub deployment: Option<String>,
    /// (container id without the runtime prefix, container name) from the pod's statuses.
    pub containers: Vec<(String, String)>,
}

impl Pod {
    /// Reads a Pod object (`kind: Pod` of the core/v1 API); `None` without metadata.uid.
    pub fn from_json(object: &Value) -> Option<Pod> {
        let meta = object.get("metadata")?;
        let text = |v: &Value, key: &str| v.get(key).and_then(Value::as_str).map(str::to_string);
        let uid = text(meta, "uid").filter(|u| !u.is_empty())?;
        let owner = meta
            .get("ownerReferences")
            .and_then(Value::as_array)
            .and_then(|refs| {
                refs.iter()
                    .find(|r| r.get("controller").and_then(Value::as_bool) == Some(true))
                    .or_else(|| refs.first())
            })
            .and_then(|r| Some((text(r, "kind")?, text(r, "name")?)));
        let template_hash = meta
            .get("labels")
            .and_then(|l| l.get("pod-template-hash"))
            .and_then(Value::as_str);
        let deployment = match (&owner, template_hash) {
            (Some((kind, name)), Some(hash)) if kind == "ReplicaSet" => name
                .strip_suffix(hash)
                .and_then(|n| n.strip_suffix('-'))
                .map(str::to_string),
            _ => None,
        };
        let status = object.get("status");
        let mut containers = Vec::new();
        for key in [
            "containerStatuses",
            "initContainerStatuses",
            "ephemeralContainerStatuses",
        ] {
            let Some(list) = status.and_then(|s| s.get(key)).and_then(Value::as_array) else {
                continue;
            };
            for c in list {
                if containers.len() >= MAX_CONTAINERS {
                    break;
                }
                if let (Some(name), Some(id)) = (text(c, "name"), text(c, "containerID")) {
                    // "containerd://<id>", "cri-o://<id>", "docker://<id>".
                    let id = id.rsplit("://").next().unwrap_or(&id).to_string();
                    if !id.is_empty() {
                        containers.push((id, name));
                    }
                }
            }
        }
        Some(Pod {
            uid,
            name: text(meta, "name").unwrap_or_default(),
            namespace: text(meta, "namespace").unwrap_or_default(),
            node_name: object
                .get("spec")
                .and_then(|s| s.get("nodeName"))
                .and_then(Value::as_str)
                .map(str::to_string),
            owner,
            deployment,
            containers,
        })
    }

    pub fn container_name(&self, container_id: &str) -> Option<&str> {
        self.containers
            .iter()
            .find(|(id, _)| id == container_id)
            .map(|(_, name)| name.as_str())
    }
}

#[derive(Default)]
struct Maps {
    by_uid: HashMap<String, Pod>,
    /// Container id → pod uid.
    by_container: HashMap<String, String>,
}

impl Maps {
    fn insert(&mut self, pod: Pod) -> bool {
        if !self.by_uid.contains_key(&pod.uid) && self.by_uid.len() >= MAX_PODS {
            return false;
        }
        self.remove(&pod.uid);
        for (id, _) in &pod.containers {
            self.by_container.insert(id.clone(), pod.uid.clone());
        }
        self.by_uid.insert(pod.uid.clone(), pod);
        true
    }

    fn remove(&mut self, uid: &str) {
        if let Some(old) = self.by_uid.remove(uid) {
            for (id, _) in &old.containers {
                self.by_container.remove(id);
            }
        }
    }
}

/// Counters of the pod cache and its watcher (exported as `kube_*` agent events).
#[derive(Debug, Default)]
pub struct PodCounters {
    /// Successful lists of the node's pods (the first, and each re-list after a gap).
    pub lists: AtomicU64,
    pub watch_events: AtomicU64,
    /// Requests that failed: connection refused or reset, timeouts, HTTP errors.
    pub api_errors: AtomicU64,
    /// Responses or watch lines that were not the JSON the API defines.
    pub garbage: AtomicU64,
    /// Pods not kept because the cache was full.
    pub pods_dropped: AtomicU64,
    /// Watches that ended with 410 Gone (history compacted): a re-list follows.
    pub watch_expired: AtomicU64,
}

/// The shared cache.
#[derive(Default)]
pub struct PodStore {
    maps: RwLock<Maps>,
    /// Bumped on every change, so readers know when a miss may have become a hit.
    generation: AtomicU64,
    /// Whether a list has succeeded since the agent started.
    synced: std::sync::atomic::AtomicBool,
    pub counters: PodCounters,
}

impl PodStore {
    /// Replaces everything with a fresh list (after a start, an error or an expired watch).
    pub fn replace(&self, pods: Vec<Pod>) {
        let mut maps = Maps::default();
        let mut dropped = 0;
        for pod in pods {
            if !maps.insert(pod) {
                dropped += 1;
            }
        }
        self.counters
            .pods_dropped
            .fetch_add(dropped, Ordering::Relaxed);
        if let Ok(mut m) = self.maps.write() {
            *m = maps;
        }
        self.synced.store(true, Ordering::Relaxed);
        self.counters.lists.fetch_add(1, Ordering::Relaxed);
        self.generation.fetch_add(1, Ordering::Relaxed);
    }

    pub fn upsert(&self, pod: Pod) {
        let kept = self
            .maps
            .write()
            .map(|mut m| m.insert(pod))
            .unwrap_or(false);
        if !kept {
            self.counters.pods_dropped.fetch_add(1, Ordering::Relaxed);
        }
        self.generation.fetch_add(1, Ordering::Relaxed);
    }

    pub fn remove(&self, uid: &str) {
        if let Ok(mut m) = self.maps.write() {
            m.remove(uid);
        }
        self.generation.fetch_add(1, Ordering::Relaxed);
    }

    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Relaxed)
    }

    pub fn synced(&self) -> bool {
        self.synced.load(Ordering::Relaxed)
    }

    pub fn len(&self) -> usize {
        self.maps.read().map(|m| m.by_uid.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The pod of a container (by its id), else the pod with `pod_uid` (from the cgroup path:
    /// found even before the container's status names its id).
    pub fn find(&self, container_id: &str, pod_uid: Option<&str>) -> Option<Pod> {
        let maps = self.maps.read().ok()?;
        let uid = maps
            .by_container
            .get(container_id)
            .map(String::as_str)
            .or(pod_uid)?;
        maps.by_uid.get(uid).cloned()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A pod object as `kubectl get pod -o json` prints it (trimmed of fields not read).
    pub(crate) fn vllm_pod(uid: &str, container_id: &str) -> Value {
        serde_json::json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "vllm-7d9f8c6b5-x2k4p",
                "generateName": "vllm-7d9f8c6b5-",
                "namespace": "inference",
                "uid": uid,
                "resourceVersion": "48213",
                "labels": {"app.kubernetes.io/name": "vllm", "pod-template-hash": "7d9f8c6b5"},
                "ownerReferences": [{
                    "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "vllm-7d9f8c6b5",
                    "uid": "0b6c1f9e-1111-4c2d-9e3f-222233334444", "controller": true,
                    "blockOwnerDeletion": true
                }]
            },
            "spec": {"nodeName": "gpu-node-1", "containers": [{"name": "engine", "image": "vllm/vllm-openai:v0.33.0"}]},
            "status": {
                "phase": "Running",
                "containerStatuses": [{
                    "name": "engine", "ready": true, "restartCount": 0,
                    "image": "docker.io/vllm/vllm-openai:v0.33.0",
                    "containerID": format!("containerd://{container_id}")
                }]
            }
        })
    }

    const UID: &str = "8c1f0a4e-6b2d-4f3a-9e7c-1d2b3c4d5e6f";
    const CID: &str = "3e8b0d1c2a4f5e6d7c8b9a0f1e2d3c4b5a6978877665544332211ffeeddccbba";

    #[test]
    fn reads_a_deployment_pod() {
        let pod = Pod::from_json(&vllm_pod(UID, CID)).unwrap();
        assert_eq!(pod.name, "vllm-7d9f8c6b5-x2k4p");
        assert_eq!(pod.namespace, "inference");
        assert_eq!(pod.node_name.as_deref(), Some("gpu-node-1"));
        assert_eq!(pod.deployment.as_deref(), Some("vllm"));
        assert_eq!(
            pod.owner,
            Some(("ReplicaSet".into(), "vllm-7d9f8c6b5".into()))
        );
        assert_eq!(pod.container_name(CID), Some("engine"));
    }

    #[test]
    fn statefulset_pods_have_an_owner_and_no_deployment() {
        let mut v = vll_pod_without_hash();
        v["metadata"]["ownerReferences"][0]["kind"] = "StatefulSet".into();
        v["metadata"]["ownerReferences"][0]["name"] = "sglang".into();
        let pod = Pod::from_json(&v).unwrap();
        assert_eq!(pod.owner, Some(("StatefulSet".into(), "sglang".into())));
        assert_eq!(pod.deployment, None);
    }

    fn vll_pod_without_hash() -> Value {
        let mut v = vllm_pod(UID, CID);
        v["metadata"]["labels"]
            .as_object_mut()
            .unwrap()
            .remove("pod-template-hash");
        v
    }

    #[test]
    fn malformed_objects_leave_fields_unknown_and_never_panic() {
        assert_eq!(Pod::from_json(&serde_json::json!({})), None);
        assert_eq!(Pod::from_json(&serde_json::json!({"metadata": 5})), None);
        assert_eq!(
            Pod::from_json(&serde_json::json!({"metadata": {"uid": ""}})),
            None
        );
        let pod = Pod::from_json(&serde_json::json!({
            "metadata": {"uid": UID, "name": 7, "ownerReferences": "x"},
            "status": {"containerStatuses": [{"name": "a"}, 3, {"name": "b", "containerID": "containerd://"}]}
        }))
        .unwrap();
        assert_eq!(pod.name, "");
        assert_eq!(pod.owner, None);
        assert!(pod.containers.is_empty());
    }

    #[test]
    fn store_finds_by_container_then_by_pod_uid_and_stays_bounded() {
        let store = PodStore::default();
        assert!(!store.synced());
        store.replace(vec![Pod::from_json(&vllm_pod(UID, CID)).unwrap()]);
        assert!(store.synced());
        assert_eq!(store.find(CID, None).unwrap().uid, UID);
        assert_eq!(store.find("other", Some(UID)).unwrap().uid, UID);
        assert!(store.find("other", None).is_none());
        let g = store.generation();
        store.remove(UID);
        assert!(store.generation() > g);
        assert!(store.find(CID, None).is_none());

        let many: Vec<Pod> = (0..MAX_PODS + 10)
            .map(|i| Pod {
                uid: format!("uid-{i}"),
                ..Default::default()
            })
            .collect();
        store.replace(many);
        assert_eq!(store.len(), MAX_PODS);
        assert_eq!(store.counters.pods_dropped.load(Ordering::Relaxed), 10);
    }
}
