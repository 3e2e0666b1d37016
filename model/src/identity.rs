//! Which container and Kubernetes pod an engine process belongs to, as record fields; filled by
//! the agent's `identity` stage.
use serde::Serialize;

/// The identity of an engine process, as record fields (`container_id`, `k8s_*`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ProcessIdentity {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container_runtime: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub k8s_pod_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub k8s_namespace_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub k8s_pod_uid: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub k8s_container_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub k8s_node_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub k8s_deployment_name: Option<String>,
    /// The pod's controlling owner when it is not a Deployment's ReplicaSet
    /// (StatefulSet, DaemonSet, Job…): kind and name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub k8s_owner_kind: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub k8s_owner_name: Option<String>,
}

impl ProcessIdentity {
    /// OTel resource attributes (semantic conventions `container.*`, `k8s.*`).
    pub fn attributes(&self) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        let mut push = |key: &'static str, v: &Option<String>| {
            if let Some(v) = v {
                out.push((key, v.clone()));
            }
        };
        push("container.id", &self.container_id);
        push("k8s.pod.name", &self.k8s_pod_name);
        push("k8s.namespace.name", &self.k8s_namespace_name);
        push("k8s.pod.uid", &self.k8s_pod_uid);
        push("k8s.container.name", &self.k8s_container_name);
        push("k8s.node.name", &self.k8s_node_name);
        push("k8s.deployment.name", &self.k8s_deployment_name);
        match self.k8s_owner_kind.as_deref() {
            Some("StatefulSet") => push("k8s.statefulset.name", &self.k8s_owner_name),
            Some("DaemonSet") => push("k8s.daemonset.name", &self.k8s_owner_name),
            Some("Job") => push("k8s.job.name", &self.k8s_owner_name),
            Some("ReplicaSet") => push("k8s.replicaset.name", &self.k8s_owner_name),
            _ => {}
        }
        out
    }
}
